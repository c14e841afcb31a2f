"""The tick's decision (stacks/teardown/controller/decide.py), in process: a snapshot of the run
as observe.py reads it, the time, and the phase and actions that must follow. Each row is one
state of the world; no AWS is involved."""

import datetime

import decide
import decide_guards
import judge
import pytest
from executions import name

T0 = datetime.datetime(2026, 11, 22, 2, 0, tzinfo=datetime.timezone.utc)
STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/aaaa"
OLD_STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/TrainStack/0000"
RUN = "r1"


def at(minutes: float) -> datetime.datetime:
    return T0 + datetime.timedelta(minutes=minutes)


def stamp(minutes: float) -> str:
    return at(minutes).strftime("%Y-%m-%dT%H:%M:%SZ")


def stack(**changes) -> dict:
    """TrainStack as train_stack.of gives it: deployed at T0, 2 nodes, cap at 6 h."""
    return {
        "id": STACK, "name": "TrainStack", "status": "CREATE_COMPLETE", "status_reason": "",
        "created_at": T0, "run": RUN, "nodes": 2, "max_restarts": 3, "deadline": at(360),
        "heartbeat_timeout_s": 120, "startup_grace_s": 2400, "notify_topic": "",
        "template": "lt-0123", "zones": [{"zone": "us-east-1a", "subnet": "s-a", "group": "g-a"}],
        **changes,
    }  # fmt: skip


def instance(
    node: str | None, state: str = "running", *, of: str = STACK, launched=0, **more
) -> dict:
    return {"id": f"i-{node}-{state}-{of[-4:]}", "state": state, "node": node, "spot": False,
            "zone": "us-east-1a", "stack": of, "cloudformation": node is not None,
            "client_token": "", "launched": at(launched), **more}  # fmt: skip


def fleet(*states: str) -> list[dict]:
    return [instance(str(i), s) for i, s in enumerate(states or ("running", "running"))]


def execution(kind: str, status: str, resume: int = 0, stopped: float | None = None) -> dict:
    return {"name": name(RUN, kind, STACK, resume), "kind": kind, "resume": resume,
            "status": status, "arn": f"arn:{kind}:{resume}", "started": at(0),
            "stopped": at(stopped) if stopped is not None else None}  # fmt: skip


def entry(attempt: int, decision: str = "relaunch", of: str = STACK, decided: float = 10) -> dict:
    return {"attempt": attempt, "decision": decision, "why": "x", "reason": "r",
            "stack_id": of, "decided_at": stamp(decided)}  # fmt: skip


DEPLOYED = object()  # the default stack


def snapshot(*, stack_=DEPLOYED, instances=None, attempts=(), done=None, executions=(), beats=None,
             controller=None, alarm=None, failures=(), assigned=(), checkpoint=None,
             hold=None) -> dict:  # fmt: skip
    """What the tick reads: the world first (observe.world: the guards'), then the records."""
    return {
        "stack": stack() if stack_ is DEPLOYED else stack_,
        "instances": fleet() if instances is None else instances,
        "records": {
            "attempts": list(attempts), "controller_failures": list(failures), "done": done,
            "done_etag": '"e1"' if done else None, "controller": controller or {},
            "status": None, "heartbeats": beats if beats is not None else {"0": at(59), "1": at(59)},
            "assigned": set(assigned),
        },
        "executions": list(executions),
        "alarm": alarm,
        "checkpoint_at": checkpoint,
        "hold": hold,
        "settings": {"idle_minutes": 30},
    }  # fmt: skip


def verdict(now: float, **world) -> dict:
    return decide.decide(snapshot(**world), at(now))


def dos(decision: dict) -> list[str]:
    return [a["do"] for a in decision["actions"]]


def started(decision: dict) -> list[str]:
    return [a["name"] for a in decision["actions"] if a["do"] == "start"]


# --- the phase, from the world ------------------------------------------------------------------

