"""horovod-fleet: watch a run from your terminal.

    horovod-fleet status [--run NAME] [--watch]    one screen: phase, progress, ETA, dollars, cap
    horovod-fleet logs [--run NAME] [--node N] [-f] the training table (the head's horovodrun),
                                                    or node N's bootstrap log, from CloudWatch Logs
    horovod-fleet runs                              every run in the bucket: its recipe, nodes
                                                    and type (config.json), goodput, and its
                                                    start-up measured against estimated
    horovod-fleet leftovers                         what stays billed after a run: the bucket
                                                    by prefix, snapshots, images, volumes, log
                                                    groups, each with its monthly cost and the
                                                    command that removes it (watch/leftovers.py)
    horovod-fleet enable-events --bucket NAME       your own bucket (-c datasetBucket=) sends its
                                                    events to EventBridge, its other
                                                    notifications kept (watch/bucket.py)
    horovod-fleet dataset index s3://BUCKET/PREFIX/ the manifest.json of your own TFRecords,
                                                    read and checked shard by shard
                                                    (watch/dataset.py)
    horovod-fleet hold [--run NAME] [--reason TEXT] the run controller takes no action on the
                                                    deployed run but the hard cap and cdk
                                                    destroy, so a node can be looked at
                                                    (watch/hold.py)
    horovod-fleet release [--run NAME]              hands the run back to the run controller
    horovod-fleet drill [--experiment NAME ...]     the drill on your account with AWS FIS
                                                    (about $3): deploy, judge, report, tear
                                                    down (watch/drill.py)

The run is --run, else TrainStack's; the bucket --bucket, else TrainStack's, else
horovod-fleet-<account>-<region>. AWS_ENDPOINT_URL points every call at a local endpoint (the
rehearsal's). Anything missing ends in one `error:` line and exit status 1 within seconds (a
drill's bad option, or an account it cannot run in: exit status 2, nothing deployed).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from typing import NoReturn

from botocore.config import Config

from contract import names
from contract.runs import ATTEMPTS, CONFIG, CONTROLLER, DONE, STATUS, key
from watch import dataset
from watch import drill as drill_command
from watch.aws import Fleet, RunStore, WatchError, explain
from watch.bucket import enable_eventbridge
from watch.drill_report import result_key
from watch.hold import hold as hold_run
from watch.hold import key as hold_key
from watch.hold import release as release_run
from watch.leftovers import Account, report
from watch.screen import RunFacts, parse_time, runs_table, status_screen, with_controller

REFRESH_S = 10
FOLLOW_POLL_S = 2
IN_PROGRESS = ("CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default where it has one; not "(default: None)" for a value
    found later (its help says where), nor "(default: False)" for a switch."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    def __init__(self, *args, formatter_class=DefaultsHelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see horovod-fleet --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run", help="run name (default: the run TrainStack deployed)")
    common.add_argument("--bucket", help="dataset bucket (default: TrainStack's, or "
                        "horovod-fleet-<account>-<region>)")  # fmt: skip
    common.add_argument("--region", help="AWS region (default: AWS_REGION, else us-east-1)")
    parser = OneLineParser(
        prog="horovod-fleet",
        description="Watch a horovod-fleet run: status, logs, runs; and what stays billed after it.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    status = sub.add_parser("status", parents=[common], help="one screen about a run")
    status.add_argument("--watch", action="store_true", help=f"refresh every {REFRESH_S} s")
    logs = sub.add_parser("logs", parents=[common], help="a node's log from CloudWatch Logs")
    logs.add_argument("--node", type=int, help="node index: its bootstrap log (default: the "
                      "training table, which the head's horovodrun prints)")  # fmt: skip
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--log-group", help="log group (default: TrainStack's LogGroup output)")
    sub.add_parser("runs", parents=[common], help="every run in the bucket")
    sub.add_parser(
        "leftovers",
        parents=[common],
        help="what stays billed after a run, with its monthly cost and how to remove it",
    )
    sub.add_parser(
        "enable-events",
        parents=[common],
        help="turn on EventBridge notifications for your own bucket (--bucket), keeping its "
        "other notifications",
    )
    add_dataset_parser(sub)
    held = sub.add_parser(
        "hold",
        parents=[common],
        help="the run controller takes no action on the deployed run but the hard cap and cdk "
        "destroy (no replacement, relaunch or idle delete) until `release`",
    )
    held.add_argument("--reason", help="why, on the record and the status screen")
    sub.add_parser("release", parents=[common], help="hand a held run back to the run controller")
    drill_command.add_parser(sub)
    return parser


def add_dataset_parser(sub) -> None:
    regional = argparse.ArgumentParser(add_help=False)
    regional.add_argument("--region", help="AWS region (default: AWS_REGION, else us-east-1)")
    group = sub.add_parser("dataset", help="your own TFRecords: index them for the fleet")
    commands = group.add_subparsers(
        dest="dataset_command", required=True, parser_class=OneLineParser
    )
    index = commands.add_parser(
        "index",
        parents=[regional],
        help="read the TFRecords under s3://BUCKET/PREFIX/ and write its manifest.json",
        description="Read every shard directly under the prefix (framing, CRCs, the standard "
        "schema's image/encoded and image/class/label, labels) and write the manifest.json "
        "TrainStack and the nodes take. Nothing is written when a shard is refused.",
    )
    index.add_argument("url", metavar="s3://BUCKET/PREFIX/", help="where the shards are")
    for split, pattern in dataset.DEFAULT_PATTERNS.items():
        index.add_argument(f"--{split}", metavar="GLOB", default=pattern,
                           help=f"file names of the {split} split")  # fmt: skip
    index.add_argument("--num-classes", type=int, metavar="K",
                       help="classes (default: the highest label less the base, plus one)")  # fmt: skip
    index.add_argument("--label-base", type=int, choices=(0, 1),
                       help="the first class's label (default: 0 when a label 0 is there, else "
                       "1, as build_imagenet_data.py writes)")  # fmt: skip
    index.add_argument("--workers", type=int, default=16, metavar="N", help="shards read at once")
    index.add_argument("--replace", action="store_true",
                       help="replace a manifest.json the converter wrote")  # fmt: skip


class Watcher:
    """One command's view of the account: TrainStack, the bucket, the run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fleet = Fleet.connect(args.region)
        self.fleet.read_train_stack()
        self.store = RunStore(self.fleet.client("s3"), self.fleet.bucket(args.bucket))

    def deployed_run(self) -> str | None:
        return self.fleet.outputs.get(names.RUN_OUTPUT_KEY)

    def caller(self) -> str:
        """Who runs the command, for the record: the caller's ARN."""
        return self.fleet.client("sts").get_caller_identity()["Arn"]

    def run_name(self) -> str:
        run = self.args.run or self.deployed_run()
        if not run:
            raise WatchError(
                f"no run: pass --run NAME (no TrainStack in {self.fleet.region}; "
                f"`horovod-fleet runs` lists the runs in s3://{self.store.bucket}/runs/)"
            )
        return run

    def facts(self, run: str, now: datetime | None = None) -> RunFacts:
        facts = RunFacts(
            run=run,
            bucket=self.store.bucket,
            now=now or datetime.now(timezone.utc),
            status=with_controller(
                self.store.read_json(key(run, STATUS)),
                self.store.read_json(key(run, CONTROLLER)),
            ),
            done=self.store.read_json(key(run, DONE)),
            attempts=(self.store.read_json(key(run, ATTEMPTS)) or {}).get("attempts"),
            hold=self.store.read_json(hold_key(run)),
            drill=self.store.read_json(result_key(run)),
            config=self.store.read_json(key(run, CONFIG)),
        )
        facts.nodes_up = len(self.store.nodes(run))
        if run == self.deployed_run():
            facts.stack_created = self.fleet.stack_created
            facts.hard_cap_at = parse_time(self.fleet.outputs.get(names.DEADLINE_OUTPUT_KEY))
            facts.stack_id = self.fleet.stack_id
            if self.fleet.stack_status == "CREATE_IN_PROGRESS":
                facts.stack_phase = "booting"
        nothing_yet = facts.status is None and facts.stack_phase is None and facts.done is None
        if nothing_yet and self.fleet.image_stack_status() in IN_PROGRESS:
            facts.stack_phase = "image_bake"
        return facts

    def require(self, facts: RunFacts) -> RunFacts:
        if facts.status or facts.done or facts.stack_phase or facts.nodes_up:
            return facts
        known = self.store.runs()
        listed = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "") if known else "none"
        raise WatchError(
            f"run {facts.run!r} not found: nothing in s3://{facts.bucket}/runs/{facts.run}/ and "
            f"TrainStack is not deploying it (runs in the bucket: {listed})"
        )


