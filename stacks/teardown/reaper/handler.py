"""The horovod-fleet reaper: stops billing when a run is finished, capped or idle.

Triggers (see stacks/teardown/): EventBridge S3 "Object Created" for runs/<run>/DONE.json and
<datasetPrefix>manifest.json, the hard-cap schedule, the idle alarm's Lambda action, its own
re-check schedules, and CloudFormation's custom-resource request for the hard-cap deadline.

It deletes only TrainStack and only when the deployed run is the event's run. On "done" it
requires the run's checkpoints and logs in S3 and otherwise schedules a re-check. On "idle" it
needs nothing more in S3 (checkpoints are synced as they are written, logs are in CloudWatch
Logs) but waits until the fleet has been quiet for the idle window since its last progress (the
alarm's onset or its newest checkpoint) and has had the launch grace since it was created. The
hard cap deletes whatever is there. A run it cannot judge yet (TrainStack still being created or
updated, an alarm with a checkpoint after its onset) gets a re-check, never a silent drop: alarm
actions fire only on a change of state. After a delete it follows the stack until it is gone, as
every trigger fires once and a delete that ends in DELETE_FAILED would otherwise bill until
someone looks. Each action is idempotent and every decision is one JSON line in the log. Only
boto3 and the standard library: this file is the Lambda asset.
"""

import datetime
import hashlib
import json
import os
import re
import urllib.request
from collections.abc import Callable, Mapping

import boto3
import controller
import zone_move
from botocore.exceptions import ClientError, WaiterError

PINNED_TYPE = "Custom::HorovodFleetPinned"
DATASET_TYPE = "Custom::HorovodFleetDataset"
ZONE_TYPE = "Custom::HorovodFleetZone"
REPLACEMENTS_TYPE = "Custom::HorovodFleetReplacements"
# TrainStack's output naming the run's notification topic (-c notifyEmail), when there is one.
NOTIFY_OUTPUT_KEY = "NotifyTopic"
# TrainStack's outputs that bound the run controller's relaunches.
MAX_RESTARTS_OUTPUT_KEY = "HorovodFleetMaxRestarts"
DEADLINE_OUTPUT_KEY = "HorovodFleetDeadline"
# ... and launch templates that launch each node whole, in node order (stacks/train/fleet.py).
REPLACEMENTS_OUTPUT_KEY = "HorovodFleetReplacementTemplates"
# Tags on every fleet instance, the first and the replacements: its stack's id, its node index.
FLEET_TAG = "horovod-fleet:stack"
NODE_TAG = "horovod-fleet:node"
ABSENT_KEY_CODES = controller.ABSENT_KEY_CODES
# StartInstances' and RunInstances' answers when the zone has no capacity (or Spot, no capacity
# at the price or quota) for the type now: try again later.
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
NO_CAPACITY_CODES = (
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
)
# The instance states a node can come back from; "shutting-down" is on its way to terminated.
LIVE_STATES = ("pending", "running", "stopping", "stopped")
# How long the Replacements resource's Delete waits for the replacements to terminate, within
# its answer timeout (stacks/teardown/reaper_answers.py, 5 minutes).
TERMINATE_WAIT_S = 200
TRAIN_STACK = "TrainStack"  # the only stack the reaper may ever delete (contracts.md names it)
DONE_KEY = re.compile(r"^runs/(?P<run>[^/]+)/DONE\.json$")
ZONE_ID = re.compile(r"[a-z]+\d+-az\d+")  # use1-az4; stacks/config.py validates it
REASONS = ("done", "idle", "hard-cap", "deleting", "relaunch")  # what a re-check re-checks
# ROLLBACK_COMPLETE is a create that failed and was rolled back: nothing of it bills.
GONE_STATES = {"DELETE_IN_PROGRESS", "DELETE_COMPLETE", "ROLLBACK_COMPLETE"}
# The statuses in which the stack itself finished a deployment: the fleet's launch.
DEPLOYED_STATES = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE")
FOLLOW_DELETE_FOR = datetime.timedelta(hours=3)  # how long a delete is followed and retried
# Scheduler's limits: 185 retries, a day of event age.
RECHECK_RETRIES = 185
RECHECK_MAX_AGE_S = 86400
# A hard-cap deadline pushed into the past by an update still needs a time Scheduler accepts.
MIN_DEADLINE_LEAD = datetime.timedelta(minutes=5)


class RefusedStack(Exception):
    """Raised instead of deleting a stack that is not this app's TrainStack."""


class ZoneRefused(Exception):
    """A zone of a move that cannot take the fleet: its subnet or group could not be made."""


# Answers that mean "try the same call again soon"; botocore has retried them already.
TRANSIENT_CODES = ("RequestLimitExceeded", "InternalError", "ServiceUnavailable", "Unavailable")


def transient(error: Exception) -> bool:
    return isinstance(error, ClientError) and error_code(error) in TRANSIENT_CODES


def error_code(error: Exception) -> str:
    if isinstance(error, ZoneRefused):
        error = error.__cause__ or error
    if isinstance(error, ClientError):
        return error.response["Error"].get("Code", "")
    return type(error).__name__


def error_message(error: ClientError) -> str:
    return error.response["Error"].get("Message", "")[:300]


def log(decision: str, **fields) -> None:
    """One JSON line per decision, so CloudWatch Logs Insights can filter on `decision`."""
    print(json.dumps({"decision": decision, **fields}, sort_keys=True, default=str))


def busy(status: str) -> bool:
    """A create, update or rollback under way: DeleteStack would fail, the outputs may be absent."""
    return status.endswith("_IN_PROGRESS") and status != "DELETE_IN_PROGRESS"


def parse_event(event: Mapping, manifest_key: str = "tfrecords/manifest.json") -> dict:
    """Normalise every trigger's event into {"trigger": ..., ...}; unknown shapes -> "ignored"."""
    if "RequestType" in event and "ResponseURL" in event:
        if event.get("ResourceType") == PINNED_TYPE:
            return {"trigger": "pinned"}
        if event.get("ResourceType") == DATASET_TYPE:
            return {"trigger": "dataset"}
        if event.get("ResourceType") == ZONE_TYPE:
            return {"trigger": "zone"}
        if event.get("ResourceType") == REPLACEMENTS_TYPE:
            return {"trigger": "replacements"}
        return {"trigger": "deadline"}
    if event.get("source") == "aws.s3" and event.get("detail-type") == "Object Created":
        detail = event.get("detail", {})
        key = detail.get("object", {}).get("key", "")
        etag = detail.get("object", {}).get("etag") or detail.get("object", {}).get("sequencer")
        if match := DONE_KEY.match(key):
            return {"trigger": "done", "run": match["run"], "key": key}
        if key == manifest_key:
            return {"trigger": "manifest", "key": key, "etag": etag or "unknown"}
        return {"trigger": "ignored", "key": key}
    if event.get("source") == "aws.cloudwatch" and "alarmData" in event:
        alarm = event["alarmData"]
        metrics = alarm.get("configuration", {}).get("metrics") or [{}]
        dimensions = metrics[0].get("metricStat", {}).get("metric", {}).get("dimensions", {})
        # The alarm's state is asked live in retire_fleet: this action may have waited in a queue.
        if run := dimensions.get("Run"):
            return {"trigger": "idle", "run": run}
        return {"trigger": "ignored", "alarm": alarm.get("alarmName")}
    if event.get("trigger") == "hard-cap" and event.get("run"):
        return {"trigger": "hard-cap", "run": event["run"]}
    if event.get("trigger") == "recheck" and event.get("run") and event.get("reason") in REASONS:
        parsed = {"trigger": "recheck", "reason": event["reason"], "run": event["run"]}
        if event["reason"] == "relaunch":
            zones = event.get("zones")
            return {
                **parsed,
                "check": event["check"] if isinstance(event.get("check"), int) else 1,
                "attempt": event["attempt"] if isinstance(event.get("attempt"), int) else None,
                "zones": zones
                if isinstance(zones, list) and all(isinstance(z, str) for z in zones)
                else [],
            }
        if event["reason"] != "deleting":
            return parsed
        if event.get("stack_id") and isinstance(event.get("check"), int):
            return {**parsed, "stack_id": event["stack_id"], "check": event["check"]}
    return {"trigger": "ignored"}


