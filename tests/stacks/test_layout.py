"""stacks/ keeps one construct per module, its Lambda runtime beside the construct that deploys
it, and no import of trainer/, bootstrap/, TensorFlow or Horovod (synth stays light)."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT

STACKS = ROOT / "stacks"
MODULES = sorted(path for path in STACKS.rglob("*.py") if "__pycache__" not in path.parts)
CONSTRUCT_BASES = {"Construct", "Stack"}
FORBIDDEN_IMPORTS = {"trainer", "bootstrap", "rehearsal", "tensorflow", "horovod", "keras"}


def constructs_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id in CONSTRUCT_BASES for base in node.bases)
    ]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_at_most_one_construct_per_module(path):
    assert len(constructs_in(path)) <= 1, constructs_in(path)


def test_the_count_sees_every_construct():
    """The five stacks and the constructs they compose, each found in a module of its own."""
    found = {name: path for path in MODULES for name in constructs_in(path)}
    for name in ("DatasetStack", "TeardownStack", "PreprocessStack", "ImageStack", "TrainStack"):
        assert found[name].name == "stack.py", (name, found[name])
    for name in ("GpuFleet", "RunGuard", "PreprocessGuard", "TrainingImage", "Preprocessor"):
        assert name in found


CONTROLLER_LIMIT = 400  # lines: one module per role, none holding two


def test_the_lambda_runtimes_sit_beside_the_constructs_that_deploy_them():
    runtime = STACKS / "teardown" / "controller"
    assert sorted(p.name for p in runtime.iterdir() if p.suffix == ".py") == [
        "act.py",
        "cleanup.py",
        "clients.py",
        "decide.py",
        "decide_guards.py",
        "ec2_fleet.py",
        "executions.py",
        "judge.py",
        "long_actions.py",
        "notify.py",
        "observe.py",
        "preprocess.py",
        "records.py",
        "recovery.py",
        "replace.py",
        "steps.py",
        "steps_fleet.py",
        "steps_teardown.py",
        "tick.py",
        "train_stack.py",
        "zones.py",
    ]
    assert not (runtime / "__init__.py").exists()  # modules import each other by file name
    functions = (STACKS / "teardown" / "functions.py").read_text()
    assert 'HERE / "controller"' in functions and 'HERE / "answers"' in functions


def test_nothing_under_stacks_is_named_for_the_reaper_it_no_longer_is():
    """The run controller reconciles; "reaper" named a job it no longer does."""
    named = [
        p for p in STACKS.rglob("*") if "reaper" in p.name.lower() and "__pycache__" not in p.parts
    ]
    assert named == []


@pytest.mark.parametrize(
    "path",
    sorted((STACKS / "teardown").glob("*/*.py")),
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_no_module_of_the_controllers_functions_is_over_the_limit(path):
    assert len(path.read_text().splitlines()) <= CONTROLLER_LIMIT


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_stacks_import_nothing_of_the_training_side(path):
    assert not imported_roots(path) & FORBIDDEN_IMPORTS
