"""trainer/elastic.py and trainer/elastic_actions.py in this process: the elastic loop, driven by
fakes of the step, the world and the other ranks through Horovod's own hvd.elastic.run and run_fn
(no horovodrun, no child process): a collective lost mid-epoch, a host update, a SIGTERM that
leaves or stops, the commit cadence, and the error messages Horovod really raises.

The fake state keeps the fake step's "weights" (its step count and position), as the real one
keeps every variable, so a restore to the last commit shows in the steps trained again.
"""

from __future__ import annotations

import dataclasses

import horovod.tensorflow.elastic as hvd_tf_elastic
import pytest
import tensorflow as tf
from horovod.common.elastic import ObjectState
from horovod.runner.elastic.worker import HostUpdateResult
from loop_fakes import Agreed, FakeBatches, FakeCheckpoints, FakeRecorder, FakeStep, schedule

from trainer.actions import Interrupted, StopRequest
from trainer.elastic import (
    ElasticSession,
    Parts,
    UnexpectedError,
    World,
    is_collective_failure,
)
from trainer.elastic_actions import EXIT_LEFT, CommitCadence, LeftJob

SHUT_DOWN = (
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an "
    "attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished "
    "execution. If the shutdown was caused by an exception, you should see the exception in "
    "the log before the first shutdown message."
)
# What TensorFlow 2.15.1 and Horovod 0.28.1 raised on the surviving rank of two under
# `horovodrun --gloo --host-discovery-script` when the other was killed (os._exit) mid-run:
# an allreduce named as trainer/ranks.py names its own, eagerly; the same named allreduce in a
# tf.function, as trainer/step.py's step_sums; the gradient's, through DistributedGradientTape.
EAGER_NAMED = (
    "{{function_node __wrapped__HorovodAllreduce_device_/job:localhost/replica:0/task:0/device:"
    f"CPU:0}}}} {SHUT_DOWN} [Op:HorovodAllreduce] name: agree_flag"
)
GRAPH_NAMED = (
    "Graph execution error:\n\nDetected at node step_sums defined at (most recent call last):\n"
    '  File "/tmp/probe/probe.py", line 30, in <module>\n\n'
    '  File "/tmp/probe/probe.py", line 11, in step_sums\n\n'
    '  File "/venv/lib/python3.11/site-packages/horovod/tensorflow/__init__.py", line 102, in '
    "allreduce\n\n"
    '  File "/venv/lib/python3.11/site-packages/horovod/tensorflow/mpi_ops.py", line 130, in '
    "_allreduce\n\n"
    '  File "<string>", line 111, in horovod_allreduce\n\n'
    f"{SHUT_DOWN}\n\t [[{{{{node step_sums}}}}]] [Op:__inference_step_sums_21]"
)
GRAPH_GRADIENT = (
    "Graph execution error:\n\nDetected at node DistributedGradientTape_Allreduce/cond/"
    "HorovodAllreduce_DistributedGradientTape_Allreduce_cond_Cast_1_0 defined at (most recent "
    f"call last):\n ...\n{SHUT_DOWN}"
)


def unknown_error(message: str) -> tf.errors.UnknownError:
    return tf.errors.UnknownError(None, None, message)


def test_a_named_collective_s_failure_is_swallowed_by_hvd_elastic_run_alone(monkeypatch):
    """The trap: hvd.elastic.run resets only on an UnknownError naming HorovodAllreduce,
    HorovodAllgather or HorovodBroadcast; for any other it returns None, as if training had
    ended (horovod/tensorflow/elastic.py v0.28.1 lines 53-60). The step's named allreduce in a
    tf.function names none of them."""
    assert "HorovodAllreduce" not in GRAPH_NAMED

    def step_fails(state):
        raise unknown_error(GRAPH_NAMED)

    resets = []
    monkeypatch.setattr(hvd_tf_elastic, "_reset", lambda: resets.append("reset"))
    state = FakeState(FakeStep([]))
    assert hvd_tf_elastic.run(step_fails)(state) is None  # swallowed: no reset, no error
    assert resets == []
    for message in (EAGER_NAMED, GRAPH_NAMED, GRAPH_GRADIENT, f"Read error: {SHUT_DOWN}"):
        assert is_collective_failure(unknown_error(message)), message
    assert not is_collective_failure(unknown_error("JPEG decode failed"))
    assert not is_collective_failure(tf.errors.DataLossError(None, None, f"horovod {SHUT_DOWN}"))