def status(watcher: Watcher) -> int:
    run = watcher.run_name()
    while True:
        screen = status_screen(watcher.require(watcher.facts(run)))
        if not watcher.args.watch:
            print(screen, end="")
            return 0
        print("\033[2J\033[H" + screen, end="", flush=True)  # clear, then draw
        time.sleep(REFRESH_S)


def runs(watcher: Watcher) -> int:
    rows = [watcher.facts(run) for run in watcher.store.runs()]
    if not rows:
        print(f"no runs in s3://{watcher.store.bucket}/runs/")
        return 0
    print(runs_table(rows), end="")
    return 0


def logs(watcher: Watcher) -> int:
    args = watcher.args
    run = watcher.run_name()
    group = args.log_group or watcher.fleet.outputs.get("LogGroup")
    if not group:
        raise WatchError("no log group: pass --log-group (TrainStack has no LogGroup output)")
    if args.node is None:
        node = watcher.store.head(run)
        if node is None:
            raise WatchError(
                f"the head of run {run!r} has not started (no s3://{watcher.store.bucket}/runs/"
                f"{run}/head.json): no instance to read the training table of"
            )
    else:
        node = watcher.store.nodes(run).get(args.node)
        if node is None:
            raise WatchError(
                f"node {args.node} of run {run!r} has not registered in "
                f"s3://{watcher.store.bucket}/runs/{run}/nodes/: no instance to read the log of"
            )
    name = "train.log" if args.node is None else "bootstrap.log"
    stream = f"{node['instance_id']}/{name}"
    client = watcher.fleet.client("logs")
    kwargs = {"logGroupName": group, "logStreamNames": [stream]}
    seen: set[str] = set()
    while True:
        token = None
        while True:
            page = client.filter_log_events(**kwargs, **({"nextToken": token} if token else {}))
            for event in page.get("events", []):
                if event["eventId"] not in seen:
                    seen.add(event["eventId"])
                    print(event["message"].rstrip("\n"), flush=True)
                    kwargs["startTime"] = event["timestamp"]
            token = page.get("nextToken")
            if not token:
                break
        if not args.follow:
            return 0
        time.sleep(FOLLOW_POLL_S)


