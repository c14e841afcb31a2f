"""trainer/actions.py on its own: the checkpoint saver, the periodic checkpoint's interval and the
SIGTERM request (the actions in the loop: tests/trainer/test_loop.py)."""

import os
import signal
import time
import types

from trainer.actions import Checkpoints, PeriodicCheckpoint, StopRequest, StopWhenAsked
from trainer.recorder import Timings


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Counter:
    """A stand-in for a tf.Variable: assign() and the value."""

    def __init__(self):
        self.value = None

    def assign(self, value):
        self.value = value


class Manager:
    """tf.train.CheckpointManager's save, with the time a save takes."""

    def __init__(self, clock):
        self.clock, self.saved = clock, []

    def save(self, checkpoint_number):
        self.clock.now += 2.5
        self.saved.append(checkpoint_number)
        return f"/m/checkpoints/ckpt-{checkpoint_number}"


def fake_step(global_step):
    return types.SimpleNamespace(epoch_step=Counter(), global_step=lambda: global_step)


def test_rank_0_saves_under_the_global_step_and_times_the_save(capsys):
    clock = Clock()
    step, manager, timings = fake_step(37), Manager(clock), Timings(0.0)
    checkpoints = Checkpoints(step, manager, timings, clock=clock)
    clock.now += 60
    assert checkpoints.seconds_since_save() == 60
    checkpoints.save(7)
    assert (step.epoch_step.value, manager.saved) == (7, [37])
    # The pause every rank waits out, in the line the rehearsal prints.
    assert capsys.readouterr().out == "Saved checkpoint /m/checkpoints/ckpt-37 in 2.50 s\n"
    assert (timings.checkpoint_s, checkpoints.seconds_since_save()) == (2.5, 0)


def test_other_ranks_save_nothing_but_keep_the_same_clock(capsys):
    clock = Clock()
    step, timings = fake_step(37), Timings(0.0)
    checkpoints = Checkpoints(step, None, timings, clock=clock)
    clock.now += 60
    checkpoints.save(0)
    assert step.epoch_step.value == 0  # the same variables as rank 0's, broadcast on resume
    assert capsys.readouterr().out == ""
    assert checkpoints.seconds_since_save() == 0


def test_the_periodic_checkpoint_waits_for_its_interval_and_always_saves_the_last_epoch():
    clock = Clock()
    manager = Manager(clock)
    checkpoints = Checkpoints(fake_step(10), manager, Timings(0.0), clock=clock)
    periodic = PeriodicCheckpoint(checkpoints, every_s=600)
    periodic.at_epoch_trained(1, last=False)
    clock.now += 599.9
    periodic.at_epoch_trained(2, last=False)
    assert manager.saved == []
    clock.now += 0.1
    periodic.at_epoch_trained(3, last=False)
    assert len(manager.saved) == 1
    periodic.at_epoch_trained(4, last=True)  # 0 s after the last save: the end saves anyway
    assert len(manager.saved) == 2
    periodic.at_epoch_trained(5, last=False)
    assert len(manager.saved) == 2


def test_sigterm_sets_the_request_and_names_the_signal():
    request = StopRequest()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        request.install()
        assert not request.requested
        os.kill(os.getpid(), signal.SIGTERM)
        # The C handler only sets a flag, maybe in another thread; the main thread runs the
        # Python handler later (https://docs.python.org/3/library/signal.html, "Execution of
        # Python signal handlers").
        deadline = time.monotonic() + 5
        while not request.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (request.requested, request.signal_name) == (True, "SIGTERM")
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_stop_asked_on_any_rank_s_node_stops_every_rank_at_the_epoch_s_end(tmp_path):
    clock = Clock()
    manager = Manager(clock)
    checkpoints = Checkpoints(fake_step(10), manager, Timings(0.0), clock=clock)
    asked, lines = [], []

    def any_rank(flag, name):  # another rank's node holds the file from epoch 2 on
        asked.append((flag, name))
        return flag or len(asked) >= 2

    stop = StopWhenAsked(tmp_path / "stop.json", any_rank, checkpoints, lines.append)
    assert stop.at_epoch_end(1, None, last=False) is False
    assert stop.stopped_at is None and manager.saved == []
    assert stop.at_epoch_end(2, None, last=False) is True
    assert stop.stopped_at == 2 and manager.saved == [10]  # the epoch's checkpoint
    assert asked == [(False, "stop_asked"), (False, "stop_asked")]
    assert lines == [f"stopped as asked ({tmp_path / 'stop.json'}) at the end of epoch 2"]


def test_a_stop_asked_at_the_last_epoch_saves_nothing_more(tmp_path):
    clock = Clock()
    manager = Manager(clock)
    checkpoints = Checkpoints(fake_step(10), manager, Timings(0.0), clock=clock)
    (tmp_path / "stop.json").write_text("{}")
    stop = StopWhenAsked(tmp_path / "stop.json", lambda flag, name: flag, checkpoints, print)
    assert stop.at_epoch_end(5, None, last=True) is True
    assert manager.saved == [] and stop.stopped_at == 5
