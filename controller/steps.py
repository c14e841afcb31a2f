"""What the run controller's states share (stacks/teardown/workflow.py), and StopBilling, where
every failure of an execution ends.

Each handler takes the execution's state (the tick's input plus what earlier states put under
their result paths) and returns its own result; the workflow chooses the next state on it. Every
handler is idempotent: a retried state does what it did once.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime
import json
import math

from contract.runs import stamp
from controller import ec2_fleet, records, train_stack
from controller.clients import client, log, now, setting, step

# How long a state waits before it looks again at what it waits for.
RECHECK = datetime.timedelta(minutes=10)


def seconds(delta: datetime.timedelta) -> int:
    """A Wait state's SecondsPath takes a whole number of seconds, 0 or more."""
    return max(math.ceil(delta.total_seconds()), 0)


def wait(delta: datetime.timedelta, **fields) -> dict:
    return {"next": "wait", "wait_s": seconds(delta), **fields}


def tell(event: dict, state: str, **fields) -> None:
    """controller.json names the execution that handles the run now, and its state."""
    records.update_controller(
        client("s3"),
        setting("BUCKET"),
        event["run"],
        at=stamp(now()),
        execution=event["execution"]["arn"],
        controller_state=state,
        **fields,
    )


def fleet_stack(event: dict) -> dict | None:
    """TrainStack as the tick saw it, by id: a stack deployed anew under the name is not this
    execution's."""
    return train_stack.describe(event["stack_id"])


@step
def stop_billing(event: dict) -> dict:
    """Where every failure of the workflow ends (its Catch): the run's nodes stop billing, and
    attempts.json and controller.json say that the controller failed, where and why. The
    execution fails next, its alarm mails, and the tick resumes the action under a new name, a
    few times, before it gives the run up (tick.py)."""
    run = event["run"]
    error = event.get("error") or {}
    try:
        cause = json.loads(error.get("Cause") or "{}").get("errorMessage") or error.get("Cause")
    except ValueError:
        cause = error.get("Cause")
    stack = train_stack.describe(event["stack_id"])
    stopped = {"stopped": [], "terminated": []}
    if not train_stack.gone(stack) and stack["run"] == run:
        stopped = ec2_fleet.stop_billing(ec2_fleet.nodes(stack["id"]))
    arn = event["execution"]["arn"]
    failure = {
        "execution": arn,
        "stack_id": event["stack_id"],
        "error": error.get("Error"),
        "cause": (cause or "")[:1000],
        "at": stamp(now()),
        **stopped,
    }
    records.record_failure(client("s3"), setting("BUCKET"), run, failure)
    tell(
        event,
        "Failed",
        reason=f"the run controller failed ({failure['error']}: {failure['cause'][:200]}); the "
        "fleet's nodes were stopped; see the execution in the Step Functions console",
    )
    log("controller-failed", run=run, **failure)
    return failure
