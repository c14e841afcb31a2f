"""`horovod-fleet drill`: the drill of issue 49 on your own account, for a few dollars, before
the first expensive run (docs/faults-and-recovery.md, "The drill").

    horovod-fleet drill [--region R] [--run NAME] [--instance-type T] [--market M]
                        [--experiment NAME ...] [--no-preprocess] [--confirm-cost] [--keep]

1. Checks what it can before anything exists: its options (one line and exit 2 for a bad one),
   that no TrainStack is deployed (a drill deploys its own, and destroys it), that no
   PreprocessStack is (when it converts on AWS), and that the run has no DONE.json yet. Then
   `npx cdk synth` with the drill's context: the app validates it (its one line and exit 2:
   nothing deployed) and prints the plan, its length and its cost.
2. Deploys with the pinned CDK CLI (`npx --no-install cdk deploy STACK --require-approval never
   -c drill=true -c run=RUN ...`; "never": the CLI asks no approval, which a command that runs
   alone cannot give, https://docs.aws.amazon.com/cdk/api/v2/docs/aws-cdk-lib.cloud_assembly_schema.RequireApproval.html),
   in the README's order: TeardownStack (DatasetStack with it: "deploys ... dependencies" unless
   --exclusively, https://docs.aws.amazon.com/cdk/v2/guide/ref-cli-cmd-deploy.html), the drill's
   dataset (`python -m trainer.preprocess.sample`, run as a process as the rehearsal does: its
   archives under contract/drill.py's raw prefix; with --no-preprocess converted here by
   `python -m trainer.preprocess` straight into the TFRecords prefix), PreprocessStack, ImageStack
   (a bake the first time, nothing when the image is there; the conversion goes on meanwhile),
   the wait for the dataset's manifest.json, TrainStack.
3. Waits for the run's end by reading S3 every POLL_S: DONE.json `succeeded` (the head's agreed
   stop once every experiment is judged), or TrainStack gone or going (the run controller ended
   the run), bounded by TrainStack's hard cap (its HorovodFleetDeadline output) plus WAIT_MARGIN_S.
4. Judges and reports (watch/drill_report.py): the table, the start-up timeline, drill.json.
5. Tears down, whatever happened after the first deploy began (watch/drill_teardown.py), unless
   --keep, then says whether anything still bills.

Everything that acts is passed in: `cdk` runs the CDK CLI, `python` a Python module, both in
the checkout; `clock` and `sleep` time the waits. The tests give stubs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from botocore.exceptions import ClientError

from contract import drill
from contract.names import DEADLINE_OUTPUT_KEY
from contract.runs import parse_stamp_s
from watch import drill_report
from watch.aws import Fleet, RunStore, WatchError, explain, region_of
from watch.drill_teardown import BILLS_BY_THE_HOUR, Teardown, account_check, stack_status
from watch.hold import checked_run

POLL_S = 30
PROGRESS_EVERY_S = 300  # a line while waiting at least this often, and at each change
# After the hard cap: the run controller's delete of the fleet and the head's last records.
WAIT_MARGIN_S = 1200
# From PreprocessStack's deploy to the drill's manifest.json: its node's boot and install and a
# few MB converted (stacks/drill_plan.py budgets 15 minutes).
MANIFEST_WAIT_S = 2700
STOP_CHILD_S = 30  # how long the CDK CLI gets to end on Ctrl-C before it is killed
# The ILSVRC files `python -m trainer.preprocess.sample` writes (trainer/preprocess/sample.py),
# the names the preprocessing node waits for under the raw prefix.
TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
VAL_LABELS = "ILSVRC2012_validation_ground_truth.txt"
MARKETS = ("on-demand", "spot")
# TrainStack in these has no fleet any more (a create rolled back, or deleted or going).
OVER = ("DELETE_IN_PROGRESS", "DELETE_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_IN_PROGRESS")


class BadInput(WatchError):
    """A bad option or an account the drill cannot run in: nothing was deployed (exit 2)."""

    status = 2


class DrillFailed(Exception):
    """A step after the first deploy began failed: the drill tears down."""


def default_run(now: datetime | None = None) -> str:
    return f"drill-{(now or datetime.now(timezone.utc)).strftime('%Y%m%d-%H%M')}"


def add_parser(sub) -> None:
    every = ", ".join(e.name for e in drill.EXPERIMENTS)
    parser = sub.add_parser(
        "drill",
        help="rehearse the faults on your account with AWS FIS on a cheap fleet (about $3), "
        "print the table and the start-up timeline, and tear down",
        description="Deploy the drill (-c drill=true), let its head play each experiment "
        "through AWS FIS while a 3-node fleet trains on a generated dataset, judge them, print "
        "the table and the start-up measured on real instances, write runs/<run>/drill.json, "
        "and tear down what bills by the hour. Ctrl-C or a failure still tears down.",
    )
    parser.add_argument("--region", default=region_of(None), help="AWS region of every stack")
    parser.add_argument("--run", default=default_run(), help="run name: runs/<run>/ in S3")
    parser.add_argument("--instance-type", default=drill.DEFAULT_INSTANCE_TYPE,
                        help="GPU type of the drill's nodes; a P-family type needs "
                        "--confirm-cost")  # fmt: skip
    parser.add_argument("--market", choices=MARKETS, default="on-demand",
                        help="how the GPU nodes are bought; spot adds the Spot notice "
                        "experiment")  # fmt: skip
    parser.add_argument("--experiment", action="append", metavar="NAME",
                        help=f"play only this experiment, repeatable (default: every one of the "
                        f"market's, of {every})")  # fmt: skip
    parser.add_argument("--no-preprocess", action="store_true",
                        help="convert the drill's dataset on this machine instead of with "
                        "PreprocessStack on AWS (default: PreprocessStack converts it)")  # fmt: skip
    parser.add_argument("--confirm-cost", action="store_true",
                        help="allow a P-family --instance-type, at its own price (default: "
                        "refused)")  # fmt: skip
    parser.add_argument("--keep", action="store_true",
                        help="tear nothing down at the end: the fleet bills until the run "
                        "controller deletes it (default: tear down)")  # fmt: skip


@dataclass(frozen=True)
class Request:
    """The validated options."""

    region: str
    run: str
    instance_type: str
    market: str
    experiments: tuple[drill.Experiment, ...]
    names: tuple[str, ...]  # --experiment as given (empty: all of the market's)
    preprocess: bool
    confirm_cost: bool
    keep: bool

    @classmethod
    def of(cls, args: argparse.Namespace) -> Request:
        names = tuple(args.experiment or ())
        try:
            experiments = drill.plan(args.market, names)
        except drill.UnknownExperiment as exc:
            raise BadInput(f"--experiment: {exc}") from None
        try:
            checked_run(args.run)
        except WatchError as exc:
            raise BadInput(str(exc)) from None
        if spot_only := [n for n in names if n not in {e.name for e in experiments}]:
            raise BadInput(
                f"--experiment {', '.join(spot_only)} plays only with --market spot; "
                f"--market {args.market} plays: {', '.join(e.name for e in drill.plan(args.market))}"
            )
        if args.instance_type.startswith("p") and not args.confirm_cost:
            raise BadInput(
                f"--instance-type {args.instance_type} is a P-family type, far over a drill's "
                f"few dollars: pass --confirm-cost to drill on it, or a G type (default "
                f"{drill.DEFAULT_INSTANCE_TYPE})"
            )
        return cls(args.region, args.run, args.instance_type, args.market, experiments, names,
                   not args.no_preprocess, args.confirm_cost, args.keep)  # fmt: skip

    def flags(self) -> list[str]:
        """The CDK context every `npx cdk` of the drill gets: the same app each time."""
        context = {"drill": "true", "run": self.run, "region": self.region,
                   "instanceType": self.instance_type, "market": self.market}  # fmt: skip
        if self.names:
            context["drillExperiments"] = ",".join(self.names)
        if not self.preprocess:
            context["drillPreprocess"] = "false"
        if self.confirm_cost:
            context["drillConfirmCost"] = "true"
        return [part for key, value in context.items() for part in ("-c", f"{key}={value}")]


class Processes:
    """The real commands, run in the checkout: the pinned CDK CLI (`npx --no-install cdk`, with
    node_modules/.bin and .venv/bin first on PATH as the Makefile puts them) and `python -m`.
    Each runs in a session of its own: Ctrl-C reaches this process, which stops the child
    (SIGINT to its group, then SIGKILL after STOP_CHILD_S) and goes on to the teardown."""

    def __init__(self, root: Path) -> None:
        if not (root / "cdk.json").is_file() or not (root / "app.py").is_file():
            raise BadInput(
                f"horovod-fleet drill deploys from the project's checkout, and {root} is not "
                "one: run make setup in a clone of horovod-fleet and use its .venv/bin/horovod-fleet"
            )
        if not (root / "node_modules" / ".bin" / "cdk").exists():
            raise BadInput(f"no pinned CDK CLI in {root}/node_modules: run make setup there")
        self.root = root

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        path = os.pathsep.join(
            [str(self.root / "node_modules" / ".bin"), str(self.root / ".venv" / "bin"),
             os.environ.get("PATH", "")]
        )  # fmt: skip
        return {**os.environ, "PATH": path, **(extra or {})}

    def cdk(self, argv: list[str]) -> int:
        return self.run(["npx", "--no-install", "cdk", *argv], self.env())

    def python(self, argv: list[str], env: dict[str, str]) -> int:
        return self.run([sys.executable, *argv], self.env(env))

    def run(self, command: list[str], env: dict[str, str]) -> int:
        child = subprocess.Popen(command, cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                 start_new_session=True)  # fmt: skip
        try:
            return child.wait()
        except KeyboardInterrupt:
            with_signal(child, signal.SIGINT)
            try:
                child.wait(STOP_CHILD_S)
            except subprocess.TimeoutExpired:
                with_signal(child, signal.SIGKILL)
                child.wait()
            raise


def with_signal(child: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(child.pid, signum)


@dataclass(frozen=True)
class Tools:
    """What the drill acts with: `cdk` runs the CDK CLI with the arguments after `npx cdk`,
    `python` a Python command line with extra environment, both returning the exit status;
    `clock` and `sleep` time its waits."""

    cdk: Callable[[list[str]], int]
    python: Callable[[list[str], dict[str, str]], int]
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


def tools_for(root: Path) -> Tools:
    processes = Processes(root)
    return Tools(processes.cdk, processes.python)


@dataclass
class Drill:
    request: Request
    fleet: Fleet
    tools: Tools
    where: str  # the checkout, for the commands it prints
    dataset: drill.Dataset = drill.DATASET
    deployed: list[str] = field(default_factory=list)  # stacks whose deploy began
    store: RunStore | None = None

    def say(self, line: str) -> None:
        print(f"drill: {line}", flush=True)

    def run(self) -> int:
        self.preflight()
        self.say(f"synthesizing: npx cdk synth {' '.join(self.request.flags())}")
        if self.tools.cdk(["synth", "--quiet", *self.request.flags()]) != 0:
            raise BadInput("synthesis refused the drill's configuration (its line above): "
                           "nothing deployed")  # fmt: skip
        if self.request.keep:
            self.say("--keep: NOTHING WILL BE TORN DOWN at the end; the fleet bills until the "
                     "run controller deletes TrainStack (the run's end, idle, or its hard cap)")  # fmt: skip
        failure, interrupted, document = None, False, None
        try:
            try:
                self.deploy_and_wait()
            except KeyboardInterrupt:
                interrupted = True
                self.say("interrupted (Ctrl-C): tearing down what the drill deployed")
            except (DrillFailed, WatchError) as exc:
                failure = str(exc)
            except Exception as exc:  # AWS said no, or could not be reached
                failure = str(explain(exc))
            if failure:
                self.say(f"FAILED: {failure}; tearing down what the drill deployed")
            if "TrainStack" in self.deployed:
                document = self.report()
        finally:
            still = self.end()
        if interrupted:
            return 130
        passed = document is not None and not document["failed"]
        return 0 if passed and not failure and (self.request.keep or not still) else 1

    # --- before anything is deployed --------------------------------------------------------

    def preflight(self) -> None:
        cloudformation = self.fleet.client("cloudformation")
        train = stack_status(cloudformation, "TrainStack")
        if train is not None:
            raise BadInput(
                f"TrainStack is deployed in {self.fleet.region} ({train}): a drill deploys and "
                "destroys its own; let that run end, or npx cdk destroy TrainStack, first"
            )
        converter = stack_status(cloudformation, "PreprocessStack")
        if self.request.preprocess and converter is not None:
            raise BadInput(
                f"PreprocessStack is deployed in {self.fleet.region} ({converter}): a drill "
                "converts its dataset with its own and destroys it; npx cdk destroy "
                "PreprocessStack first, or pass --no-preprocess"
            )
        store = RunStore(self.fleet.client("s3"), self.fleet.bucket(None))
        try:
            done = store.read_json(f"runs/{self.request.run}/DONE.json")
        except WatchError:  # no bucket yet: the drill's first deploy makes it
            done = None
        if done is not None:
            raise BadInput(
                f"run {self.request.run} already ended ({done.get('status')}, "
                f"s3://{store.bucket}/runs/{self.request.run}/DONE.json): pass another --run "
                "(default: a dated name)"
            )

    # --- the deploys and the wait -----------------------------------------------------------

    def deploy(self, stack: str, why: str) -> None:
        self.deployed.append(stack)
        self.say(f"deploying {stack} ({why})")
        code = self.tools.cdk(
            ["deploy", stack, "--require-approval", "never", *self.request.flags()]
        )
        if code != 0:
            raise DrillFailed(f"npx cdk deploy {stack} exited {code} (its output above)")

    def deploy_and_wait(self) -> None:
        request = self.request
        self.deploy("TeardownStack", "the run controller, and DatasetStack's bucket with it")
        self.store = RunStore(self.fleet.client("s3"), self.fleet.bucket(None))
        self.put_dataset()
        if request.preprocess:
            self.deploy("PreprocessStack", "converts the drill's dataset on AWS")
        self.deploy("ImageStack", "the training image: about 3 hours the first time, then "
                    "nothing to do")  # fmt: skip
        self.wait_for_manifest()
        self.deploy("TrainStack", f"the drill's fleet: {request.instance_type} nodes and "
                    f"FIS's templates of {', '.join(e.name for e in request.experiments)}")  # fmt: skip
        self.wait_for_the_run()

    def put_dataset(self) -> None:
        data, store = self.dataset, self.store
        region = {"AWS_REGION": self.request.region, "AWS_DEFAULT_REGION": self.request.region}
        with tempfile.TemporaryDirectory(prefix="horovod-fleet-drill-") as tmp:
            raw = Path(tmp) / "raw"
            self.say(f"generating the drill's dataset ({data.classes} classes) in {raw}")
            sample = ["-m", "trainer.preprocess.sample", "--output", str(raw), "--classes",
                      str(data.classes), "--train-per-class", str(data.train_per_class),
                      "--val-images", str(data.val_images)]  # fmt: skip
            if self.tools.python(sample, region) != 0:
                raise DrillFailed("python -m trainer.preprocess.sample failed (its line above)")
            if self.request.preprocess:
                for name in (TRAIN_TAR, VAL_TAR, VAL_LABELS):
                    store.s3.upload_file(str(raw / name), store.bucket, data.raw_prefix + name)
                self.say(f"uploaded the sample to s3://{store.bucket}/{data.raw_prefix}")
                return
            output = f"s3://{store.bucket}/{data.tfrecords_prefix}"
            self.say(f"converting it on this machine into {output} (--no-preprocess)")
            convert = ["-m", "trainer.preprocess", "--train-tar", str(raw / TRAIN_TAR),
                       "--val-tar", str(raw / VAL_TAR), "--val-labels", str(raw / VAL_LABELS),
                       "--output", output, "--train-shards", str(data.train_shards),
                       "--val-shards", str(data.val_shards)]  # fmt: skip
            if self.tools.python(convert, region) != 0:
                raise DrillFailed("python -m trainer.preprocess failed (its line above)")

    def wait_for_manifest(self) -> None:
        key = f"{self.dataset.tfrecords_prefix}manifest.json"
        until = self.tools.clock() + MANIFEST_WAIT_S
        while self.store.read_json(key) is None:
            if self.tools.clock() >= until:
                raise DrillFailed(
                    f"no s3://{self.store.bucket}/{key} {MANIFEST_WAIT_S // 60} min after "
                    "PreprocessStack's deploy: its converter's log is its LogGroup output"
                )
            self.tools.sleep(POLL_S)
        self.say(f"the drill's dataset is converted: s3://{self.store.bucket}/{key}")

    def wait_for_the_run(self) -> None:
        """Until DONE.json says succeeded, TrainStack is gone or going, or the hard cap plus
        WAIT_MARGIN_S passed; DrillFailed for the last two."""
        run, store = self.request.run, self.store
        self.fleet.read_train_stack()
        deadline = self.fleet.outputs.get(DEADLINE_OUTPUT_KEY)
        if not deadline:
            raise DrillFailed(f"TrainStack has no {DEADLINE_OUTPUT_KEY} output: no hard cap to "
                              "wait within")  # fmt: skip
        bound = parse_stamp_s(deadline) + WAIT_MARGIN_S
        self.say(f"waiting for runs/{run}/DONE.json (the hard cap is {deadline}; "
                 f"waiting at most until {WAIT_MARGIN_S // 60} min after it)")  # fmt: skip
        shown, shown_at = None, 0.0
        while True:
            done = store.read_json(f"runs/{run}/DONE.json")
            if done and done.get("status") == "succeeded":
                self.say(f"the run succeeded: {done.get('reason') or 'the agreed stop'}")
                return
            status = stack_status(self.fleet.client("cloudformation"), "TrainStack")
            if status is None or status in OVER:
                raise DrillFailed(
                    f"TrainStack is {status or 'deleted'}: the run controller ended the run "
                    f"({(done or {}).get('status') or 'no DONE.json'}: "
                    f"{(done or {}).get('reason') or 'no reason given'})"
                )
            if self.tools.clock() >= bound:
                raise DrillFailed(
                    f"no DONE.json of a finished run {WAIT_MARGIN_S // 60} min after the hard "
                    f"cap ({deadline}): stopped waiting"
                )
            records, mine = drill_report.read_run(store, run)
            line = drill_report.progress(records, self.request.experiments, mine)
            if line != shown or self.tools.clock() - shown_at >= PROGRESS_EVERY_S:
                self.say(line)
                shown, shown_at = line, self.tools.clock()
            self.tools.sleep(POLL_S)

    # --- the end ----------------------------------------------------------------------------

    def report(self) -> dict | None:
        """Judge, print the table and the timeline, write drill.json; None when it could not
        (said in one line)."""
        request = self.request
        try:
            records, mine = drill_report.read_run(self.store, request.run)
            now = self.tools.clock()
            mine = drill_report.judged(request.experiments, mine, records, now)
            document = drill_report.result(
                request.run, request.experiments, mine, records.done, now,
                region=request.region, instance_type=request.instance_type,
                market=request.market,
            )  # fmt: skip
            print(drill_report.report(document), end="", flush=True)
            self.say(f"the table is in {drill_report.write_result(self.store, document)}")
            return document
        except (KeyboardInterrupt, Exception) as exc:  # the teardown comes first
            text = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else explain(exc)
            self.say(f"no report: {text}")
            return None

    def end(self) -> list[str]:
        """Tear down (unless --keep), then read the account; what still bills by the hour."""
        request = self.request
        stacks = [s for s in BILLS_BY_THE_HOUR if s in self.deployed]
        if request.keep:
            self.say(f"--keep: NOTHING TORN DOWN; still deployed: {', '.join(self.deployed)}")
        elif stacks:
            tools = self.tools
            Teardown(tools.cdk, self.fleet.client("cloudformation"), request.flags(), self.say,
                     tools.clock, tools.sleep, self.where).run(stacks)  # fmt: skip
        try:
            screen, hourly = account_check(self.fleet.client, self.fleet.bucket(None),
                                           self.fleet.region)  # fmt: skip
        except (KeyboardInterrupt, Exception) as exc:
            text = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else explain(exc)
            self.say(f"could not read what still bills ({text}): run horovod-fleet leftovers "
                     f"--region {request.region}")  # fmt: skip
            return ["unknown"]
        print(screen, end="", flush=True)
        if hourly:
            self.say(f"STILL BILLING BY THE HOUR: {'; '.join(hourly)}")
        else:
            self.say("nothing bills by the hour: TrainStack and PreprocessStack are gone and no "
                     "instance of the app runs; what bills every month is listed above")  # fmt: skip
        return hourly


def command(args: argparse.Namespace) -> int:
    """`horovod-fleet drill` with the real commands; watch/cli.py's one line on WatchError."""
    request = Request.of(args)
    root = Path(__file__).resolve().parents[1]
    tools = tools_for(root)
    fleet = Fleet.connect(request.region)
    try:
        return Drill(request, fleet, tools, str(root)).run()
    except ClientError as exc:
        raise explain(exc) from None
