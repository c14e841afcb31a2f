"""The run controller's long actions as Step Functions executions (Standard): their names, the
run's executions as they are, starting one, stopping some.

An execution's name is its idempotency key. Step Functions runs one execution per name: a start
with the name of a running execution and the same input returns it, and any other start with a
used name is refused with ExecutionAlreadyExists for 90 days after it closed
(https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html). The tick
(tick.py) starts each long action under the name of what it does, and watches it there:

    <run>-a<attempt>-<stack>     what the end of an attempt decided: a relaunch or a teardown
    <run>-cap-<stack>            the hard cap's delete
    <run>-idle-<stack>           the idle fleet's delete
    <run>-destroy-<stack>        following a delete the controller did not start (cdk destroy)

each followed by `-r<k>` when the tick resumes it for the k-th time (an execution that failed,
timed out or was stopped). <stack> is 8 hex digits of TrainStack's id, so a run name deployed
again in a new stack gets new names. Names are at most 80 characters of letters, digits, - and
_; a run name is at most 40 (stacks/config.py).
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import hashlib
import json
import re

from controller.clients import client, log, setting
from controller.snapshot import Execution

# How many times a failed long action is started again before the tick gives it up (and stops
# the run's billing, recording the controller's failure).
RESUMES = 2
LIVE, DONE = "RUNNING", "SUCCEEDED"


def digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]


def name(run: str, kind: str, stack_id: str, resume: int = 0) -> str:
    """The execution of `kind` (`a<attempt>`, `cap`, `idle`, `destroy`), resumed `resume` times."""
    return f"{run}-{kind}-{digest(stack_id)}" + (f"-r{resume}" if resume else "")


def attempt_kind(attempt: int) -> str:
    return f"a{attempt}"


def parse(run: str, stack_id: str, execution_name: str) -> tuple[str, int] | None:
    """(kind, resume) of one of this run's and stack's names; None for any other name."""
    shape = rf"{re.escape(run)}-(a\d+|cap|idle|destroy)-{digest(stack_id)}(?:-r(\d+))?"
    found = re.fullmatch(shape, execution_name)
    return (found.group(1), int(found.group(2) or 0)) if found else None


def arn_of(execution_name: str) -> str:
    machine = setting("STATE_MACHINE_ARN")
    return machine.replace(":stateMachine:", ":execution:", 1) + f":{execution_name}"


def of_run(run: str, stack_id: str) -> list[Execution]:
    """This run's executions in this stack, each {"name", "kind", "resume", "status", "arn",
    "started", "stopped"}, as Step Functions lists them (newest first)."""
    pages = (
        client("stepfunctions")
        .get_paginator("list_executions")
        .paginate(stateMachineArn=setting("STATE_MACHINE_ARN"))
    )
    found = []
    for execution in (e for p in pages for e in p["executions"]):
        parsed = parse(run, stack_id, execution["name"])
        if parsed is None:
            continue
        found.append(
            {
                "name": execution["name"],
                "kind": parsed[0],
                "resume": parsed[1],
                "status": execution["status"],
                "arn": execution["executionArn"],
                "started": execution.get("startDate"),
                "stopped": execution.get("stopDate"),
            }
        )
    return found


def start(execution_name: str, document: dict) -> str | None:
    """Start execution `execution_name` with `document`; None when it exists already (it
    handles, or handled, exactly this)."""
    sfn = client("stepfunctions")
    try:
        started = sfn.start_execution(
            stateMachineArn=setting("STATE_MACHINE_ARN"),
            name=execution_name,
            input=json.dumps(document, default=str),
        )
    except sfn.exceptions.ExecutionAlreadyExists:
        log("already-started", execution=execution_name)
        return None
    log("started", execution=execution_name, input=document)
    return started["executionArn"]


def stop(arns: list[str], why: str) -> None:
    for arn in arns:
        try:
            client("stepfunctions").stop_execution(
                executionArn=arn, error="Superseded", cause=why[:32768]
            )
        except client("stepfunctions").exceptions.ExecutionDoesNotExist:
            continue
    if arns:
        log("stopped-executions", executions=arns, why=why)
