"""The whole run on one machine, no AWS account: `make rehearsal`, or

    .venv/bin/python -m rehearsal [--nodes 2] [--epochs 3] [--rerun-epochs 4] [--workdir DIR]

1. moto_server is the S3 endpoint (AWS_ENDPOINT_URL for every process below).
2. `python -m trainer.preprocess.sample` writes small ILSVRC-shaped archives; they go to
   s3://.../raw/ exactly where users upload the real ones.
3. bootstrap/preprocess_node.sh converts them to s3://.../tfrecords/ (node.json without volume,
   installs or stop).
4. N nodes run bootstrap/train_node.sh: as root with `ip netns` and sshd, each node is a network
   namespace with its own address, sshd and /data; otherwise separate processes on 127.0.0.1.
   They pull and verify the data, register, exchange the run's SSH key; node 0 writes the
   hostfile and runs horovodrun over Gloo/TCP across the nodes: ResNet-18 on 32x32 images, CPU.
5. Node 0 uploads checkpoints, logs and eval.json and writes runs/<run>/DONE.json.
6. The nodes "reboot" and run again with more epochs: the data pull is skipped (verified), the
   key reused, and training resumes from the checkpoint in S3 (node 0's local copy is wiped).

Prints the training table and the final accuracy; exits non-zero naming the step that failed.
Cleans up its processes, namespaces and bridge on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from bootstrap.cli import OneLineErrorParser
from rehearsal.common import MAX_RESTARTS, say
from rehearsal.core import Rehearsal


def raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def build_parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(
        prog="python -m rehearsal",
        description="The whole run (local S3, preprocessing, N nodes training over Horovod) on one "
        "machine, with no AWS account.",
    )
    parser.add_argument("--nodes", type=int, default=2, help="simulated training nodes")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs")
    parser.add_argument(
        "--rerun-epochs",
        type=int,
        default=4,
        help="then reboot the nodes and rerun the same run with this many epochs: it must "
        "resume from the checkpoint in S3 (0: no rerun)",
    )
    parser.add_argument("--classes", type=int, default=10, help="classes in the sample dataset")
    parser.add_argument("--per-class", type=int, default=48, help="training images per class")
    parser.add_argument("--val-images", type=int, default=100, help="validation images")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("rehearsal-output"),
        help="emptied, then filled with the run's files and logs",
    )
    parser.add_argument(
        "--timeout", type=float, default=1200, help="seconds for the training nodes"
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=MAX_RESTARTS,
        choices=range(0, 21),
        metavar="{0..20}",
        help="relaunches of the fleet the run controller may decide after a retryable failure "
        "(TrainStack's maxRestarts)",
    )
    parser.add_argument(
        "--processes", action="store_true", help="separate processes even where namespaces work"
    )
    parser.add_argument(
        "--pull-mb-per-s",
        type=float,
        default=0,
        metavar="MB",
        help="the local S3 serves each node's TFRecords at most this fast (0: as fast as it "
        "can): a pull that takes visible time, to measure the start-up beside it",
    )
    parser.add_argument(
        "--faults",
        action="store_true",
        help="the fault rehearsal instead: one fault per training attempt (S3 outages, a killed "
        "rank, a stopped node, a corrupted shard), then a table of expected and observed outcomes",
    )
    parser.add_argument(
        "--fault",
        action="append",
        metavar="TEXT",
        help="with --faults: only the rows whose name contains TEXT (repeatable), each from its snapshot",
    )
    parser.add_argument(
        "--rows",
        choices=("all", "ci"),
        default="all",
        help="with --faults: every row, or CI's subset (the rows docs/rehearsal.md marks in CI)",
    )
    parser.add_argument(
        "--drill",
        action="store_true",
        help="the drill instead: the experiments AWS FIS plays with -c drill=true "
        "(contract/drill.py), played by the run's head on 3 simulated nodes, then the judge's "
        "table (rehearsal/drill.py; root)",
    )
    parser.add_argument(
        "--market",
        choices=("on-demand", "spot"),
        default="on-demand",
        help="with --drill: the fleet's market; spot plays the Spot notice too",
    )
    parser.add_argument(
        "--experiment",
        action="append",
        metavar="NAME",
        help="with --drill: only this experiment of the drill (repeatable), as -c "
        "drillExperiments keeps some",
    )
    parser.add_argument(
        "--benchmark",
        action="store_true",
        help="the fleet benchmark instead of a run: 1 rank, 1 node, 2 nodes (rehearsal/benchmark.py)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Ctrl-C and SIGTERM both end up in Rehearsal.run's cleanup; a caller in the same process
    # (the tests) gets its own SIGTERM handler back.
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        return rehearse(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def rehearse(args: argparse.Namespace) -> int:
    if args.benchmark:
        from rehearsal.benchmark import BenchmarkRehearsal

        rehearsal = BenchmarkRehearsal(args)
    else:
        rehearsal = Rehearsal(args)
    try:
        if args.faults:
            from rehearsal.faults import run_faults

            return run_faults(rehearsal)
        if args.drill:
            from rehearsal.drill import run_drill

            return run_drill(rehearsal)
        return rehearsal.run()
    except KeyboardInterrupt:
        say(f"interrupted at step '{rehearsal.step}': cleaned up")
        return 130


if __name__ == "__main__":
    sys.exit(main())