def deadline(start: datetime.datetime, max_hours: float, now: datetime.datetime) -> dict:
    """The hard-cap time for a fleet deployed at `start`, as a Scheduler `at()` expression."""
    if not max_hours > 0:
        raise ValueError(f"MaxHours must be positive, got {max_hours!r}")
    at = max(start + datetime.timedelta(hours=max_hours), now + MIN_DEADLINE_LEAD)
    at = at.astimezone(datetime.timezone.utc).replace(microsecond=0, tzinfo=None)
    return {"ScheduleExpression": f"at({at.isoformat()})", "Deadline": f"{at.isoformat()}Z"}


def recheck_time(
    now: datetime.datetime, minutes: int, due: datetime.datetime | None = None
) -> datetime.datetime:
    """Next re-check: aligned to `minutes` so triggers in one window share one schedule name, or
    at `due` (to the next whole minute, at least a minute ahead, as Scheduler needs a future
    time) when a decision is due at a known moment."""
    if due is not None:
        soonest = max(due, now + datetime.timedelta(minutes=1))
        whole = soonest.replace(second=0, microsecond=0)
        return whole if whole == soonest else whole + datetime.timedelta(minutes=1)
    step = minutes * 60
    slot = int(now.timestamp()) // step + 2
    return datetime.datetime.fromtimestamp(slot * step, datetime.timezone.utc)


