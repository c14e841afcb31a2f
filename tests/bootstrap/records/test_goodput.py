"""Goodput and the fleet's view of the start-up, from plain figures: steps redone after a
restore are lost time, the buckets add up to the wall clock, the slowest node of each phase is
named.

.venv/bin/python -m pytest tests/bootstrap/head/test_goodput.py
"""

import pytest

from bootstrap.records import goodput, timeline
from bootstrap.records.goodput import Attempt
from bootstrap.records.phases import PHASES
from contract.runs import stamp_at

T0 = 1_800_000_000.0


def test_steps_redone_after_a_restore_count_as_lost_time():
    """Attempt 1 trained to step 1000 but its newest checkpoint in S3 was step 800: attempt 2
    resumed there and trained steps 801-1000 again. Those 200 steps of attempt 1 are lost
    (redone), not productive."""
    first = Attempt(ended_at=T0 + 700, launched_at=T0, first_step_at=T0 + 100, start_step=0,
                    end_step=1000, step_s=0.5)  # fmt: skip
    second = Attempt(ended_at=T0 + 2000, launched_at=T0 + 800, first_step_at=T0 + 900,
                     start_step=800, end_step=2000, step_s=0.5)  # fmt: skip
    figures = goodput.goodput([first, second], T0 + 2000)
    seconds = figures["goodput_s"]
    assert seconds["productive_s"] == 800 * 0.5 + 1200 * 0.5  # 1000 s, not 1100
    assert seconds["lost"]["redone"] == 100.0
    assert seconds["lost"]["capacity_wait"] == 100.0  # attempt 1's end to attempt 2's launch
    assert figures["goodput"] == round(1000 / 2000, 4)
    assert figures["runtime_goodput"] == round(1000 / 1900, 4)
    # Had attempt 2 resumed at step 1000, nothing would have been redone.
    lossless = Attempt(**{**second.__dict__, "start_step": 1000})
    assert goodput.goodput([first, lossless], T0 + 2000)["goodput_s"]["lost"]["redone"] == 0.0


def test_steps_an_elastic_reset_trained_twice_are_lost_not_productive():
    training = {"start_step": 0, "end_step": 1000, "step_s": 0.5, "steps_redone": 40,
                "resets": [{"recovery_s": 25.0}, {"recovery_s": 15.0}]}  # fmt: skip
    lost = goodput.attempt_lost([], {}, training)
    assert (lost["redone"], lost["recovery"]) == (20.0, 40.0)
    attempt = Attempt(ended_at=T0 + 1000, launched_at=T0, start_step=0, end_step=1000,
                      step_s=0.5, lost_s=lost)  # fmt: skip
    seconds = goodput.goodput([attempt], T0 + 1000)["goodput_s"]
    assert seconds["productive_s"] == 500.0  # the net progress, once
    assert seconds["lost"]["redone"] == 20.0


def record(node, start, **phases):
    """A phases record: each phase (start offset, seconds)."""
    return {
        "node": node, "instance_id": f"i-{node}", "ip": f"10.0.0.{node}",
        "launched_at": stamp_at(T0 + start),
        "phases": {code: {"start": stamp_at(T0 + a), "end": stamp_at(T0 + a + s), "s": float(s)}
                   for code, (a, s) in phases.items()},
    }  # fmt: skip


RECORDS = [
    record("0", 0, launch=(0, 30), boot=(30, 60), image_check=(90, 2), instance_store=(92, 10),
           health=(102, 20), own_shards=(122, 5), data_pull=(122, 40), rendezvous=(127, 35),
           allreduce_check=(165, 10), framework_start=(180, 90), first_step=(270, 30)),
    record("1", 2, launch=(2, 40), boot=(42, 70), image_check=(112, 2), instance_store=(114, 12),
           health=(126, 25), own_shards=(151, 10), data_pull=(151, 30), rendezvous=(161, 1),
           framework_start=(180, 95), first_step=(275, 25)),
]  # fmt: skip


def test_the_fleet_s_view_names_each_phase_s_slowest_node():
    view = timeline.fleet_phases(RECORDS)
    assert set(view) == set(PHASES)
    assert view["boot"] == {"s": 70.0, "slowest": "node 1 (i-1, 10.0.0.1)", "node": "1",
                            "by_node": {"0": 60.0, "1": 70.0}}  # fmt: skip
    assert view["allreduce_check"]["node"] == "0" and view["allreduce_check"]["by_node"] == {
        "0": 10.0
    }
    assert timeline.launched_at(RECORDS) == T0
    assert timeline.fleet_phases([])["boot"] == {"s": None, "slowest": None, "node": None,
                                                 "by_node": {}}  # fmt: skip


def test_an_attempt_s_own_lost_time_is_its_critical_path():
    """Node 1 registered last (its own shards at +161): the fleet waited for its launch, boot,
    checks and pull, then for the leader to see it (+162), the allreduce check, the slowest
    framework start and the first step beyond a step's time."""
    training = {"step_s": 0.5, "evaluation_s": 60.0, "checkpoint_s": 12.0}
    steps = {"fleet shards": 3.0, "restore checkpoints": 2.0, "upload results": 4.0}
    lost = goodput.attempt_lost(RECORDS, steps, training)
    assert lost == {
        "launch": 40.0, "boot": 70.0 + 2 + 12, "pull": 10.0 + 3, "checks": 25.0 + 1 + 10,
        "framework_start": 95.0 + 30 - 0.5, "checkpoint": 2.0 + 4 + 12, "evaluation": 60.0,
        "recovery": 0.0, "redone": 0.0,
    }  # fmt: skip


