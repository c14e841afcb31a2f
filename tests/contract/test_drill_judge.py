"""contract/drill_judge.py: each experiment of the drill judged from a run's records, the way
the head judges it live and the rehearsal and `horovod-fleet drill` print it."""

import pytest

from contract import drill
from contract.drill_judge import (
    FAIL,
    PASS,
    Records,
    experiment_named,
    format_table,
    judge,
    row,
    table,
)
from contract.runs import parse_stamp_s, stamp_at

T0 = parse_stamp_s("2026-12-01T10:00:00Z")


def at(seconds: float) -> str:
    return stamp_at(T0 + seconds)


def started(name: str, attempt: int = 1, **more) -> dict:
    return {"experiment": name, "started_at": at(0), "attempt": attempt, **more}


def status(attempt=1, logged=None, resets=(), phase="training", **more) -> dict:
    progress = {"updated_at": at(logged), "global_step": 100} if logged is not None else None
    return {"attempt": attempt, "phase": phase, "progress": progress, "resets": list(resets),
            "updated_at": at(logged or 0), **more}  # fmt: skip


def reset(seconds, lost=("2",), added=(), redone=3) -> dict:
    def nodes(which):
        return [{"node": n, "instance_id": f"i-{n}", "ip": f"10.0.0.{n}"} for n in which]

    return {"at": at(seconds), "lost": nodes(lost), "added": nodes(added), "steps_redone": redone}


def replacement(seconds, node="2", instance="i-new", replaces="i-2") -> dict:
    return {"node": node, "instance_id": instance, "replaces": replaces, "at": at(seconds),
            "attempt": 1, "why": "lost"}  # fmt: skip


def node_joined(seconds, instance="i-new") -> dict:
    return {"at": at(seconds), "lost": [], "steps_redone": 0,
            "added": [{"node": "2", "instance_id": instance, "ip": "10.0.0.9"}]}  # fmt: skip


def test_a_node_terminated_passes_once_its_replacement_joins():
    experiment = experiment_named("node-terminated")
    records = Records(
        status=status(logged=240, resets=[reset(20), node_joined(200)]),
        controller={"replacements": [replacement(70)]},
    )
    judged = judge(experiment, started("node-terminated"), records, now=T0 + 250)
    assert judged["verdict"] == PASS, judged
    assert judged["observed"]["reset"] == at(20)
    assert judged["observed"]["replacement_joined"] == at(200)
    assert judged["observed"]["one_replacement_per_loss"] == at(70)
    assert judged["observed"]["one_attempt"] == at(250)  # held throughout: when judged
    assert judged["times"] == {"fault": at(0), "detection": at(20), "training_again": at(240),
                               "replacement_joined": at(200)}  # fmt: skip


def test_a_replacement_taken_in_by_a_horovodrun_started_again_joined_at_its_first_step():
    """No reset adds it (the head started horovodrun again on every node): its phases record,
    the replacement instance's, says when its ranks' first step was done."""
    experiment = experiment_named("node-terminated")
    phases = {"2": {"node": "2", "instance_id": "i-new",
                    "phases": {"first_step": {"start": at(150), "end": at(170)}}}}  # fmt: skip
    records = Records(
        status=status(logged=240, resets=[reset(20)]),
        controller={"replacements": [replacement(70)]},
        phases=phases,
    )
    judged = judge(experiment, started("node-terminated"), records, now=T0 + 250)
    assert judged["verdict"] == PASS and judged["observed"]["replacement_joined"] == at(170)
    old = {"2": {**phases["2"], "instance_id": "i-2"}}  # the lost instance's record
    records = Records(status=status(logged=240, resets=[reset(20)]),
                      controller={"replacements": [replacement(70)]}, phases=old)  # fmt: skip
    assert judge(experiment, started("node-terminated"), records, T0 + 250).get("verdict") is None