PHASES = [
    # (case, minutes, world, phase)
    ("no TrainStack", 60, {"stack_": {**stack(), "status": "DELETE_COMPLETE"}}, "none"),
    ("a create under way is a live run", 10, {"stack_": stack(status="CREATE_IN_PROGRESS")}, "creating"),
    ("an update under way is a live run", 90, {"stack_": stack(status="UPDATE_IN_PROGRESS")}, "updating"),
    ("a create rolled back", 30, {"stack_": stack(status="ROLLBACK_IN_PROGRESS")}, "rolling_back"),
    ("nodes booting", 5, {"beats": {}}, "booting"),
    ("nodes training", 60, {}, "training"),
    ("a relaunch under way", 60, {"attempts": [entry(1)], "executions": [execution("a1", "RUNNING")]}, "relaunching"),
    ("a teardown under way", 60, {"attempts": [entry(1, "teardown")], "executions": [execution("a1", "RUNNING")]}, "tearing_down"),
    ("being deleted, followed", 60, {"stack_": stack(status="DELETE_IN_PROGRESS"), "executions": [execution("a1", "RUNNING")]}, "deleting"),
    ("past the cap", 361, {}, "capped"),
    ("given up for good", 60, {"failures": [{"final": True, "stack_id": STACK}]}, "controller_failed"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "now", "world", "phase"), PHASES, ids=[p[0] for p in PHASES])
def test_the_phase_is_derived_from_the_world(case, now, world, phase):
    assert verdict(now, **world)["phase"] == phase


def test_a_stack_being_created_or_updated_judges_nothing_but_the_cap():
    """Bug 6: what happened during an update is judged afterwards, never dropped: nothing here
    is remembered, so the next tick after the update sees the same world and acts."""
    gone = fleet("terminated", "terminated")
    for status in ("CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS", "UPDATE_ROLLBACK_IN_PROGRESS"):
        world = {
            "stack_": stack(status=status),
            "instances": gone,
            "done": {"attempt": 1, "status": "failed"},
        }
        assert verdict(90, **world)["actions"] == []
    after = verdict(90, instances=[instance(str(i), "terminated") for i in (0, 1)])
    assert dos(after) == ["tell"]  # the notice: EC2 ended nodes, the leader's DONE.json awaited


# --- the cap and the idle guard ------------------------------------------------------------------


@pytest.mark.parametrize("status", ["CREATE_IN_PROGRESS", "CREATE_COMPLETE", "UPDATE_IN_PROGRESS"])
def test_the_hard_cap_deletes_whatever_the_stack_is_doing(status):
    """Bug 1's cap: the deadline is read, not a delivered event (while a stack is created, from
    its cap schedule, observe.py)."""
    capped = verdict(361, stack_=stack(status=status))
    assert started(capped) == [name(RUN, "cap", STACK)]
    assert capped["actions"][-1]["input"]["action"] == "delete"


def test_the_hard_cap_stops_every_other_long_action():
    capped = verdict(361, attempts=[entry(1)], executions=[execution("a1", "RUNNING")])
    assert dos(capped) == ["stop_executions", "start"]
    assert capped["actions"][0]["arns"] == ["arn:a1:0"]


IDLE = [
    # (case, now, alarm since, checkpoint, extra world, deletes)
    ("never trained: goes after the launch grace", 41, 35, None, {}, True),
    ("within the launch grace", 39, 35, None, {}, False),
    ("idle during the create: judged once deployed", 41, -20, None, {}, True),
    ("a checkpoint after the onset is progress", 66, 45, 40, {}, False),
    ("quiet since its checkpoint", 71, 45, 40, {}, True),
    ("the grace counts from a relaunch", 61, 50, None, {"attempts": [entry(1, decided=30)], "executions": [execution("a1", "SUCCEEDED", stopped=31)]}, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "now", "since", "checkpoint", "world", "deletes"), IDLE, ids=[r[0] for r in IDLE]
)
def test_the_idle_alarm_is_read_not_waited_for(case, now, since, checkpoint, world, deletes):
    """Bug 1's alarm: an ALARM that began while the stack was created acts once it may."""
    alarm = {"state": "ALARM", "since": at(since)}
    decision = verdict(now, alarm=alarm, checkpoint=at(checkpoint) if checkpoint else None, **world)
    assert (started(decision) == [name(RUN, "idle", STACK)]) is deletes, decision


def test_an_alarm_back_to_ok_deletes_nothing():
    beats = {"0": at(89), "1": at(89)}
    assert verdict(90, alarm={"state": "OK", "since": at(80)}, beats=beats)["actions"] == []


# --- an attempt's end ----------------------------------------------------------------------------


