"""The tick's decision: from what it read of the run (observe.py) and the time, the run's phase and
the next idempotent actions (act.py does them). Pure: every rule is a function of the snapshot,
so a missed, early, duplicate or self-made event costs at most one tick, and the tests drive it
case by case (tests/stacks/test_decide.py).

The phase is derived from the world, never from the last event:

    no TrainStack                                   none (orphans only)
    being deleted                                   deleting: the delete is followed
    being created or updated                        creating / updating: a live run; only the
                                                    hard cap acts
    past the hard cap                               capped: every other action stopped, deleted
    an action given up for good                     controller_failed: nothing bills
    an attempt's end recorded, its action running   relaunching / tearing_down (its own stops
                                                    and starts are never faults)
    otherwise the attempt under way                 booting / training, until its DONE.json (the
                                                    nodes', or the controller's when EC2 ended
                                                    nodes or the whole fleet went silent), the
                                                    idle guard or the cap

A run is live until its final record (an attempts.json entry that is not `relaunch`), whatever
its instances are doing.
Only the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

import judge
import recovery
import replace
import train_stack
import zones
from ec2_fleet import LIVE_STATES, UP_STATES
from executions import attempt_kind, name

from contract import causes
from contract.runs import parse_stamp, stamp

# Stack statuses in which CloudFormation owns every change: nothing of the run is judged.
ROLLING_BACK = ("ROLLBACK_IN_PROGRESS",)
# A create that failed and could not be rolled back: its instances are left over (orphans).
LEFT_OVER = ("ROLLBACK_FAILED",)


def decide(snapshot: dict, now: datetime.datetime) -> dict:
    """{"phase", "why", "actions"} for the run as `snapshot` shows it at `now`."""
    return Decision(snapshot, now).verdict()


class Decision:
    def __init__(self, snapshot: dict, now: datetime.datetime) -> None:
        self.now = now
        self.stack = snapshot["stack"]
        self.instances = snapshot["instances"]
        self.records = snapshot.get("records") or {}
        self.executions = snapshot.get("executions") or []
        self.alarm = snapshot.get("alarm")
        self.settings = snapshot.get("settings") or {}
        self.actions: list[dict] = []

    # --- the phases ---------------------------------------------------------------------------

    def verdict(self) -> dict:
        stack = self.stack
        live = not train_stack.gone(stack) and stack["status"] not in LEFT_OVER
        self.sweep(stack if live else None)
        if not live:
            return self.phase("none", "no TrainStack" if stack is None else stack["status"])
        if not stack["run"]:
            return self.phase("unknown", "TrainStack names no run (a stack from before the tags)")
        if train_stack.deleting(stack):
            return self.deleting()
        if stack["status"] in ROLLING_BACK:
            return self.phase("rolling_back", "CloudFormation rolls the create back")
        if stack["deadline"] is not None and self.now >= stack["deadline"]:
            return self.capped()
        if train_stack.busy(stack):
            kind = "creating" if train_stack.creating(stack) else "updating"
            return self.phase(kind, f"TrainStack is {stack['status']}: judged once it is over")
        if self.failed_for_good():
            return self.controller_failed()
        idle = judge.chain(self.executions, "idle")
        if idle["state"] != "none":
            return self.follow_chain("idle", idle, self.delete_input("idle"), "idle")
        return self.attempts()

    def deleting(self) -> dict:
        """A delete under way is followed: by the execution that asked for it, else by one of
        its own (cdk destroy), which terminates what holds a DELETE_FAILED up and deletes again."""
        if any(e["status"] == "RUNNING" for e in self.executions):
            return self.phase("deleting", "an execution follows the delete")
        chain = judge.chain(self.executions, "destroy")
        document = {**self.base_input(), "action": "follow", "reason": "destroy"}
        return self.follow_chain("destroy", chain, document, "deleting")

    def capped(self) -> dict:
        """The hard cap defers to nothing: every other long action stops, and the fleet goes."""
        others = [
            e["arn"] for e in self.executions if e["status"] == "RUNNING" and e["kind"] != "cap"
        ]
        if others:
            self.actions.append(
                {"do": "stop_executions", "arns": others, "why": "the hard cap ends the run"}
            )
        chain = judge.chain(self.executions, "cap")
        return self.follow_chain(
            "cap",
            chain,
            self.delete_input("hard-cap"),
            "capped",
            mail="reached its hard cap: the run controller is deleting its fleet",
        )

    def controller_failed(self) -> dict:
        up = [i for i in self.fleet() if i["state"] in UP_STATES]
        if up:
            self.actions.append({"do": "stop_billing", "fleet": up})
        return self.phase(
            "controller_failed",
            "the run controller gave a long action up: nothing bills; the hard cap deletes the "
            "fleet at the cap",
        )

    def attempts(self) -> dict:
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

    def under_way(self, attempt: int, last: dict | None) -> dict:
        done = self.records.get("done")
        if done is not None and (done.get("attempt") or attempt) < attempt:
            self.drop_stale_done(attempt)
            done = None
        if done is not None:
            return self.record(done, done.get("attempt") or attempt)
        started = self.attempt_started(last)
        if (idle := self.idle(last)) is not None:
            return idle
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

    def record(self, done: dict, attempt: int) -> dict:
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

    def told(self, entry: dict) -> dict:
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
        notice = self.notice()
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

    def idle(self, last: dict | None) -> dict | None:
        """The idle alarm, read as it is now: a fleet quiet for the idle window since its last
        progress, and past its launch grace since it was deployed or relaunched, goes."""
        alarm = self.alarm
        if alarm is None or alarm.get("state") != "ALARM":
            return None
        relaunched = [parse_stamp(e["decided_at"]) for e in self.entries()
                      if self.ours(e) and e.get("decision") == "relaunch" and e.get("decided_at")]  # fmt: skip
        deployed = max([self.stack.get("deployed_at") or self.stack["created_at"], *relaunched])
        due = judge.idle_due(
            alarm["since"],
            self.records.get("checkpoint_at"),
            deployed,
            datetime.timedelta(minutes=self.settings.get("idle_minutes", 30)),
            datetime.timedelta(seconds=self.stack["startup_grace_s"]),
        )
        if self.now < due:
            return None
        mail = f"sat idle since {stamp(alarm['since'])}: the run controller is deleting its fleet"
        return self.follow_chain(
            "idle",
            judge.chain(self.executions, "idle"),
            self.delete_input("idle"),
            "idle",
            mail=mail,
        )

    # --- long actions ---------------------------------------------------------------------------

    def follow_chain(
        self, kind: str, chain: dict, document: dict, phase: str, mail=None, tell=None
    ) -> dict:
        """A long action as its executions say: started when it never was, resumed under a new
        name when its execution failed, given up (the billing stopped, the controller's failure
        recorded) once it failed RESUMES + 1 times."""
        state, tell = chain["state"], {"phase": phase, **(tell or {})}
        if state == "none":
            self.start(kind, 0, document, mail=mail, tell=tell)
        elif state == "failed":
            newest = chain["newest"]
            why = f"resumed after its execution {newest['name']} ended {newest['status']}"
            self.start(kind, chain["resume"], document, tell={**tell, "reason": why})
        elif state == "exhausted":
            self.give_up(kind, chain["newest"])
            return self.phase("controller_failed", f"{kind} failed {chain['resume']} times")
        return self.phase(phase, f"{kind}: {state}")

    def give_up(self, kind: str, newest: dict) -> None:
        up = [i for i in self.fleet() if i["state"] in UP_STATES]
        if up:
            self.actions.append({"do": "stop_billing", "fleet": up})
        why = (
            f"the run controller gave {kind} up after {newest['resume'] + 1} executions, the last "
            f"of which ended {newest['status']} ({newest['name']}); nothing bills now, and the "
            "hard cap deletes the fleet"
        )
        failure = {"execution": newest["arn"], "stack_id": self.stack["id"], "error": "GaveUp",
                   "cause": why, "at": stamp(self.now), "final": True,
                   "stopped": [i["id"] for i in up]}  # fmt: skip
        self.actions.append({"do": "record_failure", "failure": failure})
        self.actions.append({"do": "tell", "fields": {"phase": "controller_failed",
                                                      "controller_state": "Failed", "reason": why}})  # fmt: skip

    def start(self, kind: str, resume: int, document: dict, mail=None, tell=None) -> None:
        self.actions.append(
            {
                "do": "start",
                "name": name(self.stack["run"], kind, self.stack["id"], resume),
                "input": document,
                "mail": mail,
                "tell": tell or {},
            }
        )

    def base_input(self) -> dict:
        return {"run": self.stack["run"], "stack_id": self.stack["id"]}

    def delete_input(self, reason: str) -> dict:
        return {**self.base_input(), "action": "delete", "reason": reason}

    def teardown_input(self, entry: dict) -> dict:
        return {**self.base_input(), "action": "teardown", "attempt": entry["attempt"],
                "reason": entry["decision"]}  # fmt: skip

    def relaunch_input(self, entry: dict) -> dict:
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

    def entries(self) -> list[dict]:
        return [e for e in self.records.get("attempts") or [] if isinstance(e, dict)]

    def ours(self, entry: dict) -> bool:
        """Whether an attempts.json entry is this stack's (a run deployed again continues its
        attempts in a new stack; entries from before this field are an older controller's)."""
        return entry.get("stack_id") == self.stack["id"]

    def failed_for_good(self) -> bool:
        return any(
            f.get("final") and f.get("stack_id") == self.stack["id"]
            for f in self.records.get("controller_failures") or []
        )

    def attempt_started(self, last: dict | None) -> datetime.datetime:
        """When the attempt under way began: its relaunch's end (and never before the decision
        that ended the attempt before it), or the stack's creation."""
        if last is not None:
            decided = parse_stamp(last["decided_at"])
            newest = judge.chain(self.executions, attempt_kind(last["attempt"]))["newest"]
            stopped = (newest or {}).get("stopped")
            return max(decided, stopped) if stopped is not None else decided
        return self.stack["created_at"]

    def notice(self) -> dict | None:
        noticed = (self.records.get("controller") or {}).get("noticed") or {}
        mine = noticed.get("stack_id") == self.stack["id"]
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

    def fleet(self) -> list[dict]:
        return judge.of_stack(self.instances, self.stack["id"])

    def sweep(self, live: dict | None) -> None:
        known = self.records.get("assigned") or set()
        if ids := judge.orphans(self.instances, live, known, self.now):
            why = "no live TrainStack or record claims them after the orphan timeout"
            self.actions.append({"do": "terminate", "ids": ids, "why": why})

    def phase(self, phase: str, why: str) -> dict:
        return {"phase": phase, "why": why, "actions": self.actions}
