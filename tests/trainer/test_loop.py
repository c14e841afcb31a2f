"""trainer/loop.py with its actions (trainer/actions.py), driven by fakes of the step, the batches
and the recorder (tests/trainer/loop_fakes.py): the control flow of the run without TensorFlow,
Horovod or a model.
"""

import pytest
from loop_fakes import Agreed, FakeBatches, FakeCheckpoints, FakeRecorder, FakeStep, schedule

from trainer.actions import (
    CheckpointOnStop,
    Interrupted,
    PeriodicCheckpoint,
    StopAtTarget,
    StopRequest,
)
from trainer.loop import STOP_CHECK_STEPS, Loop


def recorded_agree(events):
    def agree(error):
        events.append(("agree", error))
        if error is not None:
            raise Agreed(error)

    return agree


def make_loop(step, events, *, actions=(), batches=None, **changes):
    return Loop(
        step,
        batches or FakeBatches(events),
        FakeRecorder(events),
        schedule(**changes),
        actions=list(actions),
        stop_request=step.request or StopRequest(),
        agree=recorded_agree(events),
    )


def named(events, *names):
    return [event for event in events if event[0] in names]


def test_reads_the_flags_at_log_steps_every_stop_check_and_the_epoch_end():
    events = []
    step = FakeStep(events)
    make_loop(step, events, epochs=1, steps_per_epoch=45, log_every=7).run(0, 0)
    reads = [(at, steps) for _, at, steps in named(events, "read")]
    assert STOP_CHECK_STEPS == 20
    assert reads == [(7, 7), (14, 7), (20, 6), (21, 1), (28, 7), (35, 7), (40, 5), (42, 2), (45, 3)]
    rows = [dict(event[1:]) for event in named(events, "log_step")]
    assert [(row["global_step"], row["step"], row["steps"]) for row in rows] == [
        (7, 7, 7), (14, 14, 7), (21, 21, 7), (28, 28, 7), (35, 35, 7), (42, 42, 7), (45, 45, 3),
    ]  # fmt: skip
    assert rows[0] | {"loss": 1.0, "total_loss": 2.0, "learning_rate": 0.1} == rows[0]


def test_a_stop_ends_the_epoch_at_the_next_check_step_with_its_checkpoint():
    events = []
    request = StopRequest()
    step = FakeStep(events, stop_after=3, request=request)
    checkpoints = FakeCheckpoints(events, step)
    recorder = FakeRecorder(events)
    stop = CheckpointOnStop(step, checkpoints, recorder, request, recorded_agree(events))
    loop = make_loop(step, events, actions=[stop])
    with pytest.raises(Interrupted) as interrupted:
        loop.run(0, 0)
    assert str(interrupted.value) == "SIGTERM: stopped at step 5 (epoch 1, step 5 of 10)"
    assert step.steps == 5  # the check step at log step 5, not step 3
    kinds = ("batchnorm", "save", "interrupted", "agree", "epoch done", "evaluate")
    assert named(events, *kinds) == [
        ("batchnorm", 5),
        ("save", 5, 5),  # mid-epoch: the checkpoint records 5 steps into the epoch
        ("interrupted", str(interrupted.value)),
        ("agree", None),  # the barrier: no rank leaves before rank 0's files are written
    ]


def test_a_stop_at_an_epoch_s_last_step_saves_the_epoch_done():
    events = []
    request = StopRequest()
    step = FakeStep(events, stop_after=17, request=request, signal_name=None)
    checkpoints = FakeCheckpoints(events, step)
    agree = recorded_agree(events)
    stop = CheckpointOnStop(step, checkpoints, FakeRecorder(events), request, agree)
    with pytest.raises(Interrupted) as interrupted:
        make_loop(step, events, actions=[stop], log_every=100).run(0, 0)
    message = "a signal on another rank: stopped at step 20 (epoch 2, step 10 of 10)"
    assert str(interrupted.value) == message
    assert named(events, "batchnorm", "epoch done", "save")[-3:] == [
        ("batchnorm", 20),
        ("epoch done", 2),
        ("save", 20, 0),  # at the epoch's end: a rerun starts the next epoch
    ]


