"""What the tests that hold the house's rules read of a folder: its modules and what each
imports (tests/contract/test_contract.py, tests/stacks/test_layout.py,
tests/bootstrap/test_import_graph.py)."""

import ast
import functools
from pathlib import Path


def sources(folder: Path) -> list[Path]:
    """The folder's Python modules, at any depth."""
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache  # several tests read every module; the tree does not change during a session
def imported_names(path: Path, name: str | None = None) -> frozenset[str]:
    """Every dotted name the module imports, lazy imports inside functions included: `import
    a.b` gives a.b, `from a import b` gives a and a.b (b may be a submodule). Relative imports
    are resolved against `name`, the module's own dotted name, and left out without it."""
    package = None
    if name is not None:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if package is None:
                    continue
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= {f"{base}.{alias.name}" if base else alias.name for alias in node.names}
            if base:
                found.add(base)
    return frozenset(found)


def imported_roots(path: Path) -> set[str]:
    """The top-level packages the module imports by absolute name."""
    return {name.split(".")[0] for name in imported_names(path)}
