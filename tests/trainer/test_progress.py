"""trainer/progress.py: progress.json's shape, its ETA, and that only rank 0 writes it."""

import json

from trainer.progress import ProgressFile, eta_seconds


def test_eta_is_the_steps_left_at_the_steady_rate_and_none_before_one():
    assert eta_seconds(100, 256, None) is None
    assert eta_seconds(100, 256, 512.0) == 50.0
    assert eta_seconds(-3, 256, 512.0) == 0.0


def test_log_step_then_evaluation_rewrites_one_document(tmp_path):
    progress = ProgressFile(
        tmp_path, enabled=True, epochs=3, steps_per_epoch=10, global_batch=8, ranks=2
    )
    progress.log_step(
        epoch=2, step=4, global_step=14, images_per_s=80.04, loss=1.23456,
        steady_images_per_s=None,
    )  # fmt: skip
    doc = json.loads((tmp_path / "progress.json").read_text())
    assert doc | {"updated_at": None} == {
        "phase": "training", "epoch": 2, "epochs": 3, "step": 4, "steps_per_epoch": 10,
        "ranks": 2, "global_step": 14, "images_per_s": 80.0, "loss": 1.2346, "top1": None,
        "eta_s": None, "updated_at": None,
    }  # fmt: skip
    assert doc["updated_at"].endswith("Z")
    progress.log_step(
        epoch=2, step=10, global_step=20, images_per_s=80, loss=1.0, steady_images_per_s=40.0
    )
    progress.evaluating()
    assert json.loads((tmp_path / "progress.json").read_text())["phase"] == "evaluating"
    progress.evaluated(0.51234)
    doc = json.loads((tmp_path / "progress.json").read_text())
    # 10 steps of 8 images left at 40 img/s.
    assert (doc["top1"], doc["eta_s"], doc["global_step"]) == (0.5123, 2.0, 20)
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # no temporary left


def test_other_ranks_write_nothing(tmp_path):
    progress = ProgressFile(tmp_path, enabled=False, epochs=1, steps_per_epoch=1, global_batch=1)
    progress.log_step(epoch=1, step=1, global_step=1, images_per_s=1, loss=1, steady_images_per_s=1)
    progress.evaluated(0.5)
    assert not list(tmp_path.iterdir())


def test_node_steps_json_says_the_global_step_and_when():
    """What bootstrap/fleet/supervision.py HeadWatch reads (it mirrors the name)."""
    import tempfile
    from pathlib import Path

    from bootstrap.fleet.supervision import NODE_STEPS_FILE as NODE_SIDE
    from trainer.progress import NODE_STEPS_FILE, write_node_steps

    assert NODE_STEPS_FILE == NODE_SIDE
    with tempfile.TemporaryDirectory() as directory:
        write_node_steps(Path(directory), 13)
        doc = json.loads((Path(directory) / NODE_STEPS_FILE).read_text())
        assert doc["global_step"] == 13 and doc["at"].endswith("Z")
        assert [p.name for p in Path(directory).iterdir()] == [NODE_STEPS_FILE]