def test_a_done_json_is_recorded_then_its_action_started_under_the_attempts_name():
    decision = verdict(
        60, done={"attempt": 1, "status": "failed", "cause": "node_lost", "reason": "r"}
    )
    assert dos(decision) == ["record", "delete_done", "start"]
    record, delete, start = decision["actions"]
    assert (record["entry"]["decision"], record["entry"]["stack_id"]) == ("relaunch", STACK)
    assert delete["etag"] == '"e1"'
    assert start["name"] == name(RUN, "a1", STACK)
    assert start["input"]["plan"] == {"zones": stack()["zones"], "nodes": 2}


def test_a_final_end_is_torn_down_and_keeps_its_done_json():
    done = {"attempt": 1, "status": "succeeded", "reason": None}
    decision = verdict(60, done=done)
    assert dos(decision) == ["record", "start"]
    assert decision["actions"][1]["input"]["action"] == "teardown"
    ended = verdict(
        61, done=done, attempts=[entry(1, "teardown")], executions=[execution("a1", "RUNNING")]
    )
    assert "delete_done" not in dos(ended)


def test_a_relaunch_that_cannot_bring_a_terminated_node_back_stops():
    """A stack without the replacement template cannot replace a node EC2 terminated."""
    done = {"attempt": 1, "status": "failed", "cause": "node_lost", "reason": "r"}
    world = {
        "done": done,
        "stack_": stack(template=""),
        "instances": fleet("running", "terminated"),
    }
    record = verdict(60, **world)["actions"][0]
    assert (
        record["entry"]["decision"] == "stop"
        and "no replacement template" in record["entry"]["why"]
    )


def test_a_recorded_relaunch_not_yet_started_is_started():
    """The tick died between the record and the start: the next one starts it."""
    decision = verdict(61, attempts=[entry(1)])
    assert started(decision) == [name(RUN, "a1", STACK)]


def test_a_stale_done_json_during_a_relaunch_is_removed_and_names_nothing():
    """Bug 3: the old leader's shutdown wrote attempt 1's DONE.json again after the relaunch
    removed it. It is deleted (it would end attempt 2's members at once), and no execution name
    is used up for it."""
    stale = {"attempt": 1, "status": "interrupted", "cause": "interrupted", "reason": "r"}
    during = verdict(61, attempts=[entry(1)], executions=[execution("a1", "RUNNING")], done=stale)
    assert dos(during) == ["delete_done"]
    after = verdict(70, attempts=[entry(1)], executions=[execution("a1", "SUCCEEDED", stopped=65)],
                    done=stale)  # fmt: skip
    assert dos(after) == ["delete_done"]


def test_attempts_of_an_earlier_stack_of_the_run_are_not_this_stacks():
    """A run deployed again continues its attempt count; the old stack's end starts nothing."""
    decision = verdict(60, attempts=[entry(1, "teardown", of=OLD_STACK)])
    assert decision["actions"] == [] and decision["why"] == "attempt 2 under way"


# --- long actions: resumed, then given up --------------------------------------------------------


@pytest.mark.parametrize("status", ["FAILED", "TIMED_OUT", "ABORTED"])
def test_a_long_action_that_ended_badly_is_resumed_under_a_new_name(status):
    decision = verdict(70, attempts=[entry(1)], executions=[execution("a1", status, stopped=65)])
    assert started(decision) == [name(RUN, "a1", STACK, 1)]


def test_a_long_action_failed_past_its_resumes_stops_the_bill_and_is_recorded_for_good():
    chain = [execution("a1", "FAILED", resume=k, stopped=60 + k) for k in range(3)]
    decision = verdict(
        70, attempts=[entry(1)], executions=chain, instances=fleet("stopped", "running")
    )
    assert decision["phase"] == "controller_failed"
    assert dos(decision) == ["stop_billing", "record_failure", "tell"]
    assert [i["node"] for i in decision["actions"][0]["fleet"]] == ["1"]
    assert decision["actions"][1]["failure"]["final"] is True


def test_the_controllers_own_stops_are_never_faults():
    """Bug 5: StopBilling stopped every node after the relaunch failed: nothing is recorded as
    an attempt of its own, nothing relaunched. Resumed, or, once given up, kept stopped."""
    stopped = fleet("stopped", "stopped")
    failed = [execution("a1", "FAILED", stopped=65)]
    resumed = verdict(70, attempts=[entry(1)], executions=failed, instances=stopped)
    assert dos(resumed) == ["start"] and "write_done" not in dos(resumed)
    given_up = verdict(90, attempts=[entry(1)], instances=stopped,
                       failures=[{"final": True, "stack_id": STACK}])  # fmt: skip
    assert given_up["actions"] == []


