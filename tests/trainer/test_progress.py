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


def test_every_nodes_local_rank_0_says_its_ranks_step(tmp_path):
    """node-steps.json: the node's bootstrap waits for a silent head while its ranks step
    (bootstrap/fleet/supervision.py HeadWatch, which mirrors the name)."""
    from bootstrap.fleet.supervision import NODE_STEPS_FILE as NODE_SIDE
    from trainer.actions import StepsSeen
    from trainer.loop import Check
    from trainer.progress import NODE_STEPS_FILE

    class Recorder:
        def __init__(self, local_rank):
            self.local_rank, self.model_dir = local_rank, tmp_path / f"node{local_rank}"

        def steps_seen(self, global_step):
            from trainer.recorder import Recorder as Real

            Real.steps_seen(self, global_step)

    class Step:
        def global_step(self):
            return 40

    assert NODE_STEPS_FILE == NODE_SIDE
    for local_rank in (0, 1):
        seen = StepsSeen(Recorder(local_rank), Step())
        seen.at_check(Check(epoch=2, step=3, steps_per_epoch=10, global_step=13, stop=False))
    doc = json.loads((tmp_path / "node0" / NODE_STEPS_FILE).read_text())
    assert doc["global_step"] == 13 and doc["at"].endswith("Z")
    assert not (tmp_path / "node1").exists()  # one writer per node: its local rank 0
    assert StepsSeen(Recorder(0), Step()).at_epoch_end(2, None, False) is False
    assert json.loads((tmp_path / "node0" / NODE_STEPS_FILE).read_text())["global_step"] == 40
