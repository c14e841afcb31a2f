"""What the tests that hold the house's rules read of a folder: its modules and what each
imports (tests/contract/test_contract.py, tests/stacks/test_layout.py)."""

import ast
from pathlib import Path


def sources(folder: Path) -> list[Path]:
    """The folder's Python modules, at any depth."""
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def imported_roots(path: Path) -> set[str]:
    """The top-level packages the module imports by absolute name."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots
