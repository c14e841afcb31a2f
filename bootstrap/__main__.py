"""The node bootstrap's command line; the shell scripts exec it for everything that is logic.

    python3 -m bootstrap cloudwatch-config PATH  write the CloudWatch agent config
    python3 -m bootstrap preprocess-node       raw archives -> s3://<bucket>/tfrecords/, signal, stop
    python3 -m bootstrap train-node            health, data pull, signal, rendezvous, train, DONE.json
    python3 -m bootstrap fail STEP REASON      report a failed shell step (signal, DONE.json, stop)

All take --node-json PATH (default /etc/horovod-fleet/node.json). A bad node.json or command line
ends with one line naming the mistake and exit code 2.

Which instance runs what: the preprocessing node PreprocessingNode (bootstrap/preprocess/); the
training fleet's head Head (bootstrap/head/) and each of its nodes Member (bootstrap/fleet/),
each after what every instance of the fleet runs (TrainingNode, bootstrap/node/).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bootstrap import aws
from bootstrap.cli import OneLineErrorParser, usage_error
from bootstrap.head.head import Head
from bootstrap.lines import REASON_LIMIT, one_line
from bootstrap.member import Member
from bootstrap.node import assignment, health, spot
from bootstrap.node.attempt import Attempt
from bootstrap.node_config import DEFAULT_PATH, ConfigError, PreprocessConfig, TrainConfig, load
from bootstrap.preprocess.preprocessing_node import PreprocessingNode
from bootstrap.steps import STEP_CAUSES, Interrupted, StepFailed, interrupt_on_sigterm, step
from contract import causes


def node_for(cfg, attempt: Attempt) -> PreprocessingNode | Head | Member:
    """The bootstrap of the instance node.json describes."""
    if isinstance(cfg, PreprocessConfig):
        return PreprocessingNode(cfg)
    return Head(cfg, attempt) if cfg.is_head else Member(cfg, attempt)


def as_launched(cfg: TrainConfig, command: str) -> TrainConfig:
    """A replacement node's node.json names no index: it is the node its launch assignment
    names (bootstrap/node/assignment.py). train-node waits for it; a failure report of a shell
    step before it reads it once, so a failure is not reported ten minutes late."""
    wait_s = assignment.WAIT_S if command == "train-node" else 0
    return step(
        "launch assignment",
        lambda: assignment.assigned(
            cfg, aws.s3_client(cfg.region), aws.instance_id(cfg), wait_s=wait_s
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python3 -m bootstrap", description=__doc__.split("\n")[0])
    parser.add_argument("--node-json", default=DEFAULT_PATH, help="the node's configuration")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cloudwatch-config").add_argument("path")
    sub.add_parser("preprocess-node")
    sub.add_parser("train-node")
    fail = sub.add_parser("fail")
    fail.add_argument("step")
    fail.add_argument("reason")
    args = parser.parse_args(argv)
    try:
        cfg = load(args.node_json)
    except ConfigError as exc:
        return usage_error(str(exc))
    # s5cmd and the trainer's boto3 clients run as children: without a region s5cmd asks S3 for
    # the bucket's with HeadBucket, which the node's prefix-scoped role is denied.
    os.environ.setdefault("AWS_REGION", cfg.region)
    if args.command == "cloudwatch-config":
        try:
            health.write_cloudwatch_config(cfg, args.path)
        except OSError as exc:
            return usage_error(
                f"cannot write the CloudWatch agent config {args.path}: {exc.strerror}"
            )
        return 0
    if (
        isinstance(cfg, TrainConfig)
        and cfg.node_index is None
        and not cfg.is_head
        and args.command != "cloudwatch-config"
    ):
        try:
            cfg = as_launched(cfg, args.command)
        except StepFailed as failure:  # no index, so no node to report as: the line is all
            aws.log(f"FAILED: {failure} (cause {failure.cause})")
            return 1
    attempt = Attempt()
    node = node_for(cfg, attempt)
    try:
        if args.command == "fail":
            raise StepFailed(args.step, args.reason, STEP_CAUSES.get(args.step, causes.UNKNOWN))
        if args.command == "preprocess-node" and isinstance(cfg, PreprocessConfig):
            node.run()
        elif args.command == "train-node" and isinstance(cfg, TrainConfig):
            aws.log_fallback[:] = [Path(cfg.log_dir) / "bootstrap.log"]
            interrupt_on_sigterm()
            # For the node's whole run: a notice may come in any step, on any node.
            with spot.watching(cfg):
                node.run()
        else:
            return usage_error(f"node.json role '{cfg.role}' cannot run {args.command}")
    except Interrupted as exc:  # between steps
        node.report(StepFailed("between steps", str(exc), causes.INTERRUPTED, "interrupted"))
        return 1
    except StepFailed as failure:
        node.report(failure)
        return 1
    except Exception as exc:  # a bug between steps: still reported, never a silent death
        node.report(StepFailed("bootstrap", one_line(exc, REASON_LIMIT), causes.UNKNOWN))
        return 1
    finally:
        attempt.end()  # this bootstrap ended it: a next start is a new attempt, not a restart
    return 0


if __name__ == "__main__":
    sys.exit(main())