def test_what_was_seen_keeps_the_time_it_was_first_seen():
    experiment = experiment_named("node-terminated")
    first = judge(experiment, started("node-terminated"),
                  Records(status=status(logged=30, resets=[reset(20)])), now=T0 + 40)  # fmt: skip
    assert first.get("verdict") is None and first["observed"] == {"reset": at(20)}
    assert first["times"]["training_again"] == at(30)
    later = judge(experiment, first, Records(status=status(logged=90, resets=[reset(20)])),
                  now=T0 + 100)  # fmt: skip
    assert later["times"]["training_again"] == at(30)


def test_two_instances_launched_for_one_loss_fail_it():
    experiment = experiment_named("node-terminated")
    records = Records(
        status=status(logged=240, resets=[reset(20), node_joined(200)]),
        controller={"replacements": [replacement(70), replacement(80, instance="i-twice")]},
    )
    judged = judge(experiment, started("node-terminated"), records, now=T0 + 250)
    assert judged["verdict"] == FAIL
    assert "2 instances launched for i-2" in judged["why"]


def test_an_attempt_that_ended_fails_an_experiment_the_attempt_had_to_survive():
    experiment = experiment_named("node-terminated")
    records = Records(
        status=status(attempt=2, logged=240),
        attempts={
            "attempts": [
                {"attempt": 1, "status": "failed", "reason": "node 2 lost", "ended_at": at(40)}
            ]
        },
    )
    judged = judge(experiment, started("node-terminated"), records, now=T0 + 60)
    assert judged["verdict"] == FAIL and "attempt 1 ended failed: node 2 lost" in judged["why"]
    assert judged["times"]["detection"] == at(40)


def test_a_replacement_that_never_joins_fails_past_the_bound():
    experiment = experiment_named("node-terminated")
    records = Records(status=status(logged=240, resets=[reset(20)]),
                      controller={"replacements": [replacement(70)]})  # fmt: skip
    pending = judge(experiment, started("node-terminated"), records, now=T0 + 899)
    assert pending.get("verdict") is None
    judged = judge(experiment, pending, records, now=T0 + 901)
    assert judged["verdict"] == FAIL
    assert judged["why"] == "not seen within 900 s: replacement_joined"


def test_the_throttled_controller_goes_on_only_after_the_throttle():
    experiment = experiment_named("controller-throttled")
    after = Records(
        status=status(logged=400, resets=[reset(5), node_joined(380)]),
        controller={"replacements": [replacement(185)]},
    )
    judged = judge(experiment, started("controller-throttled"), after, now=T0 + 400)
    assert judged["verdict"] == PASS and judged["observed"]["tick_went_on"] == at(185)
    during = Records(
        status=status(logged=400, resets=[reset(5), node_joined(380)]),
        controller={"replacements": [replacement(60)]},
    )
    judged = judge(experiment, started("controller-throttled"), during, now=T0 + 400)
    assert judged["verdict"] == FAIL and "while the controller was throttled" in judged["why"]


def test_the_s3_cut_is_ridden_out_once_a_step_is_logged_after_it():
    experiment = experiment_named("s3-cut")
    during = judge(experiment, started("s3-cut"), Records(status=status(logged=50)), T0 + 55)
    assert during.get("verdict") is None
    judged = judge(experiment, during, Records(status=status(logged=62)), T0 + 70)
    assert judged["verdict"] == PASS and judged["observed"]["training_again"] == at(62)


def test_a_spot_notice_passes_when_the_node_left_with_no_step_redone():
    experiment = experiment_named("spot-notice")
    records = Records(
        status=status(logged=300, resets=[reset(125, redone=0), node_joined(280)]),
        controller={"replacements": [replacement(130)]},
    )
    judged = judge(experiment, started("spot-notice"), records, now=T0 + 300)
    assert judged["verdict"] == PASS and judged["observed"]["left_at_commit"] == at(125)
    redone = Records(status=status(logged=300, resets=[reset(125, redone=4), node_joined(280)]),
                     controller={"replacements": [replacement(130)]})  # fmt: skip
    assert judge(experiment, started("spot-notice"), redone, T0 + 300).get("verdict") is None


