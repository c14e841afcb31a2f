"""The project's own imports form no circle and never name a `__main__`.

`python -m pkg` runs pkg/__main__.py as the module `__main__`; a module that imports
`pkg.__main__` gets a second copy of it, with classes of their own (an exception raised by one
copy is not caught as the other's). And two modules that import each other, directly or around
a loop, only work in the order Python happens to load them. So: a graph of every module of the
project's packages and app.py, an edge for each import of another of them (lazy imports inside
functions included), and neither a `__main__` target nor a cycle in it.
"""

import ast
from pathlib import Path

from source_tree import imported_names

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "controller", "stacks", "bootstrap", "trainer", "rehearsal", "watch")
SCRIPTS = ("app.py",)


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the packages and the top-level scripts."""
    files = {Path(name).stem: REPO / name for name in SCRIPTS}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def resolve(name: str, modules: set[str]) -> str | None:
    """The most specific project module that importing `name` runs, or None (not ours)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The project's modules that `name` imports, itself left out."""
    found = {resolve(target, modules) for target in imported_names(path, name)}
    return {module for module in found if module and module != name}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_folder_of_code_is_a_package():
    """No folder of modules that import each other by file name (as a Lambda asset's top level
    once did): each is imported as its package, from tests and the rehearsal alike."""
    folders = {path.parent for path in module_files().values() if path.parent != REPO}
    assert (
        sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()) == []
    )


def test_the_graph_sees_the_project():
    graph = import_graph()
    for name in ("app", "rehearsal.__main__", "rehearsal.core", "rehearsal.faults",
                 "bootstrap.__main__", "stacks.benchmark", "watch.cli",
                 "controller.steps", "contract.names"):  # fmt: skip
        assert name in graph, name
    assert "rehearsal.core" in graph["rehearsal.faults"]
    assert "rehearsal.core" in graph["rehearsal.benchmark"]
    assert "controller.recovery" in graph["controller.decide"]
    assert "contract.causes" in graph["controller.recovery"]


def test_no_module_imports_a_main():
    graph = import_graph()
    offenders = {
        name: sorted(t for t in targets if t.rpartition(".")[2] == "__main__")
        for name, targets in graph.items()
    }
    assert not {name: t for name, t in offenders.items() if t}


def test_no_import_cycle():
    assert cycles(import_graph()) == []


ROOMS = ("bootstrap.node", "bootstrap.fleet", "bootstrap.head", "bootstrap.records")


def room_of(module: str) -> str | None:
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def room_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(room, room) for each import from a module of one of bootstrap's rooms into another's."""
    return {
        (room_of(name), room_of(target))
        for name, targets in graph.items()
        for target in targets
        if room_of(name) and room_of(target) and room_of(name) != room_of(target)
    }


def test_bootstrap_s_rooms_import_one_way_and_the_head_last():
    """The run's records are below the roles that write them (bootstrap/records/, which imports
    none of the rooms), so nothing a node or a member runs imports the head's room, and no two
    rooms import each other (the member, which runs a training node, is bootstrap/member.py)."""
    edges = room_edges(import_graph())
    assert sorted(e for e in edges if e[1] == "bootstrap.head") == []
    assert (
        sorted(e for e in edges if e[0] == "bootstrap.records" and e[1] != "bootstrap.fleet") == []
    )
    assert sorted(e for e in edges if (e[1], e[0]) in edges) == []


def test_the_rooms_check_finds_a_two_way_import():
    graph = {
        "bootstrap.node.attempt": {"bootstrap.head.status"},
        "bootstrap.head.head": {"bootstrap.node.attempt"},
    }
    edges = room_edges(graph)
    assert ("bootstrap.node", "bootstrap.head") in edges
    assert sorted(e for e in edges if (e[1], e[0]) in edges) == [
        ("bootstrap.head", "bootstrap.node"),
        ("bootstrap.node", "bootstrap.head"),
    ]


def test_the_cycle_check_finds_a_loop():
    """The check itself: the old rehearsal layout (a command line and the modules it imports,
    each importing it back) is a cycle; a tree is not."""
    graph = {
        "rehearsal.__main__": {"rehearsal.benchmark", "rehearsal.faults", "rehearsal.hosts"},
        "rehearsal.benchmark": {"rehearsal.__main__"},
        "rehearsal.faults": {"rehearsal.__main__", "rehearsal.hosts"},
        "rehearsal.hosts": set(),
    }
    assert cycles(graph) == [["rehearsal.__main__", "rehearsal.benchmark", "rehearsal.faults"]]
    graph["rehearsal.benchmark"] = graph["rehearsal.faults"] = {"rehearsal.hosts"}
    assert cycles(graph) == []


def test_no_test_or_rehearsal_edits_sys_path():
    """The project's packages import from the checkout's root (pyproject.toml's pytest
    `pythonpath`, `python -m rehearsal`): no file reaches one by editing sys.path."""
    edits = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for folder in ("tests", "rehearsal")
        for path in sorted((REPO / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in ("insert", "append", "extend")
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "path"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "sys"
    ]
    assert edits == []
