"""The tick's decision: from what it read of the run (observe.py) and the time, the run's phase and
the next idempotent actions (act.py does them). Pure: every rule is a function of the snapshot,
so a missed, early, duplicate or self-made event costs at most one tick, and the tests drive it
case by case (tests/stacks/test_decide.py).

It is made in two halves. The guards first (decide_guards.py: a delete under way, the hard cap,
a stack being created or updated, an operator's hold, the idle fleet), from CloudFormation's,
EC2's, Step Functions' and CloudWatch's view alone, acted on before any record is read. Then,
when no guard owns the tick, the run as its records say (this module):

    an action given up for good                     controller_failed: nothing bills
    an attempt's end recorded, its action running   relaunching / tearing_down (its own stops
                                                    and starts are never faults)
    otherwise the attempt under way                 booting / training, until its DONE.json (the
                                                    nodes', or the controller's when EC2 ended
                                                    nodes or the whole fleet went silent), or a
                                                    guard

While an operator holds the run (decide_guards.py), none of this is decided: no replacement, no
relaunch, no DONE.json of the controller's, no idle delete, no orphan of the run's stack swept,
nothing stopped.
A run is live until its final record (an attempts.json entry that is not `relaunch`), whatever
its instances are doing.
Only the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from contract import causes
from contract.records import AttemptEntry, Done
from contract.runs import parse_stamp, stamp
from controller import judge, recovery, replace, zones
from controller.actions import Verdict
from controller.decide_guards import guards
from controller.ec2_fleet import LIVE_STATES, UP_STATES
from controller.executions import attempt_kind
from controller.long_actions import Decider
from controller.snapshot import Snapshot


def decide(snapshot: Snapshot, now: datetime.datetime) -> Verdict:
    """{"phase", "why", "actions"} for the run as `snapshot` shows it at `now`: the guards'
    verdict when one owns the tick, else the records' after the guards' actions."""
    first = guards(snapshot, now)
    if first["phase"] is not None:
        return first
    then = rest(snapshot, now)
    return {**then, "actions": first["actions"] + then["actions"]}


def rest(snapshot: Snapshot, now: datetime.datetime) -> Verdict:
    """The run as its records say, once no guard owns the tick (`snapshot["records"]` read)."""
    return Decision(snapshot, now).verdict()


class Decision(Decider):
    def verdict(self) -> Verdict:
        self.sweep(self.stack, of_live=True, known=self.records.get("assigned") or set())
        if self.failed_for_good():
            return self.controller_failed()
        idle = judge.chain(self.executions, "idle")
        if idle["state"] != "none":  # given up: decide_guards leaves it here
            return self.follow_chain("idle", idle, self.delete_input("idle"), "idle")
        return self.attempts()

    def controller_failed(self) -> Verdict:
        up = [i for i in self.fleet() if i["state"] in UP_STATES]
        if up:
            self.actions.append({"do": "stop_billing", "fleet": up})
        return self.phase(
            "controller_failed",
            "the run controller gave a long action up: nothing bills; the hard cap deletes the "
            "fleet at the cap",
        )

    def attempts(self) -> Verdict:
        """The newest attempt of this stack: its end's action, then the attempt under way."""
        entries = self.entries()
        current = max((e.get("attempt") or 0 for e in entries), default=0) + 1
        last = next((e for e in entries if e.get("attempt") == current - 1 and self.ours(e)), None)
        if last is not None:
            kind = attempt_kind(last["attempt"])
            chain = judge.chain(self.executions, kind)
            relaunch = last["decision"] == "relaunch"
            if not relaunch or chain["state"] != "succeeded":
                if relaunch:  # a teardown's DONE.json is the run's final record: it stays
                    self.drop_stale_done(current)
                document = self.relaunch_input(last) if relaunch else self.teardown_input(last)
                phase = "relaunching" if relaunch else "tearing_down"
                return self.follow_chain(kind, chain, document, phase, tell=self.told(last))
        return self.under_way(current, last)

    def under_way(self, attempt: int, last: AttemptEntry | None) -> Verdict:
        done = self.records.get("done")
        if done is not None and (done.get("attempt") or attempt) < attempt:
            self.drop_stale_done(attempt)
            done = None
        if done is not None:
            return self.record(done, done.get("attempt") or attempt)
        started = self.attempt_started(last)
        fleet = self.fleet()
        head = judge.head_of(fleet)
        if head is not None and head["state"] not in UP_STATES:
            gone = [f"the head ({head['id']}, {head['state']})"]
            return self.nodes_gone(attempt, fleet, gone, spot=False)
        if head is not None and self.stack["template"]:
            # An elastic fleet: a lost node costs its head a reset, and is replaced meanwhile.
            self.actions += replace.replace_lost(
                self.stack, self.records, self.settings, self.now, attempt, fleet, started
            )
        elif gone := judge.gone_nodes(self.stack["nodes"], fleet):
            return self.nodes_gone(attempt, fleet, gone)
        self.forget_notice()
        timeout = datetime.timedelta(seconds=self.stack["heartbeat_timeout_s"])
        grace = datetime.timedelta(seconds=self.stack["startup_grace_s"])
        beats = self.records.get("heartbeats") or {}
        if silent := judge.silent_nodes(
            self.stack["nodes"], beats, started, self.now, timeout, grace
        ):
            reason = (
                f"{', '.join(silent)} silent: no heartbeat for more than "
                f"{self.stack['heartbeat_timeout_s']} s while every instance runs (a network "
                "event, a wedged image?), and no node wrote DONE.json"
            )
            self.write_done(attempt, "failed", causes.NODE_LOST, reason)
            return self.phase("ending", f"the whole fleet went silent: {reason}")
        fresh = any(b >= started for b in beats.values())
        return self.phase("training" if fresh else "booting", f"attempt {attempt} under way")

    # --- an attempt's end -----------------------------------------------------------------------

    def record(self, done: Done, attempt: int) -> Verdict:
        """The attempt's DONE.json, recorded once with its decision, and the action it decides
        started under the attempt's name."""
        stack = self.stack
        status = self.records.get("status") or {}
        entry = recovery.attempt_entry(
            {**done, "attempt": attempt},
            [e for e in self.entries() if (e.get("attempt") or 0) < attempt],
            max_restarts=stack["max_restarts"],
            now=self.now,
            deadline=stack["deadline"],
            started_at=status.get("attempt_started_at")
            if status.get("attempt") == attempt
            else None,
            stack_id=stack["id"],
        )
        if entry["decision"] == "relaunch" and (why := judge.unreturnable(stack, self.fleet())):
            entry.update(decision="stop", why=why)
        self.actions.append({"do": "record", "entry": entry})
        if entry["decision"] == "relaunch":
            self.actions.append({"do": "delete_done", "etag": self.records.get("done_etag")})
            mail = (
                f"ended attempt {attempt} ({entry['reason']}); the fleet is relaunched "
                f"({entry['why']}) and resumes from its newest checkpoint"
            )
            document, phase = self.relaunch_input(entry), "relaunching"
        else:
            mail = (
                f"ended attempt {attempt}: {entry['why']}" if entry["decision"] == "stop" else None
            )
            document, phase = self.teardown_input(entry), "tearing_down"
        tell = {"phase": phase, **self.told(entry)}
        self.start(attempt_kind(attempt), 0, document, mail=mail, tell=tell)
        return self.phase(phase, f"attempt {attempt}: {entry['why']}")

    def told(self, entry: AttemptEntry) -> dict:
        """What controller.json says of an attempt's end: the next attempt and why, on a
        relaunch; why the run ends, otherwise."""
        if entry["decision"] == "relaunch":
            return {
                "attempt": entry["attempt"] + 1,
                "reason": f"{entry['reason']} ({entry['why']})",
            }
        return {"reason": entry["why"]}

    def nodes_gone(
        self, attempt: int, fleet: list[dict], gone: list[str], spot: bool | None = None
    ) -> dict:
        """EC2 ended nodes (a Spot reclaim, a retired host, a stop), or the head, and no node
        wrote DONE.json: after NOTICE for the head's (or, the head gone, a node's) own record,
        the controller writes the attempt's (interrupted on a Spot fleet unless `spot` says)."""
        notice = self.notice(attempt)
        if notice is None:
            noticed = {"stack_id": self.stack["id"], "attempt": attempt, "at": stamp(self.now),
                       "nodes": gone}  # fmt: skip
            self.actions.append({"do": "tell", "fields": {"noticed": noticed}})
            return self.phase("training", f"EC2 ended {', '.join(gone)}: awaiting DONE.json")
        if self.now - parse_stamp(notice["at"]) < judge.NOTICE:
            return self.phase("training", f"EC2 ended {', '.join(gone)}: awaiting DONE.json")
        spot = any(n["spot"] for n in fleet) if spot is None else spot
        status, cause = (
            ("interrupted", causes.INTERRUPTED) if spot else ("failed", causes.NODE_LOST)
        )
        reason = f"EC2 ended {', '.join(gone)} of the fleet and no node wrote DONE.json"
        self.write_done(attempt, status, cause, reason)
        return self.phase("ending", reason)

    # --- long actions ---------------------------------------------------------------------------

    def teardown_input(self, entry: AttemptEntry) -> dict:
        return {**self.base_input(), "action": "teardown", "attempt": entry["attempt"],
                "reason": entry["decision"]}  # fmt: skip

    def relaunch_input(self, entry: AttemptEntry) -> dict:
        """Where the relaunch goes: the fleet's zones in try order, its current zone first."""
        here = next((n["zone"] for n in self.fleet() if n["state"] in LIVE_STATES), None)
        plan = {"zones": zones.try_order(self.stack["zones"], here), "nodes": self.stack["nodes"]}
        return {
            **self.base_input(),
            "action": "relaunch",
            "attempt": entry["attempt"],
            "plan": plan,
        }

    # --- what the records say ---------------------------------------------------------------------

    def entries(self) -> list[AttemptEntry]:
        return [e for e in self.records.get("attempts") or [] if isinstance(e, dict)]

    def ours(self, entry: AttemptEntry) -> bool:
        """Whether an attempts.json entry is this stack's (a run deployed again continues its
        attempts in a new stack; entries from before this field are an older controller's)."""
        return entry.get("stack_id") == self.stack["id"]

    def failed_for_good(self) -> bool:
        return any(
            f.get("final") and f.get("stack_id") == self.stack["id"]
            for f in self.records.get("controller_failures") or []
        )

    def attempt_started(self, last: AttemptEntry | None) -> datetime.datetime:
        """When the attempt under way began: its relaunch's end (and never before the decision
        that ended the attempt before it), or the stack's creation."""
        if last is not None:
            decided = parse_stamp(last["decided_at"])
            newest = judge.chain(self.executions, attempt_kind(last["attempt"]))["newest"]
            stopped = (newest or {}).get("stopped")
            return max(decided, stopped) if stopped is not None else decided
        return self.stack["created_at"]

    def notice(self, attempt: int) -> dict | None:
        """controller.json's notice that EC2 ended nodes of this stack's attempt `attempt` (one
        of an earlier attempt, never forgotten because its DONE.json came first, is not this
        attempt's: its age would end this attempt without awaiting the head's record)."""
        noticed = (self.records.get("controller") or {}).get("noticed") or {}
        mine = noticed.get("stack_id") == self.stack["id"] and noticed.get("attempt") == attempt
        return noticed if mine and noticed.get("at") else None

    def forget_notice(self) -> None:
        if (self.records.get("controller") or {}).get("noticed"):
            self.actions.append({"do": "tell", "fields": {"noticed": None}})

    def drop_stale_done(self, attempt: int) -> None:
        """A DONE.json of an attempt already recorded (an old leader's shutdown wrote it again
        after the relaunch removed it) would end the next attempt's members at once."""
        done = self.records.get("done")
        if done is not None and (done.get("attempt") or attempt) < attempt:
            self.actions.append({"do": "delete_done", "etag": self.records.get("done_etag")})

    def write_done(self, attempt: int, status: str, cause: str, reason: str) -> None:
        self.actions.append({"do": "write_done", "attempt": attempt, "status": status,
                             "cause": cause, "reason": reason})  # fmt: skip