def test_every_second_of_the_wall_is_in_one_bucket():
    lost = goodput.attempt_lost(RECORDS, {}, {"step_s": 0.5})
    attempt = Attempt(ended_at=T0 + 1000, launched_at=T0, first_step_at=T0 + 300, start_step=0,
                      end_step=1200, step_s=0.5, lost_s=lost)  # fmt: skip
    figures = goodput.goodput([attempt], T0 + 1000)
    seconds = figures["goodput_s"]
    assert seconds["wall_s"] == 1000.0 and seconds["runtime_wall_s"] == 700.0
    assert seconds["productive_s"] + sum(seconds["lost"].values()) == pytest.approx(1000.0, abs=0.2)
    assert (
        seconds["lost"]["other"] >= 0 and 0 <= figures["goodput"] <= figures["runtime_goodput"] <= 1
    )


def test_overlapping_measurements_are_scaled_to_fit_the_wall():
    attempt = Attempt(ended_at=T0 + 100, launched_at=T0, start_step=0, end_step=100, step_s=0.5,
                      lost_s={"boot": 60.0, "pull": 60.0})  # fmt: skip
    seconds = goodput.goodput([attempt], T0 + 100)["goodput_s"]
    assert seconds["productive_s"] == 50.0
    assert (seconds["lost"]["boot"], seconds["lost"]["pull"], seconds["lost"]["other"]) == (
        25.0, 25.0, 0.0,
    )  # fmt: skip


def test_a_run_that_trained_no_step_has_no_goodput():
    failed = Attempt(ended_at=T0 + 300, launched_at=T0, lost_s={"boot": 100.0})
    figures = goodput.goodput([failed], T0 + 300)
    assert (figures["goodput"], figures["runtime_goodput"]) == (None, None)
    assert figures["goodput_s"]["wall_s"] == 300.0


def test_an_attempt_that_wrote_no_train_json_still_counts_what_the_next_resumed_from():
    """Attempt 1 died without train.json, after a checkpoint at step 400 that attempt 2 resumed
    from: those 400 steps survive, priced at attempt 2's step time."""
    first = Attempt(ended_at=T0 + 500, launched_at=T0, start_step=None)
    second = Attempt(ended_at=T0 + 1500, launched_at=T0 + 600, start_step=400, end_step=1400,
                     step_s=0.5)  # fmt: skip
    seconds = goodput.goodput([first, second], T0 + 1500)["goodput_s"]
    assert seconds["productive_s"] == 1400 * 0.5


def test_attempts_json_entries_carry_the_controller_s_copies():
    entries = [
        {"attempt": 1, "started_at": stamp_at(T0 + 60), "ended_at": stamp_at(T0 + 900)},
        {"attempt": 2, "launched_at": stamp_at(T0 + 1000), "first_step_at": stamp_at(T0 + 1200),
         "ended_at": stamp_at(T0 + 2000), "start_step": 0, "end_step": 500, "step_s": 0.5,
         "lost_s": {"boot": 80.0, "nonsense": 5.0}},
        {"attempt": 3, "status": "failed"},  # no ended_at: not an attempt's figures
    ]  # fmt: skip
    first, second = goodput.from_entries(entries)
    assert first.launched_at == T0 + 60  # no launched_at: its start
    assert (second.first_step_at, second.end_step, second.lost_s) == (T0 + 1200, 500,
                                                                      {"boot": 80.0})  # fmt: skip


def test_live_goodput_counts_the_steps_so_far_at_the_global_rate():
    current = Attempt(ended_at=T0 + 1000, launched_at=T0, first_step_at=T0 + 200, start_step=0)
    progress = {"global_step": 400, "images_per_s": 2048.0, "eta_s": 600.0}  # 0.5 s a step
    assert goodput.live([], current, progress, 1024) == {"goodput": 0.2, "runtime_goodput": 0.25}
    # The first log step's rate includes the compilation: no figure until a timed one.
    assert goodput.live([], current, {**progress, "eta_s": None}, 1024) is None
    assert goodput.live([], current, {**progress, "images_per_s": None}, 1024) is None


def test_resets_name_the_nodes_horovod_named_by_address():
    training = {"resets": [{"at": "2027-01-01T00:00:00Z", "hosts_lost": ["10.0.0.1"],
                            "hosts_added": [], "ranks_before": 16, "ranks_after": 8,
                            "recovery_s": 31.0, "steps_redone": 12}]}  # fmt: skip
    [reset] = timeline.resets(training, RECORDS)
    assert reset["lost"] == [{"node": "1", "instance_id": "i-1", "ip": "10.0.0.1"}]
    assert (reset["ranks_after"], reset["recovery_s"], reset["steps_redone"]) == (8, 31.0, 12)
    assert timeline.resets({}, RECORDS) == []


def test_a_replacement_at_a_lost_node_s_address_is_named_only_where_it_joined():
    # Node 1 (i-1) lost, its replacement i-9 at the same address joins later: each reset
    # names the instance the head's discovery saw there at the reset's time.
    hosts = {"10.0.0.1": [{"node": "1", "instance_id": "i-1", "since": "2027-01-01T00:00:00Z"},
                          {"node": "1", "instance_id": "i-9", "since": "2027-01-01T00:05:00Z"}]}  # fmt: skip
    training = {"resets": [
        {"at": "2027-01-01T00:01:00Z", "hosts_lost": ["10.0.0.1"], "hosts_added": []},
        {"at": "2027-01-01T00:06:00Z", "hosts_lost": [], "hosts_added": ["10.0.0.1"]},
    ]}  # fmt: skip
    lost, joined = timeline.resets(training, RECORDS, hosts)
    assert lost["lost"] == [{"node": "1", "instance_id": "i-1", "ip": "10.0.0.1"}]
    assert joined["added"] == [{"node": "1", "instance_id": "i-9", "ip": "10.0.0.1"}]