# --- nodes gone, or silent -----------------------------------------------------------------------


def test_nodes_ec2_ended_are_noticed_then_written_up_after_the_notice():
    gone = fleet("running", "terminated")
    first = verdict(60, instances=gone)
    assert dos(first) == ["tell"] and first["actions"][0]["fields"]["noticed"]["attempt"] == 1
    noticed = {"noticed": {"stack_id": STACK, "attempt": 1, "at": stamp(60), "nodes": ["node 1"]}}
    assert verdict(62, instances=gone, controller=noticed)["actions"] == []
    written = verdict(63, instances=gone, controller=noticed)
    assert dos(written) == ["write_done"]
    assert written["actions"][0]["cause"] == "node_lost"


def test_a_spot_fleet_reclaimed_is_interrupted():
    gone = [instance("0", "terminated", spot=True), instance("1", "terminated", spot=True)]
    noticed = {"noticed": {"stack_id": STACK, "attempt": 1, "at": stamp(60)}}
    written = verdict(64, instances=gone, controller=noticed)["actions"][0]
    assert (written["status"], written["cause"]) == ("interrupted", "interrupted")


SILENCE = [
    # (case, now, heartbeats (minutes), silent)
    ("every heartbeat fresh", 60, {"0": 59, "1": 59}, False),
    ("one node silent: the leader names it", 60, {"0": 59, "1": 55}, False),
    ("every node silent past heartbeat_timeout_s", 60, {"0": 57.9, "1": 57.5}, True),
    ("silent for less than the timeout", 60, {"0": 58.5, "1": 58.5}, False),
    ("never beat, within the start-up grace", 30, {}, False),
    ("never beat, past the start-up grace", 41, {}, True),
]  # fmt: skip


@pytest.mark.parametrize(("case", "now", "beats", "silent"), SILENCE, ids=[r[0] for r in SILENCE])
def test_a_whole_fleet_gone_silent_is_written_up_for_a_relaunch(case, now, beats, silent):
    decision = verdict(now, beats={k: at(v) for k, v in beats.items()})
    assert (dos(decision) == ["write_done"]) is silent, decision
    if silent:
        written = decision["actions"][0]
        assert (written["status"], written["cause"]) == ("failed", "node_lost")
        assert written["reason"].startswith(
            "node 0, node 1 silent: no heartbeat for more than 120 s"
        )


def test_heartbeats_of_the_attempt_before_a_relaunch_do_not_count():
    """After a relaunch the nodes boot again: their old beats are the old attempt's."""
    world = {"attempts": [entry(1, decided=50)], "executions": [execution("a1", "SUCCEEDED", stopped=52)],
             "beats": {"0": at(49), "1": at(49)}}  # fmt: skip
    assert verdict(60, **world)["phase"] == "booting"
    assert dos(verdict(93, **world)) == ["write_done"]  # 41 minutes on, past the grace


# --- orphans -------------------------------------------------------------------------------------


ORPHANS = [
    # (case, instance, orphan at 5 min and 1 s after its launch)
    ("of a stack that is gone", instance("0", of=OLD_STACK), True),
    ("the live stack's, launched by no record", instance(None, cloudformation=False), True),
    ("the live stack's, with its launch assignment", instance(None, cloudformation=False, id="i-assigned"), False),
    ("the live stack's, tagged with its node", instance("1", cloudformation=False), False),
    ("CloudFormation's", instance("0"), False),
    ("already terminated", instance(None, "terminated", of=OLD_STACK), False),
]  # fmt: skip


@pytest.mark.parametrize(("case", "one", "orphan"), ORPHANS, ids=[r[0] for r in ORPHANS])
def test_an_instance_no_record_knows_is_ended_after_the_orphan_timeout(case, one, orphan):
    world = {"instances": [*fleet(), one], "assigned": {"i-assigned"}}
    early = verdict(4.99, **world)
    late = verdict(5 + 1 / 60, **world)
    assert "terminate" not in dos(early)
    assert (dos(late)[:1] == ["terminate"] and late["actions"][0]["ids"] == [one["id"]]) is orphan


