"""`python -m rehearsal --drill [--market spot] [--experiment NAME ...]`: the drill (issue 49) offline, the same list
of experiments (contract/drill.py) that TrainStack synthesizes as AWS FIS experiment templates,
played on the rehearsal's namespaces and moto cloud.

1. The rehearsal's setup with the drill's dataset (contract/drill.py DATASET: its classes,
   images and shard counts) and a fleet of 3 nodes (minNodes 2), as `-c drill=true` deploys.
2. Each experiment of the plan becomes an FIS experiment template in moto's FIS
   (`fis_template`: its actions and parameters as TrainStack's, `{zone}` the fleet's zone), and
   node.json's `drill` names them (`document`), as TrainStack's node.json does.
3. The run trains under the run controller, as every rehearsal run does, and its head plays the
   experiments exactly as on AWS (bootstrap/head/drill.py: StartExperiment through moto's FIS,
   which keeps only the books, moto >= 5.2.3). The rehearsal's executor (`Executor`) watches
   moto's experiments and plays each one's actions when it starts, by its own model of each FIS
   action (rehearsal/drill_actions.py); an action it has no model of fails the drill before
   anything runs.
4. Once the head judged the last one, it asks the training to stop at the next epoch's end,
   and the run succeeds.

Prints the judge's table (contract/drill_judge.py, the one `horovod-fleet drill` prints): each
experiment with its FIS action ids, what was expected and observed, the measured times, pass or
FAIL; exit 0 only if every row passes. Needs root: each node a host of its own.
"""

from __future__ import annotations

import json
import threading
import time

import boto3

from contract import drill
from contract.drill_judge import DRILL, passed, table
from contract.names import HEAD_NODE, NODE_TAG, ROLE_TAG, TRAIN_ROLE
from rehearsal.cloud import FLEET_TAG, TICK_S, ZONE
from rehearsal.common import BUCKET, REGION, RUN, StepFailed, say
from rehearsal.drill_actions import (
    ControllerFaults,
    Players,
    Unplayable,
    wait_for_capacity_at_the_tick_s_scale,
)
from rehearsal.state_machine import clients

NODES = 3  # the drill's fleet (stacks/drill_plan.py DEFAULT_NODES), minNodes 2
# The trainer's epoch bound: the head's agreed stop ends the run long before it.
MAX_EPOCHS = 10_000
# TrainStack's heartbeat timeout (stacks/train/fleet.py HEARTBEAT_TIMEOUT_S), not the elastic
# rows' 20 s: the drill's S3 cut (60 s, FIS's shortest) must be ridden out here as on AWS. A
# node beats every poll_interval_s (1 s here, 10 s on AWS) and its S3 calls retry with up to
# 20 s of backoff (bootstrap/aws.py RetryPolicy), so its heartbeat is at most about 80 s old
# (100 s on AWS) when the cut ends; with 20 s the run controller, which the cut does not reach,
# found every node silent and relaunched the fleet (the s3-cut row's FAIL, 2026-11-29). The
# elastic rows' image size (epochs long enough for a replacement to join), the drill's batch
# (stacks/drill_plan.py), and a checkpoint every 60 s for the head's loss to come back to.
OVERRIDES = {
    "heartbeat_timeout_s": 120,
    "trainer": {"image_size": 64, "batch_per_gpu": 16, "checkpoint_every_s": 60},
}
FIS_ROLE = "arn:aws:iam::123456789012:role/horovod-fleet-drill-fis"
CONTROLLER_ROLE = "arn:aws:iam::123456789012:role/horovod-fleet-run-controller"
TEMPLATE_NAME = "horovod-fleet-drill-"  # + the experiment's name: the templates' Name tag
WATCH_S = 0.5  # how often the executor looks for a started experiment
# The one experiment CI plays (`--experiment`; docs/test-tiers.md): the whole drill is longer
# than CI's 40 minutes allow beside the rest, and this one is judged soonest.
CI_EXPERIMENT = "s3-cut"


def fis_target(kind: str, zone: str, stack_id: str = "<TrainStack>") -> dict:
    """A template's target of `kind` as TrainStack aims it (stacks/train/drill.py): the run's
    instances by its tags, running, one of them; the controller's role and the fleet's subnet
    by ARN."""
    resource_type = drill.TARGETS[kind][0]
    if kind in (drill.CONTROLLER_ROLE, drill.FLEET_SUBNET):
        arn = CONTROLLER_ROLE if kind == drill.CONTROLLER_ROLE else f"subnet-in-{zone}"
        return {"resourceType": resource_type, "resourceArns": [arn], "selectionMode": "ALL"}
    own = {NODE_TAG: HEAD_NODE} if kind == drill.HEAD else {ROLE_TAG: TRAIN_ROLE}
    return {
        "resourceType": resource_type,
        "resourceTags": {FLEET_TAG: stack_id, **own},
        "filters": [{"path": "State.Name", "values": ["running"]}],
        "selectionMode": "COUNT(1)",
    }


