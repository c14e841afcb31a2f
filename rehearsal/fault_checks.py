"""What a fault row's outcome must show (rehearsal/fault_rows.py `Expect.checks`): each a `Check`
of the rehearsal and the last attempt's DONE.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from rehearsal.common import RUN
from rehearsal.core import Rehearsal
from rehearsal.fault_actions import s3_object

Check = Callable[[Rehearsal, dict], bool]


def node_said(rehearsal: Rehearsal, index: int, text: str) -> bool:
    return any(text in line for line in rehearsal.output.get(f"node{index}", []))


def decisions(*expected: str) -> Check:
    """The run controller decided exactly these, in order, for the row's attempts."""
    return lambda r, done: [e["decision"] for e in r.entries] == list(expected)


def every_attempt_counted(rehearsal: Rehearsal, done: dict) -> bool:
    """DONE.json counts the attempts and lists each one's end, the earlier ones from the
    controller's attempts.json."""
    attempts = done.get("attempts") or []
    return done.get("attempt") == len(attempts) >= 2 and attempts[0]["status"] != "succeeded"


def names_the_lost_node(index: int) -> Check:
    """The first attempt of the row ended `node_lost`, naming node `index` from its stale
    heartbeat (the code decides; the text is what a user reads, whatever exception carried it)."""
    return lambda r, done: first_attempt_ended(
        "node_lost",
        f"node {index} ({r.instance_id(index)}, {r.fleet.nodes[index].ip}) lost: no heartbeat for ",
    )(r, done)


def interruption_named(index: int) -> Check:
    """The first attempt of the row ended interrupted, naming node `index`'s first instance."""
    return lambda r, done: (
        r.entries[0]["status"] == "interrupted"
        and (
            f"Spot interruption of node {index} ({r.interrupted_instance}, "
            in r.entries[0]["reason"]
        )
    )


# How a node came back in place (DONE.json's `attempts` entries, docs/contracts.md).
IN_PLACE = ("kept", "rebooted", "restarted")


def came_back(done: dict) -> dict[str, dict]:
    """The last attempt's entry of DONE.json's `attempts`: each node's way back and pull."""
    return ((done.get("attempts") or [{}])[-1]).get("nodes") or {}


def every_node_back_in_place_with_nothing_fetched(rehearsal: Rehearsal, done: dict) -> bool:
    """The relaunched attempt says every node and the head came back in place (kept, rebooted
    or restarted: their disks kept), and each node's pull fetched 0 bytes (it verified the
    dataset it kept)."""
    nodes = came_back(done)
    indexes = [str(i) for i in range(rehearsal.args.nodes)]
    return (
        (done.get("attempt") or 0) >= 2
        and all(nodes.get(i, {}).get("came_back") in IN_PLACE for i in [*indexes, "head"])
        and all(nodes[i].get("pull_bytes") == 0 for i in indexes)
    )


def only_node_replaced(index: int) -> Check:
    """The last attempt ran node `index` on a new instance (registered with its replacement's id
    and address) and every other node on its own, rebooted in place."""

    def check(rehearsal: Rehearsal, done: dict) -> bool:
        nodes = came_back(done)
        entry = json.loads(s3_object(rehearsal, f"runs/{RUN}/nodes/{index}.json") or b"{}")
        others = [str(i) for i in range(rehearsal.args.nodes) if i != index]
        return (
            index in rehearsal.launched
            and (entry.get("instance_id"), entry.get("ip"))
            == (rehearsal.instance_id(index), rehearsal.node_ip(index))
            and nodes.get(str(index), {}).get("came_back") == "replaced"
            and all(nodes.get(i, {}).get("came_back") == "rebooted" for i in others)
        )

    return check


def a_new_head_took_over(rehearsal: Rehearsal, done: dict) -> bool:
    """The head EC2 terminated was launched again from its template: the last attempt's head is
    a new instance, its DONE.json written by it, with every node back in place under it."""
    head = came_back(done).get("head") or {}
    gone = rehearsal.noted.get("head_terminated")
    indexes = [str(i) for i in range(rehearsal.args.nodes)]
    return (
        head.get("came_back") == "replaced"
        and head.get("instance_id") == rehearsal.head_instance
        and gone is not None
        and head.get("instance_id") != gone
        and done.get("written_by") == "head"
        and all(came_back(done).get(i, {}).get("came_back") in IN_PLACE for i in indexes)
    )


def names_the_full_disk(rehearsal: Rehearsal, done: dict) -> bool:
    reason = done["reason"] or ""
    return (
        "ENOSPC" in reason
        and f"{rehearsal.workdir / 'data' / 'model'}/checkpoints/" in reason
        and " on rank 0 (" in reason  # the rank and its node; the head's disk is not theirs
        and "filesystem" not in reason
    )


def first_attempt_ended(cause: str, *texts: str) -> Check:
    """The row's first attempt ended with `cause`, its reason holding every text."""
    return lambda r, done: (
        r.entries[0].get("cause") == cause
        and all(text in (r.entries[0]["reason"] or "") for text in texts)
    )