def test_the_head_terminated_passes_under_a_new_head_after_a_capacity_wait():
    experiment = experiment_named("head-terminated")
    waiting = Records(
        status=status(logged=10),
        controller={
            "controller_state": "WaitForCapacity",
            "attempt": 2,
            "updated_at": at(90),
            "phase": "relaunching",
        },
    )
    first = judge(experiment, started("head-terminated"), waiting, now=T0 + 95)
    assert first["observed"] == {"capacity_wait_or_zone_move": at(90)}
    relaunched = {"attempt": 2, "try": 3, "nodes": {"head": {"instance_id": "i-h2",
                                                            "came_back": "replaced"}}}  # fmt: skip
    trained = Records(
        status=status(attempt=2, logged=420, attempt_started_at=at(360)),
        controller={
            "controller_state": "Relaunched",
            "updated_at": at(360),
            "relaunch": relaunched,
        },
        attempts={"attempts": [{"attempt": 1, "status": "failed", "ended_at": at(40)}]},
    )
    judged = judge(experiment, first, trained, now=T0 + 430)
    assert judged["verdict"] == PASS, judged
    assert judged["observed"]["new_head"] == at(420)
    assert judged["times"]["detection"] == at(40)
    assert judged["times"]["replacement_joined"] == at(420)


def test_a_relaunch_on_its_first_try_shows_no_capacity_handled():
    experiment = experiment_named("head-terminated")
    relaunched = {"attempt": 2, "try": 1,
                  "nodes": {"head": {"instance_id": "i-h2", "came_back": "replaced"}}}  # fmt: skip
    records = Records(status=status(attempt=2, logged=420, attempt_started_at=at(60)),
                      controller={"updated_at": at(60), "relaunch": relaunched})  # fmt: skip
    judged = judge(experiment, started("head-terminated"), records, now=T0 + 1801)
    assert judged["verdict"] == FAIL
    assert judged["why"] == "not seen within 1800 s: capacity_wait_or_zone_move"


def test_an_experiment_fis_cut_short_fails():
    experiment = experiment_named("s3-cut")
    record = started("s3-cut", fis_state="stopped")
    judged = judge(experiment, record, Records(status=status(logged=90)), now=T0 + 100)
    assert judged["verdict"] == FAIL and judged["why"] == "FIS ended the experiment stopped"


def test_a_judged_or_unstarted_record_is_left_as_it_is():
    experiment = experiment_named("s3-cut")
    done = {**started("s3-cut"), "verdict": PASS}
    assert judge(experiment, done, Records(), T0) is done
    assert judge(experiment, {"experiment": "s3-cut"}, Records(), T0) == {"experiment": "s3-cut"}


def test_an_unknown_experiment_is_named_with_the_allowed_ones():
    with pytest.raises(drill.UnknownExperiment, match="unknown experiment 'melt': allowed node-"):
        experiment_named("melt")


def test_the_table_names_each_experiment_s_fis_actions_and_its_result():
    experiments = drill.plan("on-demand")
    s3 = judge(experiment_named("s3-cut"), started("s3-cut"), Records(status=status(logged=62)),
               T0 + 70)  # fmt: skip
    text = table(experiments, {"s3-cut": s3})
    lines = text.splitlines()
    assert [cell.strip() for cell in lines[0].split(" | ")][:2] == ["experiment", "FIS actions"]
    [cut] = [line for line in lines if line.startswith("s3-cut ")]
    assert "aws:network:disrupt-connectivity" in cut and cut.rstrip().endswith(PASS)
    assert "training_again +62 s" in cut
    [never] = [line for line in lines if line.startswith("node-terminated ")]
    assert "aws:ec2:terminate-instances" in never and "never started" in never
    assert never.rstrip().endswith(FAIL)
    assert len(lines) == 2 + len(experiments)


def test_a_long_cell_is_clipped():
    experiment = experiment_named("node-terminated")
    cells = row(experiment, None)
    text = format_table([(*cells[:3], "x" * 400, *cells[4:])], width=50)
    assert "x" * 47 + "..." in text and "x" * 48 not in text