def test_orphans_are_ended_when_there_is_no_train_stack_at_all():
    left = [instance("0", of=OLD_STACK), instance("1", of=OLD_STACK)]
    decision = verdict(10, stack_=None, instances=left)
    assert decision["phase"] == "none" and dos(decision) == ["terminate"]
    assert verdict(10, stack_=None, instances=[])["actions"] == []


def test_the_orphan_timeout_is_clustermgtds():
    assert datetime.timedelta(seconds=300) == judge.ORPHAN_AGE


# --- a stack being deleted -----------------------------------------------------------------------


def test_a_delete_nobody_follows_gets_followed():
    """cdk destroy: no execution of the run follows it, so the tick starts one."""
    decision = verdict(60, stack_=stack(status="DELETE_FAILED"))
    assert started(decision) == [name(RUN, "destroy", STACK)]
    assert decision["actions"][0]["input"]["action"] == "follow"


# --- the elastic fleet: a lost node replaced while its head trains ------------------------------


def elastic(*states: str, head: str = "running", nodes: int = 3, **more) -> dict:
    """A world of an elastic fleet of `nodes` (minNodes 2 by default) and its head, at minute
    60 of attempt 1, every heartbeat (the head's too) a minute old unless `more` says."""
    count = len(states) or nodes
    world = {
        "stack_": stack(nodes=count, min_nodes=more.pop("min_nodes", count - 1)),
        "instances": [*fleet(*(states or ("running",) * count)), instance("head", head)],
        "beats": {str(i): at(59) for i in range(count)},
        "head_beat": at(59),
    }
    return {**world, **more}


def elastic_verdict(now: float, **world) -> dict:
    head_beat, assignments = world.pop("head_beat", None), world.pop("assignments", [])
    silent = world.pop("silent", [])
    shot = snapshot(**world)
    shot["records"].update(head_beat=head_beat, assignments=assignments)
    # The head's status.json, a few seconds old: the nodes its discovery finds silent.
    shot["records"]["status"] = {"updated_at": stamp(now - 0.1), "nodes_silent": silent}
    shot["settings"]["replacements_per_node"] = 2
    return decide.decide(shot, at(now))


def test_a_node_ec2_ended_is_replaced_in_the_fleet_s_zone_and_the_attempt_goes_on():
    """Before, on today's fleet: the tick noticed, then wrote DONE.json node_lost three minutes
    later (a relaunch of the whole fleet)."""
    decision = elastic_verdict(60, **elastic("running", "terminated", "running"))
    assert decision["phase"] == "training"
    [replace] = decision["actions"]
    assert (replace["do"], replace["node"], replace["attempt"], replace["number"]) == (
        "replace", 1, 1, 1,
    )  # fmt: skip
    assert replace["zone"] == {"zone": "us-east-1a", "subnet": "s-a", "group": "g-a"}
    # The loss is named by the instance lost (terminated, as EC2 still lists it): its token's.
    assert (
        replace["replaces"] == "i-1-terminated-aaaa" and "no instance serves it" in replace["why"]
    )


def test_a_silent_node_whose_instance_runs_is_terminated_then_replaced():
    world = elastic(silent=["2"])  # the head's discovery left node 2 out for its silence
    world["beats"]["2"] = at(57)  # three minutes old: past heartbeat_timeout_s (120 s)
    terminate, replace = elastic_verdict(60, **world)["actions"]
    assert terminate == {"do": "terminate", "ids": ["i-2-running-aaaa"], "why": terminate["why"]}
    assert "heartbeat is 180 s old" in terminate["why"]
    assert (replace["node"], replace["replaces"]) == (2, "i-2-running-aaaa")


def test_a_silent_node_is_not_replaced_while_the_head_is_silent_too():
    world = elastic(head_beat=at(57), silent=["2"])
    world["beats"]["2"] = at(57)
    assert elastic_verdict(60, **world)["actions"] == []


def test_an_old_heartbeat_the_head_does_not_call_silent_is_an_s3_outage_not_a_loss():
    """Right after S3 came back, the head has beaten again and node 2 not yet: by S3's clock its
    heartbeat is old, but the head, which judges from S3's return, still lists it."""
    world = elastic()
    world["beats"]["2"] = at(57)
    assert elastic_verdict(60, **world)["actions"] == []


