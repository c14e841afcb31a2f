"""How `horovod-fleet drill` ends: it destroys what it deployed that bills by the hour, whatever
happened before (a failed deploy, Ctrl-C, a run that never finished), then reads the account to
say plainly whether anything still does.

- What bills by the hour: TrainStack (the fleet, the head, FIS's templates) and PreprocessStack
  (the converter's node and its sc1 volume, which bills by the GiB-hour until the stack is
  deleted; its data volume then becomes a snapshot, docs/stacks.md). Each is destroyed with the
  pinned CDK CLI, `npx cdk destroy STACK --force --exclusively`: --force asks no confirmation,
  --exclusively destroys the stack alone ("Only destroy requested stacks and don't include
  dependencies", https://docs.aws.amazon.com/cdk/v2/guide/ref-cli-cmd-destroy.html; without it
  the CLI adds the stacks that depend on the named one, aws/aws-cdk-cli
  packages/aws-cdk/lib/cli/cdk-toolkit.ts `selectStacksForDestroy`, ExtendedStackSelection.Downstream).
  A stack that does not exist is left alone by the CLI (`destroyStack` returns when the stack
  does not exist, and throws "Failed to destroy" when its delete ends in another state than
  DELETE_COMPLETE: aws/aws-cdk-cli packages/@aws-cdk/toolkit-lib/lib/api/deployments/deploy-stack.ts).
  The stack's state is then read back: a deleted stack is no longer in DescribeStacks ("Deleted
  stacks don't show up in the DescribeStacks operation if the deletion has been completed
  successfully", https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_DeleteStack.html).
  A stack with an operation under way (its delete, or a deploy that Ctrl-C stopped in the CLI
  and not in CloudFormation) is waited for, within SETTLE_S; one still there is destroyed once
  more. What is left is named, with the command that finishes.
- Kept, as a real run needs them: DatasetStack (the bucket, kept forever), TeardownStack (the
  run controller, cents a month; it deletes TrainStack at its hard cap whatever happens here)
  and ImageStack (the training image the real run boots).
- Ctrl-C during the teardown does not stop it: the first says so, the second stops it and says
  what is left and the command that finishes it. The CDK CLI runs in a session of its own, so
  the terminal's Ctrl-C reaches this process only (watch/drill.py `Processes`).
- Then `horovod-fleet leftovers`' reading of the account (watch/leftovers.py) and the fleet's
  and the project's instances still pending or running (an instance the run controller
  launched is not CloudFormation's).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from contract.names import FLEET_TAG, NODE_TAG
from watch.aws import explain
from watch.leftovers import Account, report

# Destroyed in this order (the fleet first: it bills the most).
BILLS_BY_THE_HOUR = ("TrainStack", "PreprocessStack")
KEPT = {
    "DatasetStack": "the bucket, kept forever",
    "TeardownStack": "the run controller, cents a month",
    "ImageStack": "the training image the real run boots",
}
SETTLE_S = 3600  # the longest wait for a create or update under way to end before a delete
POLL_S = 30
# Instances that bill by the hour: EC2's states before `terminated` and `stopped`.
BILLING_STATES = ("pending", "running", "stopping", "shutting-down")
# Every fleet instance carries the first (docs/contracts.md), every resource of the app the
# second (stacks/composition.py).
INSTANCE_FILTERS = (
    [{"Name": "tag-key", "Values": [FLEET_TAG]}],
    [{"Name": "tag:Project", "Values": ["horovod-fleet"]}],
)


def stack_status(cloudformation, name: str) -> str | None:
    """The stack's status; None when CloudFormation has no such stack (or it is deleted)."""
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise
    status = stacks[0]["StackStatus"] if stacks else None
    return None if status == "DELETE_COMPLETE" else status


