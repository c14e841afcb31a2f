"""stacks/ keeps one construct per module, its functions' code in the controller package of its
own (controller/), and no import of trainer/, bootstrap/, the controller, TensorFlow or Horovod
(synth stays light)."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT
from source_tree import imported_roots, sources

STACKS = ROOT / "stacks"
MODULES = sources(STACKS)
CONSTRUCT_BASES = {"Construct", "Stack"}
CONTROLLER = ROOT / "controller"
CONTROLLER_MODULES = sorted(p for p in CONTROLLER.glob("*.py") if p.name != "__init__.py")
# The controller package is the functions' code: the CDK side ships it (functions.py), never
# imports it.
FORBIDDEN_IMPORTS = {
    "trainer", "bootstrap", "controller", "rehearsal", "tensorflow", "horovod", "keras"
}  # fmt: skip


def constructs_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id in CONSTRUCT_BASES for base in node.bases)
    ]


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


def test_the_controller_is_a_package_of_its_own_outside_the_cdk_folder():
    """The functions' code is the controller package (controller/), which the CDK side ships
    and never imports; no folder under stacks/ is a Lambda asset of modules without a package."""
    assert (CONTROLLER / "__init__.py").is_file()
    runtimes = [path.parent for path in MODULES if not (path.parent / "__init__.py").exists()]
    assert runtimes == []
    described = (CONTROLLER / "__init__.py").read_text()
    undescribed = [p.name for p in CONTROLLER_MODULES if p.name not in described]
    assert undescribed == [], "controller/__init__.py's map does not name them"


def test_nothing_under_stacks_is_named_for_the_reaper_it_no_longer_is():
    """The run controller reconciles; "reaper" named a job it no longer does."""
    named = [
        p for p in STACKS.rglob("*") if "reaper" in p.name.lower() and "__pycache__" not in p.parts
    ]
    assert named == []


@pytest.mark.parametrize("path", CONTROLLER_MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_module_of_the_controllers_functions_is_over_the_limit(path):
    assert len(path.read_text().splitlines()) <= CONTROLLER_LIMIT


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_stacks_import_nothing_of_the_training_side(path):
    assert not imported_roots(path) & FORBIDDEN_IMPORTS
