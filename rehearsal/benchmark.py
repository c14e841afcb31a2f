"""`python -m rehearsal --benchmark`: the fleet benchmark's schedule on the rehearsal's nodes.

The same bootstrap as a fleet in benchmark mode (node.json `benchmark`, docs/contracts.md): the
nodes start, find each other through the local S3, and the head runs trainer.benchmark at 1 rank,
1 node and 2 nodes, then the allreduce check on the same ranks, prints the table row by row and
writes runs/rehearsal/benchmark.{json,md,png} and DONE.json. No preprocessing: the synthetic
benchmark reads no data. CPU ranks (2 per simulated node) and ResNet-18 at 32x32 keep it to a
minute or two: the figures show the machinery works, they say nothing about GPUs.

The schedule is the fleet's own: node.json's `benchmark` object as stacks/benchmark.py makes it,
printed by `python -m stacks.benchmark` (docs/contracts.md) for the rehearsal's nodes with 2
ranks each; only the warm-up and timed steps are the rehearsal's, as its trainer settings are.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

from contract import runs
from rehearsal.common import BUCKET, REPO, RUN, StepFailed, say
from rehearsal.core import Rehearsal

RANKS_PER_NODE = 2  # CPU ranks per simulated node, so that 1 rank and 1 node are two rows
WARMUP_STEPS = 1
TIMED_STEPS = 4
BATCH_PER_RANK = 8
# The allreduce check's buffer (MiB): 256 MiB over Gloo on a shared CPU takes ~3 s a round.
CHECK_MIB = "4"
FILES = ("benchmark.json", "benchmark.md", "benchmark.png")


class BenchmarkRehearsal(Rehearsal):
    """The rehearsal's nodes with node.json's `benchmark` set; the steps differ, nothing else."""

    def env(self, role: str = "rehearsal") -> dict[str, str]:
        return {**super().env(role), "HOROVOD_FLEET_ALLREDUCE_CHECK_MIB": CHECK_MIB}

    @functools.cached_property
    def plan(self) -> dict:
        """node.json's `benchmark`: the stacks' schedule (1 rank, 1 node, then 2, 4, ... nodes)
        for the rehearsal's nodes, with the rehearsal's step counts."""
        command = [sys.executable, "-m", "stacks.benchmark", "--mode", "synthetic",
                   "--nodes", str(self.args.nodes), "--gpus-per-node", str(RANKS_PER_NODE)]  # fmt: skip
        result = subprocess.run(
            command, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120
        )
        if result.returncode:
            raise StepFailed(f"python -m stacks.benchmark failed: {result.stderr.strip()[-500:]}")
        return {
            **json.loads(result.stdout),
            "warmup_steps": WARMUP_STEPS,
            "timed_steps": TIMED_STEPS,
        }

    def node_json(self, path: Path, doc: dict) -> Path:
        if doc["role"] in ("train", "head"):  # the head runs the schedule; the nodes its ranks
            doc = {**doc, "benchmark": self.plan}
            doc["trainer"] = {**doc["trainer"], "batch_per_gpu": BATCH_PER_RANK}
        return super().node_json(path, doc)

    def plan_steps(self) -> list:
        return [
            ("local S3 endpoint", self.start_s3),
            ("training nodes: benchmark", lambda: self.train(1)),
            ("benchmark results", self.report_benchmark),
        ]

    def report_benchmark(self) -> None:
        prefix = runs.prefix(RUN)
        done = self.done_json()
        if done is None or done["status"] != "succeeded" or done.get("benchmark") != "synthetic":
            raise StepFailed(f"DONE.json: {done}")
        out = self.workdir / "s3" / "runs" / RUN
        out.mkdir(parents=True, exist_ok=True)
        for name in (*FILES, runs.DONE):
            self.s3.download_file(BUCKET, prefix + name, str(out / name))
        say(f"s3://{BUCKET}/{prefix}benchmark.{{json,md,png}} copied to {out}/")
        say("CPU rehearsal, not GPU figures:")
        print((out / "benchmark.md").read_text(), flush=True)