def test_a_replacement_booting_within_its_grace_is_left_alone_and_tagged_if_it_is_not_yet():
    """A tick that died after the launch and the assignment, before the tag: the next one
    tags it, and does not count the node lost (its registration comes within the grace)."""
    replacement = instance(None, "pending", launched=58, id="i-new")
    world = elastic("running", "terminated", "running", assignments=[
        {"node_index": 1, "instance_id": "i-new", "attempt": 1, "replacement": 1}])  # fmt: skip
    world["instances"].append(replacement)
    world["beats"]["1"] = at(40)  # the lost instance's last beat: before its replacement's launch
    assert elastic_verdict(60, **world)["actions"] == [
        {"do": "tag", "id": "i-new", "node": 1, "attempt": 1, "number": 1}
    ]
    # Past its start-up grace (40 minutes) with no registration: lost again, replacement 2.
    world["instances"][-1] = {**replacement, "node": "1", "state": "running"}
    world.update(head_beat=at(98), beats={"0": at(98), "1": at(40), "2": at(98)})
    terminate, replace = elastic_verdict(99, **world)["actions"]
    assert (terminate["ids"], replace["number"]) == (["i-new"], 2)


def test_a_node_replaced_as_often_as_allowed_is_left_out_and_said_once():
    assignments = [{"node_index": 1, "instance_id": "i-r1", "attempt": 1, "replacement": 1}]
    refused = {"stack_id": STACK, "attempt": 1, "node": 1, "number": 2, "instance_id": None,
               "refused": "InsufficientInstanceCapacity: none"}  # fmt: skip
    world = elastic("running", "terminated", "running", assignments=assignments,
                    controller={"replacements": [refused]})  # fmt: skip
    [tell] = elastic_verdict(60, **world)["actions"]
    note = tell["fields"]["unreplaced"]
    assert (note["attempt"], list(note["nodes"])) == (1, ["1"])
    assert "not replaced again: replaced 2 time(s) in attempt 1" in note["nodes"]["1"]
    world["controller"] = {**world["controller"], "unreplaced": note}
    assert elastic_verdict(61, **world)["actions"] == []
    # A new attempt counts again from 1.
    assert [a["number"] for a in elastic_verdict(61, **{**world, "attempts": [entry(1)],
            "executions": [execution("a1", "SUCCEEDED", stopped=10)]})["actions"]] == [1]  # fmt: skip


def test_fewer_than_min_nodes_left_is_left_to_the_head_and_the_relaunch():
    world = elastic("running", "terminated", "terminated")  # minNodes 2 of 3: one left
    assert elastic_verdict(60, **world)["actions"] == []
    assert dos(elastic_verdict(60, **{**world, **elastic("running", "terminated", "terminated",
                                                         min_nodes=1)})) == ["replace", "replace"]  # fmt: skip


def test_the_head_ec2_ended_is_the_attempt_s_end_and_cannot_be_relaunched():
    world = elastic(head="terminated")
    first = elastic_verdict(60, **world)
    assert dos(first) == ["tell"] and first["actions"][0]["fields"]["noticed"]["nodes"] == [
        "the head (i-head-terminated-aaaa, terminated)"
    ]
    noticed = {"noticed": {"stack_id": STACK, "attempt": 1, "at": stamp(60)}}
    written = elastic_verdict(64, **{**world, "controller": noticed})["actions"][0]
    assert (written["status"], written["cause"]) == ("failed", "node_lost")
    done = {"attempt": 1, "status": "failed", "cause": "node_lost", "reason": "the head is lost"}
    record = elastic_verdict(65, **{**world, "done": done})["actions"][0]
    assert record["entry"]["decision"] == "stop"
    assert (
        "the head (i-head-terminated-aaaa) is terminated and cannot come back"
        in (record["entry"]["why"])
    )


# --- issue 47: the guards first, the notice by attempt, a node past its budget, the hold --------


def test_the_guards_are_decided_without_the_run_s_records():
    """What the tick decides before it reads S3 (decide_guards.py): the cap, a delete under way,
    the idle fleet; anything else is left to the records (phase None)."""
    world = {"alarm": {"state": "ALARM", "since": at(0)}}
    for now, changes, expected in (
        (361, {}, name(RUN, "cap", STACK)),
        (60, {"stack_": stack(status="DELETE_IN_PROGRESS")}, name(RUN, "destroy", STACK)),
        (75, world, name(RUN, "idle", STACK)),
    ):
        shot = {**snapshot(**changes), "records": None}
        decision = decide_guards.guards(shot, at(now))
        assert started(decision) == [expected], decision
    assert decide_guards.guards({**snapshot(), "records": None}, at(60))["phase"] is None