def fis_template(experiment: drill.Experiment, zone: str) -> dict:
    """create_experiment_template's arguments for the experiment: its actions with FIS's ids and
    parameters (`{zone}` the fleet's), each aimed at its target's kind."""
    kinds = sorted({a.target for a in experiment.actions})
    return {
        "description": f"horovod-fleet drill: {experiment.what}",
        "roleArn": FIS_ROLE,
        "stopConditions": [{"source": "none"}],
        "targets": {kind: fis_target(kind, zone) for kind in kinds},
        "actions": {
            action.name: {
                "actionId": action.action_id,
                "parameters": {k: zone if v == drill.ZONE else v for k, v in action.parameters},
                "targets": {drill.TARGETS[action.target][1]: action.target},
            }
            for action in experiment.actions
        },
        "experimentOptions": {"emptyTargetResolutionMode": "fail"},
        "tags": {"Name": f"{TEMPLATE_NAME}{experiment.name}"},
    }


def document(experiments: tuple[drill.Experiment, ...], template_ids: dict[str, str]) -> dict:
    """node.json's `drill`, as TrainStack writes it (stacks/drill_plan.py DrillPlan.document)."""
    return {
        "start_after_epoch": drill.START_AFTER_EPOCH,
        "max_epochs": MAX_EPOCHS,
        "experiments": [
            {"name": e.name, "template_id": template_ids[e.name],
             "action_ids": list(e.action_ids), "observe": list(e.observe),
             "within_s": e.within_s}
            for e in experiments
        ],
    }  # fmt: skip


class Executor(threading.Thread):
    """The rehearsal's FIS: it watches moto's experiments and, when one starts, plays each of
    its template's actions at once, as FIS starts an experiment's actions that wait for none."""

    def __init__(self, rehearsal, fis, players: Players) -> None:
        super().__init__(daemon=True, name="fis")
        self.rehearsal, self.fis, self.players = rehearsal, fis, players
        self.stopping = threading.Event()
        self.played: dict[str, str] = {}  # experiment id -> its template's Name
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stopping.wait(WATCH_S):
            try:
                self.watch()
            except Exception as exc:  # the drill fails on it, loudly
                self.errors.append(f"{type(exc).__name__}: {exc}")
                say(f"FIS (rehearsal): FAILED: {self.errors[-1]}")
                return

    def watch(self) -> None:
        for experiment in self.fis.list_experiments()["experiments"]:
            if experiment["id"] in self.played:
                continue
            template = self.fis.get_experiment_template(id=experiment["experimentTemplateId"])
            template = template["experimentTemplate"]
            name = template["tags"]["Name"].removeprefix(TEMPLATE_NAME)
            self.played[experiment["id"]] = name
            say(f"FIS (rehearsal): experiment {experiment['id']} of {name} started")
            for action_name, action in template["actions"].items():
                [kind] = action["targets"].values()
                if action["actionId"] in (drill.THROTTLE, drill.INSUFFICIENT_CAPACITY):
                    self.on_the_controller()
                done = self.players.play(action["actionId"], kind, action.get("parameters") or {})
                say(f"FAULT (FIS {action['actionId']}, {name}/{action_name}): {done}")

    def on_the_controller(self) -> None:
        """The controller's errors on the EC2 client its tick and its steps use, and its
        capacity waits at the rehearsal's minute."""
        cloud = self.rehearsal.cloud
        if self.players.faults is None:
            self.players.faults = ControllerFaults(cloud.ec2)
        self.players.faults.hook(clients.client("ec2"))
        cloud.workflow.on_wait = wait_for_capacity_at_the_tick_s_scale(TICK_S, self.stopping)

    def stop(self) -> None:
        self.stopping.set()


