"""The house's own limits on the code outside tests: no module over MODULE_LINES lines and no
function over FUNCTION_LINES, so that a file or a function that grew to hold two things is
split where it does (the developers' guide: "A file or function past a screen or two holds two
things").

    .venv/bin/python -m pytest tests/test_house_limits.py
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "app.py",
    "contract",
    "controller",
    "stacks",
    "bootstrap",
    "trainer",
    "rehearsal",
    "watch",
)
MODULE_LINES = 500
FUNCTION_LINES = 120


def sources() -> list[Path]:
    found = []
    for name in PACKAGES:
        path = ROOT / name
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in found if "__pycache__" not in p.parts]


def over_the_limits(paths: list[Path]) -> list[str]:
    """`path: N lines` for each module past MODULE_LINES, `path:line name: N lines` for each
    function past FUNCTION_LINES."""
    found = []
    for path in paths:
        text = path.read_text()
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        if (lines := text.count("\n")) > MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_is_past_the_house_limits():
    assert over_the_limits(sources()) == []


def test_the_limits_check_finds_a_long_function_and_a_long_module(tmp_path):
    long_function = tmp_path / "long_function.py"
    long_function.write_text("def f():\n" + "    x = 1\n" * FUNCTION_LINES)
    long_module = tmp_path / "long_module.py"
    long_module.write_text("x = 1\n" * (MODULE_LINES + 1))
    assert over_the_limits([long_function, long_module]) == [
        f"{long_function}:1 f: {FUNCTION_LINES + 1} lines",
        f"{long_module}: {MODULE_LINES + 1} lines",
    ]