class Reaper:
    """The decisions, with AWS clients and the clock injected so tests run against moto."""

    def __init__(
        self,
        env: Mapping[str, str],
        function_arn: str,
        session: boto3.session.Session | None = None,
        now: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        session = session or boto3.session.Session()
        self.bucket = env["BUCKET"]
        self.run_output_key = env["RUN_OUTPUT_KEY"]
        self.preprocess_parameter = env["PREPROCESS_PARAMETER"]
        self.idle_alarm_prefix = env["IDLE_ALARM_PREFIX"]
        self.recheck_prefix = env["RECHECK_PREFIX"]
        self.recheck_minutes = int(env["RECHECK_MINUTES"])
        self.recheck_role_arn = env["RECHECK_ROLE_ARN"]
        self.dead_letter_arn = env["DEAD_LETTER_ARN"]
        self.manifest_key = env["MANIFEST_KEY"]
        self.idle_window = datetime.timedelta(minutes=int(env["IDLE_MINUTES"]))
        self.launch_grace = datetime.timedelta(minutes=int(env["LAUNCH_GRACE_MINUTES"]))
        self.function_arn = function_arn
        self.now = now or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self.cloudformation = session.client("cloudformation")
        self.s3 = session.client("s3")
        self.ec2 = session.client("ec2")
        self.ssm = session.client("ssm")
        self.cloudwatch = session.client("cloudwatch")
        self.scheduler = session.client("scheduler")
        self.sns = session.client("sns")

    def handle(self, event: Mapping) -> dict:
        """Dispatch one event; returns the parsed trigger (for the log and tests)."""
        parsed = parse_event(event, self.manifest_key)
        trigger = parsed["trigger"]
        if trigger == "deadline":
            self.answer_deadline(event)
        elif trigger == "pinned":
            self.answer_pinned(event)
        elif trigger == "dataset":
            self.answer_dataset(event)
        elif trigger == "zone":
            self.answer_zone(event)
        elif trigger == "replacements":
            self.answer_replacements(event)
        elif trigger == "done" or (trigger == "recheck" and parsed["reason"] == "done"):
            self.end_attempt(parsed["run"])
        elif trigger in ("idle", "hard-cap"):
            self.retire_fleet(parsed["run"], trigger)
        elif trigger == "recheck" and parsed["reason"] == "deleting":
            self.follow_delete(parsed["run"], parsed["stack_id"], parsed["check"])
        elif trigger == "recheck" and parsed["reason"] == "relaunch":
            self.continue_relaunch(
                parsed["run"], parsed["check"], parsed["zones"], parsed["attempt"]
            )
        elif trigger == "recheck":
            self.retire_fleet(parsed["run"], parsed["reason"])
        elif trigger == "manifest":
            self.stop_preprocessing(parsed["etag"])
        else:
            log("ignored", event=parsed)
        return parsed

    # --- TrainStack ---------------------------------------------------------------------------

    def train_stack(self, name_or_id: str = TRAIN_STACK) -> dict | None:
        """TrainStack's id, status, status reason and run ("" while its outputs are not there,
        as during its creation); None when there is no such stack."""
        try:
            stacks = self.cloudformation.describe_stacks(StackName=name_or_id)["Stacks"]
        except ClientError as error:
            if "does not exist" in error.response["Error"].get("Message", ""):
                return None
            raise
        stack = stacks[0]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        deadline = outputs.get(DEADLINE_OUTPUT_KEY)
        return {
            "id": stack["StackId"],
            "status": stack["StackStatus"],
            "status_reason": stack.get("StackStatusReason", ""),
            "run": outputs.get(self.run_output_key, ""),
            "notify_topic": outputs.get(NOTIFY_OUTPUT_KEY, ""),
            # A stack without them (deployed before the controller) is never relaunched.
            "max_restarts": int(outputs.get(MAX_RESTARTS_OUTPUT_KEY) or 0),
            "deadline": controller.parse_stamp(deadline) if deadline else None,
            # Empty for a stack deployed before nodes had them: it is never replaced.
            "replacement_templates": [
                t for t in outputs.get(REPLACEMENTS_OUTPUT_KEY, "").split(",") if t
            ],
            # None for a fleet that never moves: a given subnet, a capacity reservation.
            "zone_plan": zone_move.parse_plan(outputs.get(zone_move.MOVE_OUTPUT_KEY, "")),
        }

    def results(self, run: str) -> tuple[list[str], datetime.datetime | None]:
        """What of the run's results (contracts.md) is missing, and the newest checkpoint's time.

        A run whose DONE.json reports failure, or an interruption (its node was shut down and
        flushed what it had), may have ended before its first checkpoint, and a benchmark
        (DONE.json `benchmark` set) never writes one: their logs are all there is to keep, so
        waiting for a checkpoint would bill until the cap.
        """
        newest = self.newest_checkpoint(run)
        logs = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"runs/{run}/logs/", MaxKeys=1)
        done = self.done_document(run)
        need_checkpoint = (
            newest is None
            and done.get("status") not in ("failed", "interrupted")
            and not done.get("benchmark")
        )
        missing = [f"runs/{run}/model/checkpoints/*.index"] if need_checkpoint else []
        missing += [] if logs.get("KeyCount") else [f"runs/{run}/logs/"]
        return missing, newest

    def newest_checkpoint(self, run: str) -> datetime.datetime | None:
        """When the newest checkpoint of the run reached S3 (its .index is written last)."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"runs/{run}/model/checkpoints/"
        )
        indexes = [o for p in pages for o in p.get("Contents", []) if o["Key"].endswith(".index")]
        return max((o["LastModified"] for o in indexes), default=None)

    def deployed_at(self, stack_id: str) -> datetime.datetime:
        """When the stack last finished a create or update: every node was up with its data."""
        pages = self.cloudformation.get_paginator("describe_stack_events").paginate(
            StackName=stack_id
        )
        finished = [
            event["Timestamp"]
            for page in pages
            for event in page["StackEvents"]
            if event["LogicalResourceId"] == TRAIN_STACK
            and event["ResourceStatus"] in DEPLOYED_STATES
        ]
        # Without such an event (it cannot be: the stack is deployed), count from now.
        return max(finished, default=self.now())

    def done_document(self, run: str) -> dict:
        """runs/<run>/DONE.json, or {} while the leader has not written it."""
        return controller.read_json(self.s3, self.bucket, f"runs/{run}/DONE.json") or {}

    def idle_since(self, run: str) -> datetime.datetime | None:
        """When the run's idle alarm entered ALARM, or None if it is not in ALARM (now)."""
        name = f"{self.idle_alarm_prefix}{run}"
        alarms = self.cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"]
        if not alarms or alarms[0]["StateValue"] != "ALARM":
            return None
        return alarms[0]["StateUpdatedTimestamp"]

    def retire_fleet(self, run: str, reason: str) -> None:
        """Delete TrainStack for `run` once its results are safe; the hard cap does not wait.

        A stack being created or updated cannot be judged (its outputs may be missing, a delete
        would fail): the reaper looks again later instead of dropping the trigger.
        """
        stack = self.train_stack()
        if stack is None or stack["status"] in GONE_STATES:
            log("already-gone", stack=TRAIN_STACK, run=run, reason=reason)
            return
        if busy(stack["status"]):
            name, at = self.schedule_recheck(run, reason)
            log("stack-busy", run=run, reason=reason, status=stack["status"], recheck=name, at=at)
            return
        if stack["run"] != run:
            log(
                "other-run-deployed",
                stack=TRAIN_STACK,
                run=run,
                deployed=stack["run"],
                reason=reason,
            )
            return
        if reason == "idle":
            self.retire_idle(run, stack)
            return
        if reason == "hard-cap":
            # The cap reads nothing first: a read that fails must not keep a fleet billing.
            self.delete_stack(TRAIN_STACK, run=run, reason=reason)
            self.notify(stack, run, "reached its hard cap: the reaper is deleting its fleet")
            self.follow_later(run, stack["id"], check=1, status="delete requested")
            return
        missing, _ = self.results(run)
        if missing:
            name, at = self.schedule_recheck(run, reason)
            log("wait-for-results", run=run, reason=reason, missing=missing, recheck=name, at=at)
            return
        self.delete_stack(TRAIN_STACK, run=run, reason=reason, missing_results=missing)
        self.follow_later(run, stack["id"], check=1, status="delete requested")

    # --- The run controller (controller.py decides; this part plays it on EC2) -------------

    def end_attempt(self, run: str) -> None:
        """A DONE.json of `run`: record the attempt, then relaunch the fleet or retire it.

        A stack that cannot be judged now (gone, being created, another run's) goes to
        retire_fleet, which knows what to do with each. A DONE.json already gone after a
        relaunch was decided is that relaunch's doing: a repeated event changes nothing.
        """
        stack = self.train_stack()
        gone = stack is None or stack["status"] in GONE_STATES
        if gone or busy(stack["status"]) or stack["run"] != run:
            self.retire_fleet(run, "done")
            return
        entry = controller.end_attempt(
            self.s3,
            self.bucket,
            run,
            max_restarts=stack["max_restarts"],
            now=self.now(),
            deadline=stack["deadline"],
        )
        if entry is None:
            if self.last_decision(run) == "relaunch":
                log("relaunch-under-way", run=run)
                return
            self.retire_fleet(run, "done")
            return
        log("attempt-ended", run=run, attempt=entry)
        if entry["decision"] == "relaunch":
            self.relaunch(run, stack, entry)
            return
        if entry["decision"] == "stop":
            self.notify(stack, run, f"ended attempt {entry['attempt']}: {entry['why']}")
        self.retire_fleet(run, "done")

    def fleet_nodes(self, stack_id: str) -> list[dict]:
        """The stack's instances not yet terminated, CloudFormation's and the replacements the
        reaper launched (the fleet's own tag names the stack of both): each one's id, state,
        node index (None without the tag), whether it is Spot and whether CloudFormation owns it."""
        found = {}
        for tag in ("aws:cloudformation:stack-id", FLEET_TAG):
            pages = self.ec2.get_paginator("describe_instances").paginate(
                Filters=[
                    {"Name": f"tag:{tag}", "Values": [stack_id]},
                    {"Name": "instance-state-name", "Values": [*LIVE_STATES, "shutting-down"]},
                ]
            )
            for instance in (i for p in pages for r in p["Reservations"] for i in r["Instances"]):
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                node = tags.get(NODE_TAG, "")
                found[instance["InstanceId"]] = {
                    "id": instance["InstanceId"],
                    "state": instance["State"]["Name"],
                    "node": int(node) if node.isdigit() else None,
                    "spot": instance.get("InstanceLifecycle") == "spot",
                    "zone": instance.get("Placement", {}).get("AvailabilityZone"),
                    "cloudformation": "aws:cloudformation:stack-id" in tags,
                }
        return sorted(found.values(), key=lambda n: n["id"])

    def fleet_instances(self, stack_id: str) -> dict[str, str]:
        """The stack's instances that are not terminated or terminating, and their states."""
        return {
            n["id"]: n["state"] for n in self.fleet_nodes(stack_id) if n["state"] in LIVE_STATES
        }

    def stack_instances(self, stack_id: str) -> list[str]:
        """The instance ids CloudFormation created for the stack, whatever their state now."""
        resources = self.cloudformation.describe_stack_resources(StackName=stack_id)
        return [
            r["PhysicalResourceId"]
            for r in resources["StackResources"]
            if r["ResourceType"] == "AWS::EC2::Instance" and r.get("PhysicalResourceId")
        ]

    def missing_nodes(self, stack: dict, nodes: list[dict]) -> list[int]:
        """The node indexes no live instance serves: EC2 terminated them (a Spot interruption,
        a retired host) or the relaunch did (Spot instances cannot be stopped)."""
        served = {n["node"] for n in nodes if n["state"] in LIVE_STATES}
        return [i for i in range(len(stack["replacement_templates"])) if i not in served]

    def relaunch(self, run: str, stack: dict, entry: dict) -> None:
        """Stop every on-demand node and terminate every Spot one; continue_relaunch starts the
        stopped ones and launches the rest from their replacement templates once none is
        stopping. A stop and start puts a node on healthy hardware with empty instance stores,
        its address and placement group kept. Spot Instances, one-time requests, cannot be
        stopped: they are replaced, as a node EC2 terminated is. Either way each node's boot
        service resumes the run from S3."""
        nodes = self.fleet_nodes(stack["id"])
        if not stack["replacement_templates"] and (
            gone := sorted(set(self.stack_instances(stack["id"])) - {n["id"] for n in nodes})
        ):
            # A fleet without replacement templates cannot bring back a terminated node; it
            # would wait for it until restarts ran out. It goes now, results being in S3.
            self.delete_stack(TRAIN_STACK, run=run, reason="relaunch-impossible", gone=gone)
            self.notify(
                stack,
                run,
                f"ended attempt {entry['attempt']} ({entry['reason']}); it cannot be relaunched: "
                f"instance(s) {', '.join(gone)} no longer exist, so the reaper is deleting the "
                "fleet; deploy again to resume from the newest checkpoint",
            )
            self.follow_later(run, stack["id"], check=1, status="delete requested")
            return
        spot = [n["id"] for n in nodes if n["spot"] and n["state"] in LIVE_STATES]
        up = [n["id"] for n in nodes if not n["spot"] and n["state"] in ("pending", "running")]
        plan = stack["zone_plan"]
        here = next((n["zone"] for n in nodes if n["state"] in LIVE_STATES), None)
        zones = zone_move.try_order(list(plan.zones), here) if plan else []
        # Scheduled first: whatever EC2 answers below, the relaunch goes on.
        name, at = self.schedule_recheck(
            run, "relaunch", due=self.now(), check=1, zones=zones, attempt=entry["attempt"]
        )
        try:
            if spot:
                self.ec2.terminate_instances(InstanceIds=spot)
            if up:
                self.ec2.stop_instances(InstanceIds=up)
        except ClientError as error:  # a node still pending cannot stop yet: the re-check sees it
            log("relaunch-stop-refused", run=run, error=error_code(error))
        log(
            "relaunch-stop",
            run=run,
            attempt=entry["attempt"] + 1,
            stopped=up,
            terminated=spot,
            zones=zones,
            recheck=name,
            at=at,
        )
        self.notify(
            stack,
            run,
            f"ended attempt {entry['attempt']} ({entry['reason']}); the fleet is relaunched "
            f"({entry['why']}) and resumes from its newest checkpoint",
        )

    def continue_relaunch(
        self, run: str, check: int = 1, zones: list[str] | None = None, attempt: int | None = None
    ) -> None:
        """Start the stopped nodes and launch the missing ones once none is stopping or
        terminating, in the zone of this try (`zones`, from relaunch: the fleet's own first).
        Without capacity, the next try goes to the next zone at once; after a round of every
        zone it waits, twice as long each round up to an hour, and after the last round, or
        when the hard cap leaves no time, the run gives up in one line (give_up). A try in
        another zone first terminates the nodes left elsewhere: a placement group is one zone.
        A stack being deleted (cdk destroy, the hard cap) or replaced is never started again,
        and a re-check older than the relaunch's newest (`attempt` ended, `check`) does nothing:
        it names a zone the fleet may have left."""
        zones = zones or []
        stack = self.train_stack()
        if stack is None or stack["status"] in GONE_STATES or stack["run"] != run:
            log("relaunch-dropped", run=run, stack=stack and stack["status"])
            return
        if stale := self.stale_relaunch(run, attempt, check):
            log("relaunch-stale", run=run, attempt=attempt, check=check, newest=stale)
            return
        nodes = self.fleet_nodes(stack["id"])
        states = {n["id"]: n["state"] for n in nodes}
        missing = self.missing_nodes(stack, nodes)
        stopped = sorted(n["id"] for n in nodes if n["state"] == "stopped")
        # A fleet whose every node is up has relaunched: nothing of it moves any more.
        relaunched = not missing and set(states.values()) <= {"pending", "running"}
        zone = zone_move.zone_of_try(zones, check)
        elsewhere = [
            n["id"]
            for n in nodes
            if zone and not relaunched and n["state"] in LIVE_STATES and n["zone"] != zone
        ]
        if elsewhere:
            self.ec2.terminate_instances(InstanceIds=elsewhere)
        settling = {"stopping", "shutting-down"} & set(states.values())
        if busy(stack["status"]) or elsewhere or settling:
            name, at = self.schedule_recheck(
                run, "relaunch", due=self.now(), check=check, zones=zones, attempt=attempt
            )
            log(
                "relaunch-wait",
                run=run,
                states=states,
                zone=zone,
                moving=elsewhere,
                recheck=name,
                at=at,
            )
            return
        plan = stack["zone_plan"]
        moved = plan is not None and zone not in (None, plan.zones[0])
        ended = attempt if attempt is not None else len(self.attempts(run))
        token = f"{run}/{ended}/{check}/{zone}"
        started: list[str] = []
        try:
            try:
                network = (
                    zone_move.prepare(self.ec2, plan, zone, stack["id"], FLEET_TAG)
                    if moved
                    else None
                )
            except (ClientError, LookupError) as error:
                if transient(error):
                    raise
                # This zone cannot take the fleet (no subnet there, say): the next one may.
                raise ZoneRefused(error) from error
            if stopped:
                self.ec2.start_instances(InstanceIds=stopped)
                started = stopped
            replaced = self.launch_replacements(stack, missing, token=token, network=network)
        except (ClientError, ZoneRefused) as error:
            if started:  # they would bill while the fleet waits for its missing nodes
                self.ec2.stop_instances(InstanceIds=started)
            if isinstance(error, ClientError) and transient(error):
                raise
            code = error_code(error)
            if isinstance(error, ClientError) and code not in NO_CAPACITY_CODES:
                self.give_up(
                    run,
                    stack,
                    "relaunch_refused",
                    f"the relaunch failed: EC2 answered {code}: {error_message(error)}",
                )
                return
            self.next_try(run, stack, zones, zone, check, code, attempt)
            return
        log(
            "relaunched",
            run=run,
            zone=zone,
            started=stopped,
            replaced=replaced,
            instances=sorted(states),
        )
        if zone and zone != zones[0] and (stopped or replaced):
            self.notify(
                stack,
                run,
                f"moved to zone {zone}: {', '.join(zones[: zones.index(zone)])} had no capacity",
            )

    def next_try(
        self,
        run: str,
        stack: dict,
        zones: list[str],
        zone: str | None,
        check: int,
        code: str,
        attempt: int | None,
    ) -> None:
        """The zone of this try had no capacity: schedule the next try, in the next zone at
        once or after a round of them later, or give up when rounds or time run out."""
        base = datetime.timedelta(minutes=self.recheck_minutes)
        wait = zone_move.wait_after(check, len(zones), base)
        deadline = stack["deadline"]
        if wait is None or (deadline and self.now() + wait + controller.MIN_ATTEMPT > deadline):
            where = ", ".join(zones) if zones else zone or "its zone"
            self.give_up(
                run,
                stack,
                "no_capacity",
                f"no capacity for the fleet in {where}: {code} on each of {check} tries; deploy "
                "again later, in another region, or with a capacity reservation",
            )
            return
        next_zone = zone_move.zone_of_try(zones, check + 1)
        name, at = self.schedule_recheck(
            run, "relaunch", due=self.now() + wait, check=check + 1, zones=zones, attempt=attempt
        )
        log(
            "relaunch-no-capacity",
            run=run,
            error=code,
            zone=zone,
            tries=check,
            next_zone=next_zone,
            recheck=name,
            at=at,
        )
        # After the schedule, so a failure here cannot lose the next try; the newest try it
        # records makes an older re-check that arrives late stale.
        rounds = max(len(zones), 1) * zone_move.CAPACITY_ROUNDS
        try:
            self.tell_status(
                run,
                f"waiting for capacity: {code} in {zone or 'its zone'} (try {check} of "
                f"{rounds}); next try {'in ' + next_zone if next_zone else 'there'} at "
                f"{controller.stamp(at)}",
                relaunch_check=check + 1,
            )
        except ClientError as error:
            log("status-not-told", run=run, error=error_code(error))

    def stale_relaunch(self, run: str, attempt: int | None, check: int) -> dict | None:
        """What is newer than a re-check of (`attempt`, `check`): a later relaunch recorded in
        attempts.json, or a later try of the same one in status.json. None when it is current
        (a re-check without an attempt, scheduled before it had one, is never judged)."""
        if attempt is None:
            return None
        relaunched = [e["attempt"] for e in self.attempts(run) if e.get("decision") == "relaunch"]
        if relaunched and max(relaunched) != attempt:
            return {"attempt": max(relaunched)}
        status = controller.read_json(self.s3, self.bucket, f"runs/{run}/status.json") or {}
        newest = status.get("relaunch_check")
        if status.get("attempt") == attempt + 1 and isinstance(newest, int) and newest > check:
            return {"attempt": attempt, "check": newest}
        return None

    def tell_status(self, run: str, reason: str, **fields) -> None:
        """Put what the relaunch waits for into status.json, which `horovod-fleet status` and
        the dashboard show; its phase stays "relaunching"."""
        key = f"runs/{run}/status.json"
        status = controller.read_json(self.s3, self.bucket, key) or {}
        status.update(reason=reason, updated_at=controller.stamp(self.now()), **fields)
        controller.write_json(self.s3, self.bucket, key, status)

    def give_up(self, run: str, stack: dict, cause: str, reason: str) -> None:
        """The relaunch cannot bring the fleet back (no zone had capacity, EC2 refused it): the
        run ends as a failed attempt with `cause` and `reason`, one line. The reaper writes the
        DONE.json the attempt never could; the run controller records it as final
        (controller.FINAL) and the fleet is retired with its results."""
        attempts = self.attempts(run)
        number = max((e.get("attempt", 0) for e in attempts), default=0) + 1
        done = {
            "run": run,
            "status": "failed",
            "cause": cause,
            "reason": reason,
            "written_by": "controller",
            "attempt": number,
            "attempts": [
                *(
                    {k: e.get(k) for k in ("attempt", "status", "cause", "reason")}
                    for e in attempts
                ),
                {"attempt": number, "status": "failed", "cause": cause, "reason": reason},
            ],
            "finished_at": controller.stamp(self.now()),
        }
        controller.write_json(self.s3, self.bucket, f"runs/{run}/DONE.json", done)
        log("relaunch-gave-up", run=run, reason=reason, attempt=number)
        self.notify(stack, run, f"gave up: {reason}")
        self.end_attempt(run)

    def launch_replacements(
        self, stack: dict, missing: list[int], token: str, network: tuple[str, str] | None = None
    ) -> dict[str, str]:
        """Launch each missing node from its replacement template, with nothing of the
        reaper's own: the version that launches into `network` (subnet, placement group) of a
        zone move, the deployed one otherwise. All or none: the ones launched are terminated
        again when one finds no capacity (a fleet short of a node only waits), and the error
        is raised."""
        launched: dict[str, str] = {}
        templates = stack["replacement_templates"]
        try:
            for index in missing:
                version = (
                    zone_move.version_for(self.ec2, templates[index], network)
                    if stack["zone_plan"]
                    else "$Latest"
                )
                # The same token for a retried invocation of this re-check: no second instance.
                digest = hashlib.sha256(f"{stack['id']}/{token}/{index}".encode()).hexdigest()
                reservation = self.ec2.run_instances(
                    LaunchTemplate={"LaunchTemplateId": templates[index], "Version": version},
                    MinCount=1,
                    MaxCount=1,
                    ClientToken=digest[:64],
                )
                launched[str(index)] = reservation["Instances"][0]["InstanceId"]
        except ClientError:
            if launched:
                self.ec2.terminate_instances(InstanceIds=list(launched.values()))
            raise
        return launched

    def attempts(self, run: str) -> list[dict]:
        """The run controller's record of the run's ended attempts (attempts.json)."""
        history = controller.read_json(self.s3, self.bucket, f"runs/{run}/attempts.json") or {}
        return [entry for entry in history.get("attempts", []) if isinstance(entry, dict)]

    def last_decision(self, run: str) -> str | None:
        attempts = self.attempts(run)
        return attempts[-1].get("decision") if attempts else None

    def relaunched_at(self, run: str) -> datetime.datetime | None:
        """When the run controller last decided to relaunch the run."""
        times = [
            controller.parse_stamp(entry["decided_at"])
            for entry in self.attempts(run)
            if entry.get("decision") == "relaunch" and entry.get("decided_at")
        ]
        return max(times, default=None)

    def retire_idle(self, run: str, stack: dict) -> None:
        """Delete an idle fleet once it has been quiet for the idle window since its last progress
        and has had the launch grace since it was deployed.

        The alarm is asked live (this may be a re-check after training resumed). Its onset means
        the GPUs were quiet for the window before it; a checkpoint that reached S3 later is
        progress, so the window counts from it. No results are awaited: checkpoints reach S3 as
        they are written, the logs are in CloudWatch Logs, and a fleet that never trained has no
        checkpoint to wait for. Until the fleet is due, a re-check is scheduled at the due time.
        """
        idle_since = self.idle_since(run)
        if idle_since is None:
            log("idle-cleared", run=run)
            return
        checkpoint = self.newest_checkpoint(run)
        # A relaunch is a launch: its nodes boot and pull the data again, GPUs quiet.
        deployed = max(filter(None, (self.deployed_at(stack["id"]), self.relaunched_at(run))))
        quiet_from = idle_since - self.idle_window
        progress = max(quiet_from, checkpoint) if checkpoint else quiet_from
        due = max(progress + self.idle_window, deployed + self.launch_grace)
        facts = {"idle_since": idle_since, "checkpoint": checkpoint, "deployed": deployed}
        if self.now() < due:
            name, at = self.schedule_recheck(run, "idle", due=due)
            log("idle-wait", run=run, due=due, recheck=name, at=at, **facts)
            return
        self.delete_stack(TRAIN_STACK, run=run, reason="idle", **facts)
        self.notify(stack, run, f"sat idle since {idle_since}: the reaper is deleting its fleet")
        self.follow_later(run, stack["id"], check=1, status="delete requested")

    def follow_delete(self, run: str, stack_id: str, check: int) -> None:
        """Re-check the deleted TrainStack until it is gone; retry a delete that failed.

        The stack is followed by id, so a fleet deployed again under the same name is never
        touched. Before a retry the stack's remaining instances are terminated: they are what
        bills, and a delete that failed elsewhere (say, on a network interface) may fail again.
        """
        stack = self.train_stack(stack_id)
        status = "DELETE_COMPLETE" if stack is None else stack["status"]
        if status == "DELETE_COMPLETE":
            log("deleted", stack=TRAIN_STACK, run=run, checks=check)
            return
        if status == "DELETE_FAILED":
            terminated = self.terminate_instances(stack_id)
            self.delete_stack(
                TRAIN_STACK,
                run=run,
                reason="retry-failed-delete",
                status_reason=stack["status_reason"],
                terminated=terminated,
                # A zone move's subnet the Replacements resource could not delete yet.
                moves_left=[] if terminated else self.remove_moves(stack_id),
            )
        elif status != "DELETE_IN_PROGRESS":
            log("follow-delete-stopped", stack=TRAIN_STACK, run=run, status=status)
            return
        if check * self.recheck_minutes >= FOLLOW_DELETE_FOR.total_seconds() / 60:
            log("delete-unconfirmed", stack=TRAIN_STACK, run=run, status=status, checks=check)
            return
        self.follow_later(run, stack_id, check + 1, status)

    def follow_later(self, run: str, stack_id: str, check: int, status: str) -> None:
        name, at = self.schedule_recheck(run, "deleting", stack_id=stack_id, check=check)
        log("follow-delete", stack=TRAIN_STACK, run=run, status=status, recheck=name, at=at)

    def terminate_instances(self, stack_id: str) -> list[str]:
        """Terminate the instances CloudFormation tagged as the stack's; returns their ids."""
        ids = list(self.fleet_instances(stack_id))
        if ids:
            try:
                self.ec2.terminate_instances(InstanceIds=ids)
            except ClientError as error:  # the delete is still worth retrying
                log("terminate-failed", instances=ids, error=error.response["Error"]["Code"])
                return []
        return ids

    def notify(self, stack: dict, run: str, what: str) -> None:
        """Mail the run's -c notifyEmail address that the guard ended its fleet; a mail that
        cannot be sent never stops the teardown."""
        if not stack.get("notify_topic"):
            return
        try:
            self.sns.publish(
                TopicArn=stack["notify_topic"],
                Subject=f"horovod-fleet: run {run} stopped by its guard"[:100],
                Message=f"Run {run} {what}. Its checkpoints and logs are in S3 under runs/{run}/.",
            )
            log("notified", run=run, topic=stack["notify_topic"])
        except ClientError as error:
            log("notify-failed", run=run, error=str(error))

    def delete_stack(self, stack_name: str, **fields) -> None:
        """DeleteStack, refusing every name but TrainStack; CloudFormation uses the stack's role."""
        if stack_name != TRAIN_STACK:
            log("refused", stack=stack_name, **fields)
            raise RefusedStack(f"the reaper deletes only {TRAIN_STACK}, not {stack_name}")
        self.cloudformation.delete_stack(StackName=stack_name)
        log("delete-stack", stack=stack_name, **fields)

    def schedule_recheck(
        self, run: str, reason: str, due: datetime.datetime | None = None, **extra
    ) -> tuple[str, datetime.datetime]:
        """A one-time Scheduler schedule that invokes the reaper again; deleted after it fires.

        Returns its name and time. Triggers in one window share the name, so it is made once.
        A failed invocation is retried for a day, then lands in the dead-letter queue, whose
        alarm e-mails: a lost re-check must not leave a fleet billing unseen.
        """
        at = recheck_time(self.now(), self.recheck_minutes, due)
        digest = hashlib.sha256(run.encode()).hexdigest()[:12]
        name = f"{self.recheck_prefix}{reason}-{digest}-{at:%Y%m%d%H%M}"
        payload = {"trigger": "recheck", "reason": reason, "run": run, **extra}
        try:
            self.scheduler.create_schedule(
                Name=name,
                ScheduleExpression=f"at({at:%Y-%m-%dT%H:%M:%S})",
                ScheduleExpressionTimezone="UTC",
                FlexibleTimeWindow={"Mode": "OFF"},
                ActionAfterCompletion="DELETE",
                Target={
                    "Arn": self.function_arn,
                    "RoleArn": self.recheck_role_arn,
                    "Input": json.dumps(payload),
                    "RetryPolicy": {
                        "MaximumRetryAttempts": RECHECK_RETRIES,
                        "MaximumEventAgeInSeconds": RECHECK_MAX_AGE_S,
                    },
                    "DeadLetterConfig": {"Arn": self.dead_letter_arn},
                },
                Description=f"horovod-fleet: re-check {reason} of run {run}",
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConflictException":
                raise
        return name, at

    # --- Preprocessing ------------------------------------------------------------------------

    def stop_preprocessing(self, manifest_etag: str) -> None:
        """Stop the registered preprocessing instance, then snapshot its volume if configured."""
        try:
            value = self.ssm.get_parameter(Name=self.preprocess_parameter)["Parameter"]["Value"]
        except ClientError as error:
            if error.response["Error"]["Code"] != "ParameterNotFound":
                raise
            log("no-preprocess-instance", parameter=self.preprocess_parameter)
            return
        registered = json.loads(value)
        instance_id, volume_id = registered["instance_id"], registered["volume_id"]
        try:
            reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError as error:
            if error.response["Error"]["Code"] != "InvalidInstanceID.NotFound":
                raise
            reservations = []
        state = reservations[0]["Instances"][0]["State"]["Name"] if reservations else "terminated"
        if state in ("terminated", "shutting-down"):
            log("preprocess-instance-gone", instance=instance_id, state=state)
            return
        if state in ("stopped", "stopping"):
            log("already-stopped", instance=instance_id, state=state)
        else:
            self.ec2.stop_instances(InstanceIds=[instance_id])
            log("stop-instance", instance=instance_id, state=state)
        if registered.get("snapshot_volume"):
            self.snapshot_volume(instance_id, volume_id, manifest_etag)

    def snapshot_volume(self, instance_id: str, volume_id: str, manifest_etag: str) -> None:
        """One snapshot per volume and manifest, taken once the instance has stopped."""
        self.ec2.get_waiter("instance_stopped").wait(
            InstanceIds=[instance_id], WaiterConfig={"Delay": 15, "MaxAttempts": 40}
        )
        existing = self.ec2.describe_snapshots(
            OwnerIds=["self"],
            Filters=[
                {"Name": "volume-id", "Values": [volume_id]},
                {"Name": "tag:horovod-fleet:manifest", "Values": [manifest_etag]},
            ],
        )["Snapshots"]
        kept = [s["SnapshotId"] for s in existing if s["State"] != "error"]
        if kept:
            log("snapshot-exists", volume=volume_id, snapshots=kept)
            return
        snapshot = self.ec2.create_snapshot(
            VolumeId=volume_id,
            Description="horovod-fleet preprocessing volume after the manifest was written",
            TagSpecifications=[
                {
                    "ResourceType": "snapshot",
                    "Tags": [
                        {"Key": "Project", "Value": "horovod-fleet"},
                        {"Key": "horovod-fleet:manifest", "Value": manifest_etag},
                    ],
                }
            ],
        )
        log("snapshot", volume=volume_id, snapshot=snapshot["SnapshotId"])

    # --- Hard-cap deadline (CloudFormation custom resource) -----------------------------------

    def answer_deadline(self, event: Mapping) -> None:
        """Reply to Custom::HorovodFleetDeadline; the clock starts on Create and keeps its start.

        The physical id is "<run>@<start>", so an Update that changes MaxHours moves the deadline
        relative to the original start, and a new run name starts a new clock.
        """
        now = self.now().replace(microsecond=0)
        props = event.get("ResourceProperties", {})
        run = props.get("Run", "")
        physical_id = event.get("PhysicalResourceId") or ""
        response = {"Status": "SUCCESS", "PhysicalResourceId": physical_id or f"{run}@{now}"}
        if event["RequestType"] != "Delete":
            try:
                old_run, _, old_start = physical_id.rpartition("@")
                keep = event["RequestType"] == "Update" and old_run == run and old_start
                start = datetime.datetime.fromisoformat(old_start) if keep else now
                response["PhysicalResourceId"] = f"{run}@{start.isoformat()}"
                response["Data"] = deadline(start, float(props.get("MaxHours", "nan")), now)
            except ValueError as error:
                response.update(Status="FAILED", Reason=str(error))
        log("deadline", request=event["RequestType"], run=run, **response)
        respond(event, response)

    def answer_replacements(self, event: Mapping) -> None:
        """Reply to Custom::HorovodFleetReplacements. Its Delete comes before any of the fleet's
        (it depends on them all): the replacements the reaper launched, which CloudFormation
        does not know, are terminated, and the delete is followed and retried, as their network
        interfaces may still hold up the security group's delete."""
        stack_id = event["StackId"]
        run = event.get("ResourceProperties", {}).get("Run", "")
        response = {"Status": "SUCCESS", "PhysicalResourceId": f"{run}-replacements"}
        if event["RequestType"] == "Delete":
            # Followed first: whatever happens below, a delete that fails is retried.
            self.follow_later(run, stack_id, check=1, status="terminating replacements")
            ours = [n["id"] for n in self.fleet_nodes(stack_id) if not n["cloudformation"]]
            if ours:
                self.ec2.terminate_instances(InstanceIds=ours)
                try:
                    self.ec2.get_waiter("instance_terminated").wait(
                        InstanceIds=ours,
                        WaiterConfig={"Delay": 10, "MaxAttempts": TERMINATE_WAIT_S // 10},
                    )
                except WaiterError as error:  # the followed delete retries after them
                    log("replacements-still-terminating", run=run, error=str(error))
            # Before CloudFormation deletes the VPC, which a subnet of a move would hold up.
            left = self.remove_moves(stack_id)
            log("replacements", request="Delete", run=run, terminated=ours, moves_left=left)
        respond(event, response)

    def remove_moves(self, stack_id: str) -> list[str]:
        """Delete what zone moves made for the stack (zone_move.remove); what is left, an error
        included, is only reported: the delete it precedes goes on, and the followed delete
        retries it."""
        try:
            return zone_move.remove(self.ec2, stack_id, FLEET_TAG)
        except ClientError as error:
            return [error_code(error)]

    # --- Pinned AMI and code (CloudFormation custom resource) ---------------------------------

    def answer_pinned(self, event: Mapping) -> None:
        """Reply to Custom::HorovodFleetPinned: the AMI id its `ImageParameter` names and its
        `Code` URLs, as they were on the stack's first deploy.

        An Update keeps them (the image is the physical id, the code comes from the old
        properties), so neither a new image behind the SSM parameter nor a code change stops,
        starts or replaces the node on a redeploy; a new stack (destroy, deploy) takes the new.
        """
        props = event.get("ResourceProperties", {})
        parameter = props.get("ImageParameter", "")
        old = event.get("OldResourceProperties") or {}
        physical_id = event.get("PhysicalResourceId") or ""
        request = event["RequestType"]
        response = {"Status": "SUCCESS", "PhysicalResourceId": physical_id or "none"}
        if request != "Delete":
            update = request == "Update"
            old_code = old.get("Code", {}) if update else {}
            code = {name: old_code.get(name, url) for name, url in props.get("Code", {}).items()}
            keep = update and old.get("ImageParameter") == parameter
            image = physical_id if keep and physical_id.startswith("ami-") else None
            if image is None:
                try:
                    image = self.ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
                except ClientError as error:
                    response.update(
                        Status="FAILED", Reason=f"cannot read {parameter}: {error}"[:1000]
                    )
            if image:
                response.update(PhysicalResourceId=image, Data={"ImageId": image, **code})
        log("pinned", request=request, parameter=parameter, **response)
        respond(event, response)

    # --- Dataset present (CloudFormation custom resource) --------------------------------------

    def answer_dataset(self, event: Mapping) -> None:
        """Reply to Custom::HorovodFleetDataset: SUCCESS when the manifest its `Bucket` and `Key`
        name exists, FAILED with one line saying what to do when it does not. The fleet's
        instances depend on it, so a missing dataset fails the deploy before any of them
        launches. A Delete always succeeds."""
        props = event.get("ResourceProperties", {})
        bucket, key = props.get("Bucket", ""), props.get("Key", "")
        url = f"s3://{bucket}/{key}"
        response = {"Status": "SUCCESS", "PhysicalResourceId": url}
        if event["RequestType"] != "Delete":
            try:
                self.s3.head_object(Bucket=bucket, Key=key)
            except ClientError as error:
                absent = error.response.get("Error", {}).get("Code") in ABSENT_KEY_CODES
                reason = (
                    f"no {url}: the fleet has no dataset to train on. Deploy PreprocessStack and "
                    "wait until its node writes the manifest (it does so last), or point "
                    "-c datasetBucket= and -c datasetPrefix= at your TFRecords; "
                    "-c benchmark=true needs no dataset"
                    if absent
                    else f"cannot read {url}: {error}"
                )
                response.update(Status="FAILED", Reason=reason[:1000])
        log("dataset", request=event["RequestType"], **response)
        respond(event, response)

    # --- A zone that offers the instance type (CloudFormation custom resource) -----------------

    def answer_zone(self, event: Mapping) -> None:
        """Reply to Custom::HorovodFleetZone with the zone the fleet's subnet goes in: its
        `PreferredZone` when that zone offers `InstanceType`, else (unless `Fixed` is "true":
        the user's subnet or capacity reservation decides) the first zone that does. No zone
        fails the deploy in one line before anything is created. The zone keeps its answer
        across updates of the same type, so a redeploy never moves the subnet. Zone names differ
        between accounts, so only this account's answer can say (DescribeInstanceTypeOfferings,
        https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypeOfferings.html).
        A `PreferredZone` given as a zone ID (use1-az4, the same zone in every account) is
        turned into this account's zone name first, and the answer is always a name: subnets,
        volumes and instances take it (DescribeAvailabilityZones with ZoneIds,
        https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeAvailabilityZones.html).

        `MoveSlots` more zones are answered as `Zone1`, `Zone2`, ... (zone_answer): TrainStack
        makes a subnet and a placement group in each. The physical id holds them after the
        zone ("us-east-1a:us-east-1b,us-east-1c"), so that every later Update answers them again
        whatever changed."""
        props = event.get("ResourceProperties", {})
        instance_type = props.get("InstanceType", "")
        preferred = props.get("PreferredZone", "")
        physical_id = event.get("PhysicalResourceId") or ""
        deployed, _, kept = physical_id.partition(":")
        request = event["RequestType"]
        response = {"Status": "SUCCESS", "PhysicalResourceId": physical_id or preferred}
        old = event.get("OldResourceProperties") or {}
        unchanged = all(old.get(k) == props.get(k) for k in ("InstanceType", "PreferredZone"))
        region = self.ec2.meta.region_name
        keep = request == "Update" and physical_id and unchanged
        by_id = request != "Delete" and not keep and ZONE_ID.fullmatch(preferred) is not None
        named = self.zone_name(preferred) if by_id else preferred
        fixed = props.get("Fixed") == "true"
        slots = 0 if fixed else int(props.get("MoveSlots") or 0)
        moves = [z for z in kept.split(",") if z] if request == "Update" else []
        if keep:
            offered = self.offering_zones(instance_type)
            data = zone_answer(deployed, offered, fixed, slots, moves)
            response.update(PhysicalResourceId=answer_id(data), Data=data)
        elif by_id and not named:
            response.update(
                Status="FAILED",
                Reason=(
                    f"zone ID {preferred} is not a zone of {region} this account can use: "
                    f"see aws ec2 describe-availability-zones --region {region}"
                ),
            )
        elif request != "Delete":
            shown = f"{named} ({preferred})" if by_id else preferred
            preferred = named
            offered = self.offering_zones(instance_type)
            if preferred in offered or (offered and not fixed):
                zone = preferred if preferred in offered else offered[0]
                data = zone_answer(zone, offered, fixed, slots, moves)
                response.update(PhysicalResourceId=answer_id(data), Data=data)
            else:
                where = f"zone {shown}" if fixed else f"any zone of {region}"
                elsewhere = (
                    f"a subnet in a zone that does ({', '.join(offered)})"
                    if offered
                    else "another region (-c region=...)"
                )
                response.update(
                    Status="FAILED",
                    Reason=(
                        f"{instance_type} is not offered in {where} for this account: try "
                        f"{elsewhere}, a capacity reservation (-c capacityReservationId=...) "
                        "or a Capacity Block"
                    ),
                )
        log("zone", request=request, instance_type=instance_type, **response)
        respond(event, response)

    def offering_zones(self, instance_type: str) -> list[str]:
        """The region's zones that offer the type to this account, by name."""
        pages = self.ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
        return sorted(o["Location"] for p in pages for o in p["InstanceTypeOfferings"])

    def zone_name(self, zone_id: str) -> str:
        """This account's name for the zone with this zone ID; "" when it has none (an ID of
        another region, or of a zone the account cannot use)."""
        try:
            zones = self.ec2.describe_availability_zones(ZoneIds=[zone_id])["AvailabilityZones"]
        except ClientError as error:  # InvalidParameterValue: no such zone ID here
            log("zone", zone_id=zone_id, error=str(error))
            return ""
        return next((z["ZoneName"] for z in zones if z.get("ZoneId") == zone_id), "")


def zone_answer(
    zone: str, offered: list[str], fixed: bool, slots: int = 0, kept: list[str] | None = None
) -> dict:
    """The zone check's answer: the zone, and where a run may move when it has no capacity:
    the others that offer the type (`Zones`, the zone first), unless the user's subnet or
    reservation fixes the zone; and the zone of each of TrainStack's `slots` move slots
    (`Zone1`, ...). A slot keeps the zone it was `kept` at: CloudFormation replaces a subnet
    whose zone changes by creating the new one first, on the slot's CIDR block, which the old
    one still holds, so the update would fail
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-ec2-subnet.html).
    The other slots take the offering zones no slot holds yet, then the zone itself: a spare
    subnet and group beside the fleet's, which cost nothing."""
    others = [] if fixed else [z for z in offered if z != zone]
    moves = (kept or [])[:slots]
    spare = [z for z in others if z not in moves] + [zone] * slots
    moves = moves + spare[: slots - len(moves)]
    return {
        "Zone": zone,
        "Zones": ",".join([zone, *others]),
        **{f"Zone{slot}": move for slot, move in enumerate(moves, 1)},
    }


def answer_id(answer: dict) -> str:
    """The zone check's physical id: the zone, then its move slots' zones in slot order."""
    moves = [zone for key, zone in answer.items() if key.removeprefix("Zone").isdigit()]
    return ":".join([answer["Zone"], ",".join(moves)]) if moves else answer["Zone"]


def respond(event: Mapping, response: dict) -> None:
    """PUT a custom resource's response to CloudFormation's presigned URL."""
    body = json.dumps(
        {
            **response,
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": ""}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        reply.read()


def handler(event, context):
    """Lambda entry point."""
    return Reaper(os.environ, context.invoked_function_arn).handle(event)