# -- the fakes ----------------------------------------------------------------------------------
class FakeState(ObjectState):
    """Horovod's ObjectState over the fake step's "weights": its steps and position."""

    def __init__(self, step: FakeStep):
        self.step = step
        self.hosts_update_pending = False
        self.syncs = 0
        self._weights = (0, 0, 0)
        super().__init__(
            bcast_object=lambda obj: obj,
            get_rank=lambda: 0,
            started=False,
            world=None,
            resets=[],
            record={},
        )

    def save(self):
        self._weights = (self.step.steps, self.step.epoch, self.step.epoch_step)
        super().save()

    def restore(self):
        self.step.steps, self.step.epoch, self.step.epoch_step = self._weights
        super().restore()

    def sync(self):
        self.syncs += 1
        super().sync()

    def on_hosts_updated(self, timestamp, update_res):
        super().on_hosts_updated(timestamp, update_res)
        self.hosts_update_pending = True

    def reset(self):
        self.hosts_update_pending = False


@dataclasses.dataclass
class ElasticStep(FakeStep):
    """FakeStep with a position, a collective that fails at one step, and what else happens
    once given steps are done (another rank's SIGTERM, a notice from Horovod's driver)."""

    fail_at: int | None = None  # this step's collective fails: a peer was lost
    at_step: dict = dataclasses.field(default_factory=dict)  # step -> callable
    epoch_step: int = 0

    def train(self, images, labels, **flags):
        if self.steps + 1 == self.fail_at:
            self.fail_at = None
            raise unknown_error(GRAPH_NAMED)
        super().train(images, labels, **flags)
        if action := self.at_step.get(self.steps):
            action()

    def mark_position(self, epochs_done, epoch_step):
        self.epoch, self.epoch_step = epochs_done, epoch_step
        self.events.append(("position", epochs_done, epoch_step))


class FakeCollectives:
    """The other ranks, as this rank (rank 0) sees them through the collectives."""

    def __init__(self, events, others=None, lost_in_barrier=False):
        self.events = events
        self.others = others or {}  # name -> the other ranks' values of that gather
        self.lost_in_barrier = lost_in_barrier  # a peer lost in the next agreement on no error

    def agree(self, error):
        self.events.append(("agree", error))
        if error is not None:
            raise Agreed(error)
        if self.lost_in_barrier:
            self.lost_in_barrier = False
            raise unknown_error(EAGER_NAMED)

    def gather(self, value, name):
        return [value, *self.others.get(name, [])]

    def broadcast(self, value, name):
        return value

    def most(self, value, name):
        self.events.append(("most", value))
        return value


class Worlds:
    """The worlds Horovod forms, one per open_world, and the resets between them."""

    def __init__(self, step, events, *worlds: list[str], host="a"):
        self.step, self.events, self.host = step, events, host
        self.hosts = list(worlds)
        self.resets = 0

    def reset(self):
        """horovod.tensorflow.elastic._reset: shutdown() and init() into the next world."""
        self.resets += 1
        self.events.append(("reset",))

    def open(self, state) -> World:
        hosts = self.hosts[min(self.resets, len(self.hosts) - 1)]
        step = self.step
        self.events.append(("open", len(hosts)))
        return World(
            rank=0,
            ranks=len(hosts),
            hosts=hosts,
            host=self.host,
            synced_step=step.steps,
            start_step=step.steps,
            start_epoch=step.epoch,
            skip_steps=step.epoch_step,
            steps_per_epoch=40,
            batches=FakeBatches(self.events),
            schedule=schedule(epochs=3, steps_per_epoch=40, log_every=10),
        )


def elastic_run(
    step,
    worlds,
    events,
    *,
    others=None,
    min_ranks=1,
    request=None,
    target=None,
    collectives=None,
    stop_file=None,
):
    """The session under the real hvd.elastic.run, whose reset is the fake world's."""
    recorder = FakeRecorder(events)
    recorder.timings = FakeTimings()
    finished = []
    parts = Parts(
        open_world=worlds.open,
        step=step,
        recorder=recorder,
        checkpoints=FakeCheckpoints(events, step),
        collectives=collectives or FakeCollectives(events, others),
        finish=lambda *args: finished.append(args),
        stop_request=request or step.request or StopRequest(),
        log=lambda line: events.append(("log", line)),
    )
    session = ElasticSession(
        parts,
        min_ranks=min_ranks,
        commit_every_s=30,
        checkpoint_every_s=1e9,
        target_top1=target,
        stop_file=stop_file,
        step_clock=lambda: float(step.steps),  # one second a step: a commit every 30 steps
    )
    state = FakeState(step)
    return session, state, finished


@dataclasses.dataclass
class FakeTimings:
    framework_start_s: float = 5.0
    first_step_s: float = 2.0
    first_step_at: str = "2026-01-01T00:00:00Z"


def run_elastic(monkeypatch, worlds, session, state):
    monkeypatch.setattr(hvd_tf_elastic, "_reset", worlds.reset)
    return hvd_tf_elastic.run(session.run_world)(state)


def named(events, *names):
    return [event for event in events if event[0] in names]