def test_an_idle_fleet_whose_checkpoint_time_could_not_be_read_goes_on_the_alarm_alone():
    """observe.world could not list the checkpoints (checkpoint_at None): the alarm is judged
    alone, as if no checkpoint came after its onset (decide_guards.idle_since says why)."""
    alarm = {"state": "ALARM", "since": at(45)}
    assert started(verdict(71, alarm=alarm, checkpoint=None)) == [name(RUN, "idle", STACK)]
    assert started(verdict(71, alarm=alarm, checkpoint=at(60))) == []


def test_the_idle_guard_waits_while_an_attempt_s_end_is_acted_on():
    """A relaunch running (or to be resumed) is not idleness; its end starts the launch grace."""
    alarm = {"state": "ALARM", "since": at(0)}
    for status in ("RUNNING", "FAILED"):
        decision = verdict(90, alarm=alarm, attempts=[entry(1, decided=5)],
                           executions=[execution("a1", status, stopped=None if status == "RUNNING" else 80)])  # fmt: skip
        assert name(RUN, "idle", STACK) not in started(decision), decision
    relaunched = [execution("a1", "SUCCEEDED", stopped=60)]
    assert (
        started(verdict(99, alarm=alarm, attempts=[entry(1, decided=5)], executions=relaunched))
        == []
    )
    assert started(verdict(101, alarm=alarm, attempts=[entry(1, decided=5)],
                           executions=relaunched)) == [name(RUN, "idle", STACK)]  # fmt: skip


def test_the_node_loss_notice_is_matched_by_stack_and_attempt():
    """Bug 5's risk: attempt 1's notice, left in controller.json because attempt 1 ended by its
    DONE.json, is not attempt 2's: EC2 ending a node of attempt 2 is noticed anew, and the
    head's record awaited, not written up at once for the old notice's age."""
    gone = fleet("running", "terminated")
    old = {"noticed": {"stack_id": STACK, "attempt": 1, "at": stamp(20), "nodes": ["node 1"]}}
    world = {"instances": gone, "controller": old, "attempts": [entry(1, decided=25)],
             "executions": [execution("a1", "SUCCEEDED", stopped=30)]}  # fmt: skip
    decision = verdict(60, **world)
    assert dos(decision) == ["tell"], decision
    assert decision["actions"][0]["fields"]["noticed"]["attempt"] == 2
    other = {"noticed": {**old["noticed"], "attempt": 2, "stack_id": OLD_STACK}}
    assert dos(verdict(60, **{**world, "controller": other})) == ["tell"]
    mine = {"noticed": {**old["noticed"], "attempt": 2, "at": stamp(57)}}
    assert dos(verdict(59, **{**world, "controller": mine})) == []
    assert dos(verdict(60, **{**world, "controller": mine})) == ["write_done"]


def test_a_silent_node_past_its_budget_is_terminated_and_not_replaced():
    """Bug 5: the budget spent (two replacements of node 2 in attempt 1), node 2's instance
    runs silent: terminated all the same, said once in controller.json."""
    used = [{"node_index": 2, "instance_id": f"i-r{k}", "attempt": 1, "replacement": k}
            for k in (1, 2)]  # fmt: skip
    world = elastic(silent=["2"], assignments=used)
    world["beats"]["2"] = at(57)
    terminate, tell = elastic_verdict(60, **world)["actions"]
    assert (terminate["do"], terminate["ids"]) == ("terminate", ["i-2-running-aaaa"])
    assert "past its replacements" in terminate["why"]
    assert "not replaced again" in tell["fields"]["unreplaced"]["nodes"]["2"]


def test_a_replacement_assigned_but_not_listed_yet_is_launching_not_lost():
    """EC2 does not list a replacement the tick launched a minute ago (eventual consistency):
    nothing is launched again; past the listing lag it is gone, and replaced as a new loss."""
    launched = {"node_index": 1, "instance_id": "i-new", "attempt": 1, "replacement": 1,
                "launched_at": stamp(59)}  # fmt: skip
    world = elastic("running", "terminated", "running", assignments=[launched])
    assert elastic_verdict(60, **world)["actions"] == []
    [replace] = elastic_verdict(65, **{**world, "head_beat": at(64),
                                       "beats": {"0": at(64), "2": at(64)}})["actions"]  # fmt: skip
    assert (replace["number"], replace["replaces"]) == (2, "i-new")


