"""A stand-in for what `horovod-fleet drill` acts on, for its tests: `npx cdk` as a stub that
records its arguments and does to moto what the deploy or destroy would (stacks in
CloudFormation, the bucket, the converter's manifest.json, and the records the deployed drill's
head and run controller write), `python -m` as a stub that writes the sample's three files, and
a clock that its sleeps move on."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import boto3

from watch.drill import TRAIN_TAR, VAL_LABELS, VAL_TAR, Tools

BUCKET = "horovod-fleet-123456789012-us-east-1"
T0 = 1_796_119_200.0  # 2026-12-01T10:00:00Z: TrainStack's deploy began
DEADLINE = "2026-12-01T12:00:00Z"  # its hard cap, T0 + 2 h


def stamp(seconds: float) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def client(service: str):
    """One client per service and moto account (mock_aws resets boto3's default session)."""
    session = boto3.DEFAULT_SESSION
    made = getattr(session, "drill_world_clients", None) if session else None
    if made is None or service not in made:
        new = boto3.client(service, region_name="us-east-1")
        made = {**(made or {}), service: new}
        boto3.DEFAULT_SESSION.drill_world_clients = made
    return made[service]


def put(key: str, document: dict) -> None:
    client("s3").put_object(Bucket=BUCKET, Key=key, Body=json.dumps(document).encode())


def create_stack(name: str, outputs: dict[str, str] | None = None) -> None:
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}  # one moto models
    if outputs:
        template["Outputs"] = {key: {"Value": value} for key, value in outputs.items()}
    client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def records_of_a_drill(run: str) -> None:
    """What the deployed drill wrote by the end of its experiments: node-terminated judged by
    the head (pass), s3-cut started and not yet judged, with rank 0 stepping 90 s after the
    cut ended (the command's own judging passes it), the start-up records."""
    prefix = f"runs/{run}/"
    put(f"{prefix}drill/node-terminated.json", {
        "format": "horovod-fleet/drill-experiment/1", "run": run,
        "experiment": "node-terminated", "action_ids": ["aws:ec2:terminate-instances"],
        "started_at": stamp(T0 + 600), "attempt": 1, "fis_state": "completed",
        "observed": {"reset": stamp(T0 + 640), "one_replacement_per_loss": stamp(T0 + 700),
                     "replacement_joined": stamp(T0 + 1000), "one_attempt": stamp(T0 + 1000)},
        "broken": {}, "times": {"fault": stamp(T0 + 600), "detection": stamp(T0 + 640),
                                "training_again": stamp(T0 + 660),
                                "replacement_joined": stamp(T0 + 1000)},
        "verdict": "pass", "judged_at": stamp(T0 + 1000), "why": "every observation seen",
    })  # fmt: skip
    put(f"{prefix}drill/s3-cut.json", {
        "format": "horovod-fleet/drill-experiment/1", "run": run, "experiment": "s3-cut",
        "action_ids": ["aws:network:disrupt-connectivity"], "started_at": stamp(T0 + 1500),
        "attempt": 1, "fis_state": "completed", "observed": {}, "broken": {}, "times": {},
    })  # fmt: skip
    put(f"{prefix}status.json", {
        "format": "horovod-fleet/status/1", "run": run, "attempt": 1, "phase": "training",
        "progress": {"epoch": 12, "updated_at": stamp(T0 + 1650)},
    })  # fmt: skip
    put(f"{prefix}attempts.json", {"attempts": []})
    put(f"{prefix}phases/0.json", {"instance_id": "i-0", "phases": {}})


def done_of_a_drill(run: str) -> None:
    put(f"runs/{run}/DONE.json", {
        "status": "succeeded", "attempt": 1, "reason": "the drill's agreed stop",
        "timeline": {
            "phases": {
                "launch": {"s": 31.0, "slowest": "node 2 (i-2, 10.0.0.7)"},
                "boot": {"s": 74.5, "slowest": "node 1 (i-1, 10.0.0.6)"},
                "framework_start": {"s": 12.25, "slowest": "node 0 (i-0, 10.0.0.5)"},
            },
            "budget_s": {"launch": 40, "boot": 90, "framework_start": 20},
        },
    })  # fmt: skip


@dataclass
class World:
    """The stub `npx cdk` and `python -m`, and the clock. `fail` names a stack whose deploy
    exits 1; `on_destroy` runs before a stack's destroy (a Ctrl-C, say); `after_sleeps` runs at
    the n-th sleep of the run's wait (DONE.json, a KeyboardInterrupt...)."""

    run: str
    fail: str | None = None
    synth_status: int = 0
    on_destroy: dict[str, Callable[[], None]] = field(default_factory=dict)
    at_sleep: dict[int, Callable[[], None]] = field(default_factory=dict)
    sleep_step: float = 30.0
    calls: list[list[str]] = field(default_factory=list)
    python_calls: list[list[str]] = field(default_factory=list)
    now: float = T0 - 3600
    sleeps: int = 0
    training: bool = False

    def tools(self) -> Tools:
        return Tools(self.cdk, self.python, self.clock, self.sleep)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, self.sleep_step)
        if self.training:
            self.sleeps += 1
            if action := self.at_sleep.get(self.sleeps):
                action()

    def verbs(self) -> list[tuple[str, str]]:
        return [(c[0], c[1] if c[0] != "synth" else "") for c in self.calls]

    def cdk(self, argv: list[str]) -> int:
        self.calls.append(list(argv))
        verb = argv[0]
        if verb == "synth":
            return self.synth_status
        stack = argv[1]
        if verb == "destroy":
            if hook := self.on_destroy.get(stack):
                hook()
            client("cloudformation").delete_stack(StackName=stack)
            return 0
        if stack == self.fail:
            return 1
        if stack == "TeardownStack":
            client("s3").create_bucket(Bucket=BUCKET)
            create_stack("DatasetStack")
            create_stack("TeardownStack")
        elif stack == "PreprocessStack":
            create_stack("PreprocessStack")
            put("drill/tfrecords/manifest.json", {"format": "horovod-fleet/imagenet-tfrecords/1"})
        elif stack == "ImageStack":
            create_stack("ImageStack")
        elif stack == "TrainStack":
            self.now = T0
            create_stack("TrainStack", {"HorovodFleetRun": self.run,
                                        "HorovodFleetDeadline": DEADLINE})  # fmt: skip
            records_of_a_drill(self.run)
            self.now, self.training = T0 + 1700, True  # the experiments played meanwhile
        return 0

    def python(self, argv: list[str], env: dict[str, str]) -> int:
        self.python_calls.append(list(argv))
        output = Path(argv[argv.index("--output") + 1])
        output.mkdir(parents=True)
        for name in (TRAIN_TAR, VAL_TAR, VAL_LABELS):
            (output / name).write_bytes(b"sample")
        return 0


def ctrl_c() -> None:
    """The terminal's Ctrl-C: SIGINT to this process, handled by whatever handler is set."""
    signal.raise_signal(signal.SIGINT)
