"""`make setup` installs `horovod-fleet` with only pyproject.toml's packages (editable), so the
command runs from any directory: every package of the project that watch/ imports must be one
of them (`horovod-fleet drill` judges with contract/, which was not)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def project_packages_imported_by(folder: Path) -> set[str]:
    own = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found & own


def test_every_package_the_command_imports_is_installed_with_it():
    # [tool.setuptools] packages = [...] (tomllib is Python 3.11's, and the app runs on 3.10)
    listed = re.search(r"^packages = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)[1]
    installed = set(re.findall(r'"(\w+)"', listed))
    imported = project_packages_imported_by(ROOT / "watch")
    assert "contract" in imported  # the check sees what it is for
    assert imported <= installed, sorted(imported - installed)
