"""The status screen names what it knows (issue 50): never `None`, a replacement not indexed yet
by its instance, and only the resets of the attempt status.json describes."""

import re
from datetime import datetime, timezone

from watch.screen import RunFacts, reset_line, runs_table, status_screen

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
STARTED = "2026-11-29T11:00:00Z"  # the attempt status.json describes


def reset(at: str, lost=(), added=(), before=16, after=8) -> dict:
    return {"at": at, "lost": list(lost), "added": list(added), "ranks_before": before,
            "ranks_after": after, "recovery_s": 30.0, "steps_redone": 2}  # fmt: skip


def status(**changes) -> dict:
    doc = {"run": "r1", "attempt": 2, "phase": "training", "updated_at": "2026-11-29T11:59:50Z",
           "attempt_started_at": STARTED, "instance_type": "p4d.24xlarge", "nodes": 2,
           "gpus_per_node": 8, "nodes_healthy": 2, "nodes_training": 2}  # fmt: skip
    return doc | changes


def screen(**changes) -> str:
    return status_screen(RunFacts(run="r1", bucket="b", now=NOW, status=status(**changes)))


def test_a_replacement_not_yet_indexed_is_named_by_its_instance():
    joined = {"node": None, "instance_id": "i-0replacement", "ip": "10.0.0.9"}
    line = reset_line(reset("2026-11-29T11:30:00Z", added=[joined], before=8, after=16))
    assert "a replacement (i-0replacement) joined, 8 -> 16 ranks" in line
    assert "None" not in line
    # Nor its instance: its address; nor that: a node.
    assert "a node at 10.0.0.9 lost" in reset_line(
        reset("t", lost=[{"node": None, "ip": "10.0.0.9"}])
    )
    assert ": a node lost," in reset_line(reset("t", lost=[{"node": None}]))
    assert "node 1 lost" in reset_line(reset("t", lost=[{"node": 1, "instance_id": "i-1"}]))


def test_only_the_current_attempt_s_resets_are_shown():
    earlier = reset(
        "2026-11-29T10:00:00Z", lost=[{"node": None, "instance_id": "i-old"}], before=2, after=1
    )
    now = reset("2026-11-29T11:30:00Z", lost=[{"node": 1, "instance_id": "i-1"}])
    shown = screen(resets=[earlier, now])
    assert "resets      1, the last: 2026-11-29T11:30:00Z: node 1 lost, 16 -> 8 ranks" in shown
    assert "i-old" not in shown and "2 -> 1" not in shown
    # A rerun whose every reset is the earlier attempt's shows no reset line at all.
    assert "resets " not in screen(resets=[earlier])


def test_no_line_of_the_screen_or_the_runs_table_prints_none():
    """Every value the screen reads from status.json, DONE.json, attempts.json and hold.json
    missing (null), as a head that died early, or an older record, leaves them."""
    nulls = dict.fromkeys(status(), None) | {"phase": "training", "attempt_started_at": STARTED}
    progress = dict.fromkeys(
        ("epoch", "epochs", "step", "steps_per_epoch", "global_step", "loss", "top1", "eta_s"), None
    )
    facts = RunFacts(
        run="r1", bucket="b", now=NOW,
        status=nulls | {
            "nodes_training": 1, "progress": progress, "execution": None,
            "checkpoint": {"key": None, "step": None, "at": None},
            "resets": [{"at": None, "lost": [{"node": None, "instance_id": None, "ip": None}],
                        "added": [], "ranks_before": None, "ranks_after": None}],
        },
        done={"status": None, "top1": None, "reason": None, "attempt": None,
              "timeline": {"phases": {"launch": {"s": 1.0, "slowest": None}}, "budget_s": {}}},
        attempts=[dict.fromkeys(("attempt", "status", "decision", "why", "reason"), None)],
        hold={"held": True, "held_at": None, "held_by": None},
    )  # fmt: skip
    text = status_screen(facts) + runs_table([facts])
    assert not re.search(r"\bNone\b", text), [line for line in text.splitlines() if "None" in line]