# -- a lost peer ------------------------------------------------------------------------------
def test_a_collective_lost_mid_epoch_restores_the_last_commit_and_trains_on_in_the_new_world(
    monkeypatch,
):
    events = []
    step = ElasticStep(events, fail_at=66)
    worlds = Worlds(step, events, ["a", "b"], ["a"])
    session, state, finished = elastic_run(step, worlds, events)
    assert run_elastic(monkeypatch, worlds, session, state) == 3

    assert worlds.resets == 1 and state.syncs == 2  # the start's sync, and the reset's
    # Commits: at the world's start, at the first check (before the step time is known), the
    # agreed step time (1 s: every 30 steps), at the epoch end; 65 failed, 40 was committed.
    assert named(events, "most") == [("most", 1.0)] * 2  # measured in each world
    trained = [at for _, at, _ in named(events, "train")]
    assert trained[:65] == list(range(1, 66))
    assert trained[65:] == list(range(41, 121))  # restored to step 40, then to the end
    [reset] = state.resets
    assert reset | {"at": None, "recovery_s": None} == {
        "at": None, "ranks_before": 2, "ranks_after": 1, "hosts_lost": ["b"], "hosts_added": [],
        "failed_at_step": 65, "resumed_at_step": 40, "steps_redone": 25, "recovery_s": None,
    }  # fmt: skip
    assert reset["at"].endswith("Z") and 0 <= reset["recovery_s"] < 60
    # resets.json: once at the reset, once its recovery was known (the first step after it).
    writes = named(events, "write_resets")
    assert len(writes) == 2 and writes[1][1] == state.resets
    # Every rank at the end before any leaves, then train.json with the attempt's record.
    assert named(events, "agree")[-1] == ("agree", None)
    [(epochs, target, resets, record)] = finished
    assert (epochs, target, resets) == (3, {}, state.resets)
    assert record == {"start_step": 0, "framework_start_s": 5.0, "first_step_s": 2.0,
                      "first_step_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    assert [event[1] for event in named(events, "write_digest")] == ["world-0-", "world-1-"]


def test_an_unknown_error_of_no_collective_ends_the_rank_instead_of_being_swallowed(monkeypatch):
    events = []
    step = ElasticStep(events)
    step.at_step[5] = lambda: (_ for _ in ()).throw(unknown_error("CUDA illegal address"))
    worlds = Worlds(step, events, ["a", "b"])
    session, state, _ = elastic_run(step, worlds, events)
    with pytest.raises(UnexpectedError, match="CUDA illegal address"):
        run_elastic(monkeypatch, worlds, session, state)
    assert worlds.resets == 0


# -- host updates -------------------------------------------------------------------------------
@pytest.mark.parametrize("update", [HostUpdateResult.added, HostUpdateResult.removed])
def test_a_host_update_commits_at_the_next_check_and_every_rank_syncs(monkeypatch, update):
    """Horovod's driver notifies rank 0 alone; its flag rides in the step's allreduce, so every
    rank commits at the same check step and takes the update there. A removal keeps the step
    on disk too, and old ranks sync as new ones do (horovod/horovod#3494)."""
    events = []
    step = ElasticStep(events)
    added = update == HostUpdateResult.added
    worlds = Worlds(step, events, ["a", "b"], ["a", "b", "c"] if added else ["a"])
    session, state, _ = elastic_run(step, worlds, events)
    step.at_step[25] = lambda: state.on_hosts_updated(1, update)
    run_elastic(monkeypatch, worlds, session, state)

    assert state.syncs == 2  # never skipped, removal or not
    trained = [at for _, at, _ in named(events, "train")]
    assert trained == list(range(1, 121))  # no step trained twice
    [reset] = state.resets
    assert (reset["failed_at_step"], reset["resumed_at_step"], reset["steps_redone"]) == (30, 30, 0)
    assert (reset["hosts_added"], reset["hosts_lost"]) == ((["c"], []) if added else ([], ["b"]))
    saved = [event for event in named(events, "save") if event[1] < 120]  # not the last epoch's
    assert saved == ([] if added else [("save", 30, 30)])  # step 30, 30 steps into epoch 1


# -- SIGTERM: leave, or stop below the minimum --------------------------------------------------
def test_a_signalled_host_leaves_at_the_check_step_and_never_exits_0(monkeypatch):
    events = []
    request = StopRequest()
    step = ElasticStep(events, stop_after=13, request=request)
    worlds = Worlds(step, events, ["a", "b"], host="b")
    others = {"leave": [("a", False)]}
    session, state, finished = elastic_run(step, worlds, events, others=others, request=request)
    with pytest.raises(
        LeftJob, match=r"^host b leaves the elastic job at step 20 \(SIGTERM\); 1 ranks go on$"
    ):
        run_elastic(monkeypatch, worlds, session, state)
    assert EXIT_LEFT not in (0, 75, 2) and worlds.resets == 0 and finished == []
    assert named(events, "position")[-1] == ("position", 0, 20)  # committed before it left


def test_the_others_reset_without_the_leaving_host_and_redo_no_step(monkeypatch):
    events = []
    step = ElasticStep(events)
    step.at_step[13] = lambda: step.flags.__setitem__(1, True)  # another rank's SIGTERM, summed
    worlds = Worlds(step, events, ["a", "b"], ["a"], host="a")
    session, state, finished = elastic_run(step, worlds, events, others={"leave": [("b", True)]})
    assert run_elastic(monkeypatch, worlds, session, state) == 3
    [reset] = state.resets
    assert (reset["hosts_lost"], reset["steps_redone"], reset["resumed_at_step"]) == (["b"], 0, 20)
    assert len(finished) == 1


def test_a_leave_below_min_ranks_is_the_coordinated_stop(monkeypatch):
    events = []
    request = StopRequest()
    step = ElasticStep(events, stop_after=13, request=request)
    worlds = Worlds(step, events, ["a", "b"], host="b")
    session, state, finished = elastic_run(
        step, worlds, events, others={"leave": [("a", False)]}, min_ranks=2, request=request
    )
    with pytest.raises(
        Interrupted, match=r"^SIGTERM: stopped at step 20 \(epoch 1, step 20 of 40\)$"
    ):
        run_elastic(monkeypatch, worlds, session, state)
    assert worlds.resets == 0 and finished == []
    stop = named(events, "log", "batchnorm", "save", "interrupted", "agree")
    assert stop[-5:] == [
        ("log", "elastic: b leaving would leave 1 of 2 ranks, fewer than --min-ranks 2: every "
                "rank stops"),
        ("batchnorm", 20),
        ("save", 20, 20),
        ("interrupted", "SIGTERM: stopped at step 20 (epoch 1, step 20 of 40)"),
        ("agree", None),  # no rank exits 75 before rank 0's checkpoint and marker are written
    ]  # fmt: skip


# -- the commit cadence -----------------------------------------------------------------------
def test_commits_follow_the_measured_step_time():
    cadence = CommitCadence(every_s=30)
    assert cadence.due(20, 0) and cadence.measure(20, 100.0) is None  # first check: no figure
    assert cadence.measure(40, 102.0) == pytest.approx(0.1)  # 20 steps in 2 s
    assert cadence.set_step_seconds(0.1) == 300  # 30 s of 0.1 s steps
    assert not cadence.due(280, 0) and cadence.due(300, 0)
    assert cadence.measure(60, 104.0) is None  # measured once a world
    assert CommitCadence(30).set_step_seconds(45.0) == 1  # slower than the target: every step


def test_a_target_reached_before_a_reset_is_not_trained_past(monkeypatch):
    """The evaluation reached --target-top1 and a peer was lost in the final barrier: the next
    world only finishes, with the epoch the target was reached at."""
    events = []
    step = ElasticStep(events, top1_by_epoch={1: 0.9})
    worlds = Worlds(step, events, ["a", "b"], ["a"])
    collectives = FakeCollectives(events, lost_in_barrier=True)
    session, state, finished = elastic_run(
        step, worlds, events, target=0.5, collectives=collectives
    )
    assert run_elastic(monkeypatch, worlds, session, state) == 1
    assert [at for _, at, _ in named(events, "train")] == list(range(1, 41))  # epoch 1 only
    [(epochs, target, resets, _)] = finished
    assert (epochs, target["reached_target_at_epoch"], resets[0]["steps_redone"]) == (1, 1, 0)


def test_a_stop_asked_ends_every_rank_s_training_at_that_epoch_s_end(monkeypatch, tmp_path):
    """The head asked the agreed stop (the file on a node) during epoch 2: every rank stops at
    its end, as a success, and a peer lost in the final barrier trains nothing more."""
    events = []
    step = ElasticStep(events)
    stop_file = tmp_path / "stop.json"
    worlds = Worlds(step, events, ["a", "b"], ["a"])
    collectives = FakeCollectives(events, lost_in_barrier=True)
    session, state, finished = elastic_run(
        step, worlds, events, collectives=collectives, stop_file=stop_file
    )
    real_train = step.train

    def train(*args, **kwargs):
        real_train(*args, **kwargs)
        if step.steps == 50:  # in epoch 2
            stop_file.write_text("{}")

    step.train = train
    assert run_elastic(monkeypatch, worlds, session, state) == 2
    assert [at for _, at, _ in named(events, "train")] == list(range(1, 81))  # epochs 1 and 2
    assert [value for _, value in named(events, "most")][-2:] == [0.0, 1.0]
    [(epochs, summary, _, _)] = finished
    assert (epochs, summary) == (2, {"stopped_as_asked_at_epoch": 2})