def no_node_blamed(rehearsal: Rehearsal, done: dict) -> bool:
    """No node called another (or the head) lost, the head's discovery dropped none, and no
    reset happened: an S3 outage is nobody's loss."""
    said = [f"node{index}" for index in range(rehearsal.args.nodes)] + ["head"]
    return not done.get("resets") and not any(
        text in line
        for name in said
        for line in rehearsal.output.get(name, [])
        for text in ("is lost", "no heartbeat for")
    )


def no_epoch_retrained(first_epoch: int) -> Check:
    return lambda r, done: (
        not any(head_said(r, f"<stdout>:Epoch {e}/") for e in range(1, first_epoch))
        and head_said(r, "Resuming from")
    )


def the_controller_wrote_the_silence(rehearsal: Rehearsal, done: dict) -> bool:
    """The first attempt ended by the run controller's record: every node silent, named."""
    first = rehearsal.entries[0] if rehearsal.entries else {}
    return (
        first.get("cause") == "node_lost"
        and "silent: no heartbeat for more than" in (first.get("reason") or "")
        and all(f"node {i}" in first["reason"] for i in range(rehearsal.args.nodes))
        and first.get("decision") == "relaunch"
        and (done.get("attempt") or 0) >= 2
    )


# --- the elastic fleet --------------------------------------------------------------------------


def one_attempt(rehearsal: Rehearsal, done: dict) -> bool:
    """The run ended in its first attempt: no relaunch (the run controller only tore it down)."""
    return done.get("attempt") == 1 and [e["decision"] for e in rehearsal.entries] == ["teardown"]


def lost_in_a_reset(index: int) -> Check:
    """DONE.json's resets name node `index` among the nodes a reset lost."""
    return lambda r, done: any(
        any(n.get("node") == str(index) for n in reset.get("lost") or [])
        for reset in done.get("resets") or []
    )


def replacement_joined(index: int) -> Check:
    """The run controller's replacement for node `index` joined the training before the end:
    a reset of DONE.json adds node `index` on the instance the controller launched."""
    return lambda r, done: (
        index in r.launched
        and any(
            any(
                (n.get("node"), n.get("instance_id")) == (str(index), r.launched[index])
                for n in reset.get("added") or []
            )
            for reset in done.get("resets") or []
        )
    )


def trainer_kept_its_pid(index: int) -> Check:
    """Node `index`'s trainer process is the same one before the loss and at the end of the
    next epoch (rehearsal/fault_actions.py kill_host's notes): a reset, not a restart."""
    return lambda r, done: (
        bool(r.noted.get("before", {}).get(index))
        and (r.noted["before"][index] == r.noted.get("after", {}).get(index))
    )


def training_again_within(index: int, seconds: float) -> Check:
    """The reset that lost node `index` had the others training again (their first step
    completed) within `seconds` of its last step seen done: its recovery_s."""
    return lambda r, done: any(
        reset.get("recovery_s") is not None
        and reset["recovery_s"] <= seconds
        and any(n.get("node") == str(index) for n in reset.get("lost") or [])
        for reset in done.get("resets") or []
    )


def left_with_no_step_redone(index: int) -> Check:
    """Node `index` left at a commit: the reset without it redid no step, nor did the run."""
    return lambda r, done: (
        any(
            reset.get("steps_redone") == 0
            and any(n.get("node") == str(index) for n in reset.get("lost") or [])
            for reset in done.get("resets") or []
        )
        and ((done.get("timeline") or {}).get("steps") or {}).get("steps_redone") == 0
    )


def head_said(rehearsal: Rehearsal, text: str) -> bool:
    return any(text in line for line in rehearsal.output.get("head", []))


def lost_joiner_named(index: int) -> Check:
    """Node `index`'s replacement was killed early (rehearsal.noted["replacement_killed"]), and
    the record names node `index` alone: every horovodrun restart of the attempt (DONE.json
    `training_restarts`) names it and no other node, and the head blamed no other node (issue
    47: its healthy peer, node 1, was). Killed before it registered (a loaded machine), or
    before its heartbeat was steady, it never reached the driver and nothing failed."""

    def check(rehearsal: Rehearsal, done: dict) -> bool:
        killed = rehearsal.noted.get("replacement_killed")
        others = [i for i in range(rehearsal.args.nodes) if i != index]
        restarts = done.get("training_restarts") or []
        return (
            killed is not None
            and all(
                f"node {index} (" in r["reason"]
                and not any(f"node {i} (" in r["reason"] for i in others)
                for r in restarts
            )
            and not any(
                f"node {i} (" in line and (" lost: " in line or "stopped answering" in line)
                for i in others
                for line in rehearsal.output.get("head", [])
            )
        )

    return check


def waited_for_the_head(rehearsal: Rehearsal, done: dict) -> bool:
    """Every node saw the head silent while its ranks stepped and waited (supervision.py
    HeadWatch's line), and none found it lost."""
    nodes = range(rehearsal.args.nodes)
    return all(node_said(rehearsal, i, "a stalled head, waited for up to") for i in nodes) and (
        not any(node_said(rehearsal, i, "is lost") for i in nodes)
    )
