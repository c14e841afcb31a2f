"""The run controller's executions (AWS Step Functions, Standard): their names, which of a run
are live, starting one, stopping the others.

An execution's name is its idempotency key. Step Functions runs one execution per name: a start
with the name of a running execution and the same input returns it, and any other start with a
used name is refused with ExecutionAlreadyExists for 90 days after it closed
(https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html). So
every name says what it handles:

    <run>-a<attempt>-<stack>             the end of an attempt, once its DONE.json is there
    <run>-a<attempt>-ec2-<stack+event>   one EC2 event about a node during that attempt: it
                                         waits for the leader's DONE.json, writes the
                                         attempt's own when none comes, and starts the above
    <run>-a<attempt>-idle-<stack+alarm>  one ALARM of the idle alarm during that attempt
    <run>-cap-<stack>                    the hard cap
    <run>-destroy-<stack>                following `cdk destroy`

where <stack> is 8 hex digits of TrainStack's id, so a run name deployed again in a new stack
gets new names. Only an execution that records its attempt takes the attempt's own name: a
trigger that turns out to need nothing never uses up the name of the attempt's end. Names are at
most 80 characters of letters, digits, - and _; a run name is at
most 40 (stacks/config.py).
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import hashlib
import json
import re

from clients import client, log, setting


def digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]


def attempt_name(run: str, attempt: int, stack_id: str) -> str:
    return f"{run}-a{attempt}-{digest(stack_id)}"


def ec2_name(run: str, attempt: int, stack_id: str, instance: str, what: str) -> str:
    return f"{run}-a{attempt}-ec2-{digest(stack_id, instance, what)}"


def idle_name(run: str, attempt: int, stack_id: str, alarm_time: str) -> str:
    return f"{run}-a{attempt}-idle-{digest(stack_id, alarm_time)}"


def cap_name(run: str, stack_id: str) -> str:
    return f"{run}-cap-{digest(stack_id)}"


def destroy_name(run: str, stack_id: str) -> str:
    return f"{run}-destroy-{digest(stack_id)}"


def of_attempt(run: str, name: str) -> bool:
    return re.fullmatch(rf"{re.escape(run)}-a\d+-[0-9a-f]{{8}}", name) is not None


def of_run(run: str, name: str) -> bool:
    shapes = r"a\d+-(?:ec2-|idle-)?[0-9a-f]{8}|cap-[0-9a-f]{8}|destroy-[0-9a-f]{8}"
    return re.fullmatch(rf"{re.escape(run)}-(?:{shapes})", name) is not None


def live(run: str, attempts_only: bool = False) -> list[dict]:
    """The run's running executions ({"name", "executionArn"}); only the attempts' with
    `attempts_only`."""
    pages = (
        client("stepfunctions")
        .get_paginator("list_executions")
        .paginate(stateMachineArn=setting("STATE_MACHINE_ARN"), statusFilter="RUNNING")
    )
    wanted = of_attempt if attempts_only else of_run
    return [e for p in pages for e in p["executions"] if wanted(run, e["name"])]


def start(name: str, document: dict) -> str | None:
    """Start execution `name` with `document`; None when it exists already (it handles, or
    handled, exactly this)."""
    sfn = client("stepfunctions")
    try:
        started = sfn.start_execution(
            stateMachineArn=setting("STATE_MACHINE_ARN"), name=name, input=json.dumps(document)
        )
    except sfn.exceptions.ExecutionAlreadyExists:
        log("already-handled", execution=name)
        return None
    log("started", execution=name, input=document)
    return started["executionArn"]


def stop_others(run: str, own_arn: str, why: str) -> list[str]:
    """Stop the run's other running executions; their names."""
    others = [e for e in live(run) if e["executionArn"] != own_arn]
    for execution in others:
        client("stepfunctions").stop_execution(
            executionArn=execution["executionArn"], error="Superseded", cause=why[:32768]
        )
    if others:
        log("stopped-executions", run=run, executions=[e["name"] for e in others], why=why)
    return [e["name"] for e in others]