def markdown_table(experiments: tuple[drill.Experiment, ...] = drill.EXPERIMENTS) -> str:
    """docs/rehearsal.md's table of the drill's experiments, beside the fault rows."""
    lines = [
        "| experiment | FIS actions | what is done | expected | observed codes | within | in CI |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in experiments:
        market = " (Spot fleets only: `--market spot`)" if e.market else ""
        ci = "yes" if e.name == CI_EXPERIMENT else ""
        lines.append(
            f"| {e.name}{market} | {', '.join(f'`{a}`' for a in e.action_ids)} | {e.what} | "
            f"{e.expect} | {', '.join(f'`{c}`' for c in e.observe)} | {e.within_s / 60:g} min "
            f"| {ci} |"
        )
    return "\n".join(lines) + "\n"


def fis_client(rehearsal):
    """moto's FIS behind the local endpoint, as the rehearsal itself (not judged)."""
    return boto3.client(
        "fis",
        endpoint_url=rehearsal.endpoint,
        region_name=REGION,
        aws_access_key_id="rehearsal",
        aws_secret_access_key="rehearsal",
    )


def create_templates(fis, experiments: tuple[drill.Experiment, ...]) -> dict[str, str]:
    """One FIS experiment template per experiment in moto's FIS: {name: template id}."""
    ids = {}
    for experiment in experiments:
        made = fis.create_experiment_template(clientToken=experiment.name,
                                              **fis_template(experiment, ZONE))  # fmt: skip
        ids[experiment.name] = made["experimentTemplate"]["id"]
    return ids


def drill_records(rehearsal) -> dict[str, dict]:
    """runs/<run>/drill/<experiment>.json, by experiment."""
    listing = rehearsal.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{RUN}/{DRILL}")
    found = {}
    for entry in listing.get("Contents", []):
        body = rehearsal.s3.get_object(Bucket=BUCKET, Key=entry["Key"])["Body"].read()
        record = json.loads(body)
        found[record["experiment"]] = record
    return found


def run_drill(rehearsal) -> int:
    """The drill's steps and its table; 0 only if every experiment passed."""
    args = rehearsal.args
    try:
        experiments = drill.plan(args.market, tuple(args.experiment or ()))
    except drill.UnknownExperiment as exc:
        say(f"drill: --experiment: {exc}")
        return 2
    if not experiments:
        say(f"drill: --experiment: none of {', '.join(args.experiment)} is played on {args.market}")
        return 2
    players = Players(rehearsal, ZONE)
    try:
        for experiment in experiments:  # one it cannot play fails before anything runs
            for action in experiment.actions:
                players.check(action)
    except Unplayable as exc:
        say(f"drill: FAILED: {exc}")
        return 1
    args.nodes = rehearsal.fleet_size = NODES
    data = drill.DATASET
    args.classes, args.per_class, args.val_images = (
        data.classes,
        data.train_per_class,
        data.val_images,
    )
    rehearsal.shards = (data.train_shards, data.val_shards)
    rehearsal.status_screens = False  # an epoch every few seconds: the drill's lines instead
    # Every experiment taking its whole bound, and the start-up.
    args.timeout = max(args.timeout, sum(e.within_s for e in experiments) + 1200)
    started, executor, failure = time.time(), None, None
    try:
        for step, action in (("local S3 endpoint", lambda: rehearsal.start_s3(sample=True)),
                             ("sample dataset", rehearsal.make_sample),
                             ("preprocessing node", rehearsal.preprocess)):  # fmt: skip
            rehearsal.step = step
            say(f"--- {step}")
            action()
        if rehearsal.fleet is None:
            raise StepFailed("the drill needs the namespaces (root): a host per node")
        rehearsal.step = "drill"
        fis = fis_client(rehearsal)
        ids = create_templates(fis, experiments)
        planned = [f"{e.name} [{', '.join(e.action_ids)}]" for e in experiments]
        say(f"--- drill: {'; '.join(planned)}")
        executor = Executor(rehearsal, fis, players)
        executor.start()
        overrides = {**OVERRIDES, "drill": document(experiments, ids), "market": args.market}
        rehearsal.train_under_controller(MAX_EPOCHS, args.max_restarts, **overrides)
        rehearsal.check_no_refusals()
    except (StepFailed, RuntimeError, OSError) as exc:
        failure = f"FAILED at step '{rehearsal.step}': {exc}{rehearsal.refused()}"
    finally:
        if executor is not None:
            executor.stop()
        records = drill_records(rehearsal) if hasattr(rehearsal, "s3") else {}
        done = rehearsal.done_json()
        rehearsal.keep_s3()
        rehearsal.close()
    return verdict(experiments, records, done, executor, failure, time.time() - started)


def verdict(experiments, records, done, executor, failure, seconds: float) -> int:
    print(table(experiments, records), flush=True)
    problems = [failure] if failure else []
    problems += [f"the rehearsal's FIS: {e}" for e in executor.errors] if executor else []
    if done is None or done.get("status") != "succeeded":
        problems.append(
            f"the run did not succeed: {json.dumps(done)[:500] if done else 'no DONE.json'}"
        )
    else:
        say(
            f"the run: {done['status']} after {done.get('epochs')} epochs, attempt "
            f"{done.get('attempt')}, {len(done.get('resets') or [])} reset(s) in its last attempt"
        )
    if not passed(experiments, records):
        failed = [
            e.name for e in experiments if (records.get(e.name) or {}).get("verdict") != "pass"
        ]
        problems.append(f"not passed: {', '.join(failed)}")
    ok = not problems
    say(
        f"drill rehearsal: {sum((records.get(e.name) or {}).get('verdict') == 'pass' for e in experiments)} "
        f"of {len(experiments)} experiments passed in {seconds:.0f} s"
        + ("" if ok else f"; {'; '.join(problems)}")
    )
    return 0 if ok else 1