@contextlib.contextmanager
def ctrl_c_once_more(say: Callable[[str], None], stop_line: str) -> Iterator[None]:
    """While the teardown runs, a first Ctrl-C is answered, and only a second one raises
    KeyboardInterrupt. Outside the main thread (where signals cannot be handled) nothing
    changes."""
    presses = 0

    def on_sigint(signum, frame) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            say(f"Ctrl-C: the teardown goes on; Ctrl-C again stops it ({stop_line})")
            return
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class Teardown:
    """Destroys `stacks` with `cdk` (argv after `npx cdk`, returns its exit status) and the
    drill's context `flags`; `left` is what is still deployed after `run`."""

    cdk: Callable[[list[str]], int]
    cloudformation: object
    flags: list[str]
    say: Callable[[str], None]
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    where: str  # the checkout the command runs in, for the command that finishes by hand
    left: dict[str, str | None] = field(default_factory=dict)  # stack -> its status

    def command(self, stacks: list[str]) -> str:
        return f"npx cdk destroy {' '.join(stacks)} --force --exclusively {' '.join(self.flags)}"

    def run(self, stacks: list[str]) -> dict[str, str | None]:
        todo = [s for s in BILLS_BY_THE_HOUR if s in stacks]
        stop_line = "what is left is named, with the command that finishes"
        try:
            with ctrl_c_once_more(self.say, stop_line):
                while todo:
                    try:
                        status = self.destroy(todo[0])
                    except Exception as exc:  # the account could not be read: said, and on
                        status = f"not known to be deleted: {explain(exc)}"
                        self.say(f"{todo[0]} {status}")
                    if status is not None:
                        self.left[todo[0]] = status
                    todo.pop(0)
        except KeyboardInterrupt:
            for stack in todo:
                self.left[stack] = self.status_or_unknown(stack)
            self.say(f"teardown stopped by Ctrl-C: still deployed: {self.left_line()}")
        if self.left:
            self.say(
                f"finish the teardown in {self.where} with: {self.command(list(self.left))}; "
                "then horovod-fleet leftovers (the run controller deletes TrainStack at its hard "
                "cap whatever happens)"
            )
        return self.left

    def status_or_unknown(self, stack: str) -> str | None:
        try:
            return stack_status(self.cloudformation, stack)
        except Exception:  # the account cannot be read now: said rather than guessed
            return "state unknown"

    def left_line(self) -> str:
        return ", ".join(f"{s} ({status or 'deleted'})" for s, status in self.left.items())

    def destroy(self, stack: str) -> str | None:
        """`cdk destroy` the stack and wait for what it started, or for a deploy under way, to
        end; once more if the stack is still there. Its status after (None: deleted)."""
        for attempt in (1, 2):
            self.say(f"destroying {stack}: npx cdk destroy {stack} --force --exclusively")
            code = self.cdk(["destroy", stack, "--force", "--exclusively", *self.flags])
            status = self.settle(stack)
            if status is None:
                self.say(f"{stack} is deleted")
                return None
            self.say(f"{stack} is {status} after `npx cdk destroy` (exit status {code})"
                     + ("; destroying it again" if attempt == 1 else ""))  # fmt: skip
        return status

    def settle(self, stack: str) -> str | None:
        """The stack's status once no operation is under way on it (SETTLE_S at most)."""
        until = self.clock() + SETTLE_S
        status = stack_status(self.cloudformation, stack)
        while status and status.endswith("_IN_PROGRESS") and self.clock() < until:
            self.sleep(POLL_S)
            status = stack_status(self.cloudformation, stack)
        return status


def billing_instances(ec2) -> list[str]:
    """The app's instances that bill by the hour: 'i-0abc (running, TrainStack's head)'."""
    found: dict[str, str] = {}
    for filters in INSTANCE_FILTERS:
        states = {"Name": "instance-state-name", "Values": list(BILLING_STATES)}
        pages = ec2.get_paginator("describe_instances").paginate(Filters=[*filters, states])
        for page in pages:
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                    node = tags.get(NODE_TAG)
                    what = f", node {node}" if node else ""
                    found[instance["InstanceId"]] = (
                        f"{instance['InstanceId']} ({instance['State']['Name']}{what})"
                    )
    return [found[i] for i in sorted(found)]


def account_check(client, bucket: str, region: str) -> tuple[str, list[str]]:
    """`horovod-fleet leftovers`' screen for the account, and what still bills by the hour
    (stacks and instances, [] when nothing does)."""
    account = Account(client, bucket)
    rows = account.leftovers()
    deployed = account.deployed_stacks()
    hourly = [f"{s} is deployed" for s in BILLS_BY_THE_HOUR if s in deployed]
    hourly += [f"instance {i}" for i in billing_instances(client("ec2"))]
    kept = [s for s in KEPT if s in deployed]
    if kept:
        account.notes.append(
            "kept deployed for the real run: " + "; ".join(f"{s} ({KEPT[s]})" for s in kept)
        )
    return report(rows, account.notes, f"{region}, bucket {account.bucket}"), hourly