def test_an_input_failure_keeps_the_rank_in_the_steps_until_the_check_then_all_agree():
    events = []
    step = FakeStep(events)
    loop = make_loop(step, events, batches=FakeBatches(events, fail_at=2), log_every=4)
    with pytest.raises(Agreed, match=r"^label 9 outside 1\.\.4 in train-00001$"):
        loop.run(0, 0)
    trained = [images for _, _, images in named(events, "train")]
    assert trained == ["batch at 32", "placeholder", "placeholder", "placeholder"]
    assert named(events, "agree") == [("agree", "label 9 outside 1..4 in train-00001")]


def test_the_periodic_checkpoint_comes_after_the_batchnorm_average_before_the_evaluation():
    events = []
    step = FakeStep(events)
    periodic = PeriodicCheckpoint(FakeCheckpoints(events, step, since_save=1e9), every_s=0)
    make_loop(step, events, actions=[periodic], epochs=1).run(0, 0)
    order = named(events, "batchnorm", "epoch done", "save", "evaluate", "end_epoch")
    assert order == [
        ("batchnorm", 10),
        ("epoch done", 1),
        ("save", 10, 0),
        ("evaluate", 1),
        ("end_epoch", 1),
    ]


def test_the_target_stops_at_the_first_evaluation_that_reaches_it():
    events = []
    step = FakeStep(events, top1_by_epoch={2: 0.59, 4: 0.61, 6: 0.7})
    checkpoints = FakeCheckpoints(events, step)
    target = StopAtTarget(0.6, checkpoints, FakeRecorder(events))
    loop = make_loop(step, events, actions=[target], epochs=8, eval_every=2)
    assert loop.run(0, 0) == 4
    assert [epoch for _, epoch in named(events, "evaluate")] == [2, 4]  # no extra evaluation
    assert named(events, "save") == [("save", 40, 0)]  # epoch 4 is not the last: saved here
    assert named(events, "reached_target") == [("reached_target", 0.6, 4, 0.61, 12.0)]
    assert target.summary() == {
        "target_top1": 0.6,
        "reached_target_at_epoch": 4,
        "time_to_target_s": 12.0,
    }


def test_a_target_never_reached_trains_every_epoch_and_says_so():
    events = []
    step = FakeStep(events)
    target = StopAtTarget(0.9, FakeCheckpoints(events, step), FakeRecorder(events))
    assert make_loop(step, events, actions=[target], epochs=3).run(0, 0) == 3
    assert target.summary() == {
        "target_top1": 0.9,
        "reached_target_at_epoch": None,
        "time_to_target_s": None,
    }


def test_the_resolution_schedule_builds_a_pipeline_per_size_and_resumes_mid_epoch():
    events = []
    step = FakeStep(events, start_step=13)  # resumed: 1 epoch and 3 steps of 10 done
    sizes = {0: 16, 1: 16, 2: 24, 3: 32}
    loop = make_loop(step, events, epochs=4, train_size=sizes.__getitem__)
    assert loop.run(1, 3) == 4
    assert named(events, "pipeline", "resized", "begin_epoch", "start_clocks") == [
        ("pipeline", 16, 1, 3),
        ("resized", 16, 2),
        ("begin_epoch", 2),
        ("start_clocks",),
        ("begin_epoch", 3),
        ("pipeline", 24, 2, 3),  # built after the epoch's line, before its clocks start
        ("resized", 24, 3),
        ("start_clocks",),
        ("begin_epoch", 4),
        ("pipeline", 32, 3, 3),
        ("resized", 32, 4),
        ("start_clocks",),
    ]
    trained = [images for _, _, images in named(events, "train")]
    assert trained == ["batch at 16"] * 7 + ["batch at 24"] * 10 + ["batch at 32"] * 10
    assert step.steps == 40


def test_nothing_left_to_train_still_evaluates_once():
    events = []
    step = FakeStep(events, start_step=20)
    assert make_loop(step, events, epochs=2).run(2, 0) == 2
    assert named(events, "train") == []
    assert len(named(events, "evaluate")) == 1


def test_every_step_is_announced_after_it_ran():
    """on_step: the recorder's node-steps.json, the node's word that its ranks step."""
    events, seen = [], []
    step = FakeStep(events)
    loop = make_loop(step, events, epochs=2, steps_per_epoch=3)
    loop.on_step = seen.append
    loop.run(0, 1)
    assert seen == [1, 2, 3, 4, 5]  # resumed one step into epoch 1: its 2 left, then 3