HELD = {"held": True, "stack_id": STACK, "held_at": stamp(50), "held_by": "arn:aws:iam::1:user/o"}
ON_HOLD = [
    # (case, minutes, world): each would act were the run not held
    ("a lost node is not replaced", 60, {"instances": [*fleet("running", "terminated", "running"), instance("head")], "stack_": stack(nodes=3, min_nodes=2)}),
    ("an attempt's end is not recorded, nor relaunched", 60, {"done": {"attempt": 1, "status": "failed", "cause": "node_lost", "reason": "r"}}),
    ("a recorded relaunch is not started", 61, {"attempts": [entry(1)]}),
    ("a silent fleet gets no DONE.json", 60, {"beats": {"0": at(50), "1": at(50)}}),
    ("nodes EC2 ended get no notice", 60, {"instances": fleet("running", "terminated")}),
    ("an idle fleet is not deleted", 75, {"alarm": {"state": "ALARM", "since": at(0)}}),
    ("the run's unclaimed instance is not swept", 10, {"instances": [*fleet(), instance(None, cloudformation=False)]}),
    ("a given-up run is not stopped", 60, {"failures": [{"final": True, "stack_id": STACK}]}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "now", "world"), ON_HOLD, ids=[r[0] for r in ON_HOLD])
def test_a_held_run_gets_no_action(case, now, world):
    """An operator's hold (clustermgtd's disable_all_cluster_management): no replacement, no
    relaunch, no DONE.json of the controller's, no idle delete, no sweep of the run's own
    instances, nothing stopped."""
    world = {"beats": {"0": at(now - 1), "1": at(now - 1)}, **world}
    assert verdict(now, **world)["actions"], "the case must act when not held"
    held = verdict(now, hold=HELD, **world)
    assert (held["phase"], held["actions"]) == ("held", []), held


def test_a_hold_stops_neither_the_cap_nor_a_delete_nor_the_sweep_of_other_stacks():
    assert started(verdict(361, hold=HELD)) == [name(RUN, "cap", STACK)]
    deleting = verdict(60, hold=HELD, stack_=stack(status="DELETE_FAILED"))
    assert started(deleting) == [name(RUN, "destroy", STACK)]
    left = verdict(10, hold=HELD, instances=[*fleet(), instance("0", of=OLD_STACK)])
    assert dos(left) == ["terminate"] and left["phase"] == "held"


def test_a_hold_of_an_earlier_stack_or_a_released_one_holds_nothing():
    gone = fleet("running", "terminated")
    for hold in ({**HELD, "stack_id": OLD_STACK}, {**HELD, "held": False}, {}):
        assert verdict(60, hold=hold, instances=gone)["phase"] != "held"


def test_the_idle_clock_runs_through_a_hold():
    """Idle since minute 0 and held at 20: nothing while held; released at 90, the fleet goes at
    that first tick, its clock never reset by the hold."""
    alarm = {"state": "ALARM", "since": at(0)}
    held = verdict(60, hold=HELD, alarm=alarm)
    assert held["actions"] == [] and "goes at the first tick after release" in held["why"]
    released = {**HELD, "held": False, "released_at": stamp(90)}
    assert started(verdict(90, hold=released, alarm=alarm)) == [name(RUN, "idle", STACK)]


def test_the_lost_instance_within_one_second_is_the_newer_replacement():
    """EC2's LaunchTime is to the second: a replacement launched and lost within the second of
    the one it replaced is still the newer, so its loss gets a token of its own."""
    at = datetime.datetime(2026, 11, 29, 7, 0, 1, tzinfo=datetime.timezone.utc)
    fleet = [
        {"id": "i-7b3c", "node": "0", "launched": at},  # CloudFormation's, lost first
        {"id": "i-33b1", "node": "0", "launched": at},  # replacement 1, lost in turn
    ]
    assigned = {"i-33b1": {"replacement": 1, "launched_at": "2026-11-29T07:00:01Z"}}
    assert judge.last_served(fleet, 0, assigned) == "i-33b1"
    fleet.append({"id": "i-0aa1", "node": "0", "launched": at})
    assigned["i-0aa1"] = {"replacement": 2, "launched_at": "2026-11-29T07:00:01Z"}
    assert judge.last_served(fleet, 0, assigned) == "i-0aa1"