def leftovers(args: argparse.Namespace) -> int:
    fleet = Fleet.connect(args.region)
    fleet.read_train_stack()
    account = Account(fleet.client, fleet.bucket(args.bucket))
    rows = account.leftovers()
    deployed = [name for name in account.deployed_stacks() if name != "DatasetStack"]
    if deployed:
        account.notes.append(
            f"still deployed: {', '.join(deployed)} (what each bills while deployed: "
            "docs/cost.md; npx cdk destroy NAME, TeardownStack last)"
        )
    print(report(rows, account.notes, f"{fleet.region}, bucket {account.bucket}"), end="")
    return 0


def enable_events(args: argparse.Namespace) -> int:
    if not args.bucket:
        raise WatchError(
            "enable-events needs --bucket NAME: the bucket you deploy with -c datasetBucket="
        )
    print(enable_eventbridge(Fleet.connect(args.region).client("s3"), args.bucket))
    return 0


def dataset_index(args: argparse.Namespace) -> int:
    bucket, prefix = dataset.parse_url(args.url)
    if args.num_classes is not None and args.num_classes < 2:
        raise WatchError(f"--num-classes must be 2 or more, got {args.num_classes}")
    if not 1 <= args.workers <= 256:
        raise WatchError(f"--workers must be between 1 and 256, got {args.workers}")
    request = dataset.Request(
        bucket, prefix, {"train": args.train, "validation": args.validation},
        args.num_classes, args.label_base, args.workers, args.replace,
    )  # fmt: skip
    config = dataset.INDEX_CLIENT.merge(Config(max_pool_connections=args.workers + 2))
    s3 = Fleet.connect(args.region).session.client("s3", config=config)
    try:
        manifest = dataset.index(s3, request, sys.stderr, lambda line: print(line, file=sys.stderr))
    except KeyboardInterrupt:
        raise WatchError(f"interrupted: no manifest written to {request.url}") from None
    print(dataset.summary(request, manifest))
    return 0


def hold(watcher: Watcher) -> int:
    args = watcher.args
    print(hold_run(watcher.fleet, watcher.store, args.run, args.reason, watcher.caller()))
    return 0


def release(watcher: Watcher) -> int:
    print(release_run(watcher.fleet, watcher.store, watcher.args.run, watcher.caller()))
    return 0


COMMANDS = {"status": status, "runs": runs, "logs": logs, "hold": hold, "release": release}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            if args.command == "enable-events":
                return enable_events(args)
            if args.command == "leftovers":
                return leftovers(args)
            if args.command == "dataset":
                return dataset_index(args)
            if args.command == "drill":
                return drill_command.command(args)
            return COMMANDS[args.command](Watcher(args))
        except WatchError:
            raise
        except Exception as exc:  # AWS said no, or could not be reached: one line
            raise explain(exc) from None
    except WatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "status", 1)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
