"""What both halves of the tick's decision share (decide_guards.py, then decide.py): the snapshot
and the time, the actions decided so far, and the long actions, executions of the state machine
started under the names of what they do, followed, resumed when they fail and given up at last.
Pure, as decide.py.
Only the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from contract.runs import stamp
from controller import judge
from controller.actions import Action, Verdict
from controller.ec2_fleet import UP_STATES
from controller.executions import name
from controller.snapshot import Instance, Snapshot


class Decider:
    def __init__(self, snapshot: Snapshot, now: datetime.datetime) -> None:
        self.now = now
        self.stack = snapshot["stack"]
        self.instances = snapshot["instances"]
        self.records = snapshot.get("records") or {}
        self.executions = snapshot.get("executions") or []
        self.alarm = snapshot.get("alarm")
        self.checkpoint_at = snapshot.get("checkpoint_at")
        self.hold = snapshot.get("hold")
        self.settings = snapshot.get("settings") or {}
        self.actions: list[Action] = []

    def phase(self, phase: str | None, why: str) -> Verdict:
        return {"phase": phase, "why": why, "actions": self.actions}

    def fleet(self) -> list[Instance]:
        return judge.of_stack(self.instances, self.stack["id"])

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

    def sweep(self, live: dict | None, of_live: bool, known: set[str]) -> None:
        """Terminate the orphans (judge.orphans) among the instances of the live stack
        (`of_live`, with the launch assignments `known`) or among all the others."""
        live_id = live["id"] if live is not None else None
        mine = [i for i in self.instances if (i["stack"] == live_id) is of_live]
        if ids := judge.orphans(mine, live, known, self.now):
            why = "no live TrainStack or record claims them after the orphan timeout"
            self.actions.append({"do": "terminate", "ids": ids, "why": why})
