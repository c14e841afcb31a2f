"""contract/ is a leaf every room imports, and what it names is written nowhere else: the fleet's
tag, TrainStack's outputs and the time stamp appear, as literals, only there (docs/layout.md)."""

import ast
import functools
import sys
from pathlib import Path

import pytest
from source_tree import imported_roots, sources

from contract import causes, names, runs

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contract"
# The rooms that import contract/. trainer/ and the image's recipe and proof do not (they run in
# the training image, whose bake fetches them alone): docs/layout.md says why.
ROOMS = ("contract", "controller", "stacks", "bootstrap", "watch", "rehearsal")
NOT_SHIPPED = (ROOT / "bootstrap" / "image", ROOT / "bootstrap" / "image_proof")


@pytest.mark.parametrize("path", sources(CONTRACT), ids=lambda p: p.name)
def test_contract_imports_only_the_standard_library_and_itself(path):
    assert imported_roots(path) - set(sys.stdlib_module_names) <= {"contract"}


@pytest.mark.parametrize("path", sources(ROOT / "trainer"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_trainer_imports_nothing_of_the_other_folders(path):
    assert not imported_roots(path) & {"contract", "controller", "bootstrap", "stacks", "aws_cdk"}


@pytest.mark.parametrize("path", [*sources(ROOT / "bootstrap" / "image"),
                                  *sources(ROOT / "bootstrap" / "image_proof")],
                         ids=lambda p: str(p.relative_to(ROOT)))  # fmt: skip
def test_the_image_s_own_code_imports_nothing_the_bake_does_not_fetch(path):
    assert "contract" not in imported_roots(path)


@functools.cache
def literals(path: Path) -> set[str]:
    """The string constants of a module, docstrings and comments aside."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings
    }  # fmt: skip


WRITTEN_ONCE = [
    names.FLEET_TAG,
    names.NODE_TAG,
    names.RUN_TAG,
    names.RUN_OUTPUT_KEY,
    names.NOTIFY_OUTPUT_KEY,
    names.MAX_RESTARTS_OUTPUT_KEY,
    names.DEADLINE_OUTPUT_KEY,
    names.REPLACEMENT_OUTPUT_KEY,
    names.HEAD_TEMPLATE_OUTPUT_KEY,
    names.NODES_OUTPUT_KEY,
    names.MIN_NODES_OUTPUT_KEY,
    names.ZONES_OUTPUT_KEY,
    names.CAP_SCHEDULE_PREFIX,
    names.IDLE_ALARM_PREFIX,
    names.REPLACEMENTS_TYPE,
    names.CODE_GUARD_TYPE,
    names.MANIFEST_TAG,
    names.IMAGE_PARAMETER,
    runs.TIME_FORMAT,
    causes.NO_INTACT_CHECKPOINT,
    causes.RELAUNCH_REFUSED,
]


@pytest.mark.parametrize("literal", WRITTEN_ONCE)
def test_what_contract_names_is_written_nowhere_else(literal):
    found = [
        str(path.relative_to(ROOT))
        for room in ROOMS
        for path in sources(ROOT / room)
        if not path.is_relative_to(NOT_SHIPPED[0]) and not path.is_relative_to(NOT_SHIPPED[1])
        and literal in literals(path)
    ]  # fmt: skip
    assert found == [f"contract/{module}.py" for module in modules_naming(literal)], found


def modules_naming(literal: str) -> list[str]:
    return [path.stem for path in sources(CONTRACT) if literal in literals(path)]


def test_every_cause_is_relaunched_or_torn_down_and_the_nodes_meet_only_their_own():
    assert set(causes.FINAL) | set(causes.RETRYABLE) == set(causes.CAUSES)
    assert set(causes.FINAL) > causes.FLEET_WIDE
    assert not causes.FLEET_WIDE & causes.CONTROLLER_CAUSES


def test_a_stamp_reads_back_as_the_moment_it_was():
    stamp = runs.stamp_at(1_795_000_000.0)
    assert stamp == "2026-11-18T11:06:40Z"
    assert runs.parse_stamp(stamp).timestamp() == 1_795_000_000.0
    assert runs.key("*", runs.DONE) == "runs/*/DONE.json"


# The stamp's copies where contract/ cannot go: the training image's own code, whose bake
# follows bootstrap/image/, bootstrap/image_proof/ and trainer/ alone (stacks/image/recipe.py),
# so that a change of contract/ never rebakes an image (hours on a GPU instance). Each writes the
# same format, which contract.runs reads back.
IMAGE_S_COPIES = [
    "bootstrap/image/manifest.py",
    "bootstrap/image_proof/jit_cache.py",
    "bootstrap/image_proof/proof.py",
    "trainer/preprocess/output.py",
    "trainer/progress.py",
]


def test_the_stamp_is_written_in_contract_and_else_only_in_the_image_s_own_code():
    found = [
        str(path.relative_to(ROOT))
        for folder in (*ROOMS, "trainer")
        for path in sources(ROOT / folder)
        if runs.TIME_FORMAT in literals(path)
    ]
    assert sorted(found) == sorted(["contract/runs.py", *IMAGE_S_COPIES])


def test_the_trainer_s_stamp_reads_back_with_contract_s():
    from trainer.progress import utc_stamp

    assert runs.parse_stamp_s(utc_stamp(1_795_000_000.0)) == 1_795_000_000.0
