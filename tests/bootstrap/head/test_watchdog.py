"""The progress watchdog: a training whose ranks stop advancing is ended with a reason that
names the last step, never left to the hard cap.

.venv/bin/python -m pytest tests/bootstrap/head/test_watchdog.py
"""

import json
import sys
import time

from bootstrap.head import launch
from bootstrap.head.watchdog import ProgressWatchdog


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def write_progress(path, global_step: int, stamp: str) -> None:
    progress = {"phase": "training", "epoch": 2, "epochs": 90, "step": global_step % 78,
                "steps_per_epoch": 78, "global_step": global_step, "updated_at": stamp}  # fmt: skip
    path.write_text(json.dumps(progress))


def watchdog(tmp_path, clock, **bounds) -> ProgressWatchdog:
    bounds = {"startup_grace_s": 1800, "min_stall_s": 600, "stall_factor": 10, **bounds}
    return ProgressWatchdog(tmp_path / "progress.json", lambda r: None, clock=clock, **bounds)


def test_a_steady_run_never_trips(tmp_path):
    clock = Clock()
    dog = watchdog(tmp_path, clock)
    for step in range(1, 50):
        clock.now += 14  # a log step every 14 s, as 100 steps on 8 p4d nodes
        write_progress(tmp_path / "progress.json", step * 100, f"t{step}")
        assert dog.check() is None


def test_a_stall_after_steady_progress_names_the_last_step(tmp_path):
    clock = Clock()
    dog = watchdog(tmp_path, clock)
    for step in range(1, 5):
        clock.now += 14
        write_progress(tmp_path / "progress.json", step * 100, f"t{step}")
        dog.check()
    clock.now += 600  # the bound: max(600 s, 10 x 14 s)
    assert dog.check() is None
    clock.now += 1
    reason = dog.check()
    assert reason.startswith("training stalled: no progress for 601 s (bound 600 s) after ")
    assert "global step 400 (epoch 2/90, step 10/78, training)" in reason


def test_the_bound_follows_the_runs_own_slowest_gap(tmp_path):
    clock = Clock()
    dog = watchdog(tmp_path, clock, min_stall_s=60)
    for step, gap in enumerate((10, 10, 90, 10), 1):  # one evaluation took 90 s
        clock.now += gap
        write_progress(tmp_path / "progress.json", step, f"t{step}")
        dog.check()
    clock.now += 899
    assert dog.check() is None  # 10 x 90 s
    clock.now += 2
    assert "bound 900 s" in dog.check()


def test_no_first_step_within_the_startup_grace(tmp_path):
    clock = Clock()
    # A previous attempt's file: it is not this attempt's progress.
    write_progress(tmp_path / "progress.json", 21, "old")
    dog = watchdog(tmp_path, clock)
    clock.now += 1800
    assert dog.check() is None
    clock.now += 1
    assert dog.check() == (
        "training stalled: no training step reported within 1800 s of the trainer's start "
        "(progress.json)"
    )


def test_a_stalled_horovodrun_is_ended_and_the_stream_returns(tmp_path):
    """The plumbing on a real process: a 'training' that prints, then hangs."""
    hung = [sys.executable, "-c", "import time; print('step 1', flush=True); time.sleep(600)"]
    reasons = []
    running = []
    dog = ProgressWatchdog(
        tmp_path / "progress.json",
        lambda reason: (reasons.append(reason), launch.end_process(running[0])),
        startup_grace_s=1,
        poll_s=0.2,
    )

    def on_start(proc):
        running.append(proc)
        dog.start()

    began = time.monotonic()
    code, tail = launch.stream(hung, {}, tmp_path / "train.log", on_start=on_start)
    assert code != 0 and time.monotonic() - began < 30
    assert "step 1" in tail
    assert reasons and reasons[0].startswith("training stalled: no training step reported")
