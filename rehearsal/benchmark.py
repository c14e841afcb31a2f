"""`python -m rehearsal --benchmark`: the fleet benchmark's schedule on the rehearsal's nodes.

The same bootstrap as a fleet in benchmark mode (node.json `benchmark`, docs/contracts.md): the
nodes start, find each other through the local S3, and node 0 runs trainer.benchmark at 1 rank,
1 node and 2 nodes, then the allreduce check on the same ranks, prints the table row by row and
writes runs/rehearsal/benchmark.{json,md,png} and DONE.json. No preprocessing: the synthetic
benchmark reads no data. CPU ranks (2 per simulated node) and ResNet-18 at 32x32 keep it to a
minute or two: the figures show the machinery works, they say nothing about GPUs.
"""

from __future__ import annotations

from pathlib import Path

from rehearsal.__main__ import BUCKET, RUN, Rehearsal, StepFailed, say

RANKS_PER_NODE = 2  # CPU ranks per simulated node, so that 1 rank and 1 node are two rows
WARMUP_STEPS = 1
TIMED_STEPS = 4
BATCH_PER_RANK = 8
# The allreduce check's buffer (MiB): 256 MiB over Gloo on a shared CPU takes ~3 s a round.
CHECK_MIB = "4"
FILES = ("benchmark.json", "benchmark.md", "benchmark.png")


def plan(nodes: int) -> dict:
    """1 rank, 1 node, then 2, 4, ... nodes: the shape of stacks/benchmark.py's schedule."""
    sizes = [{"nodes": 1, "ranks": 1}]
    count = 1
    while count <= nodes:
        sizes.append({"nodes": count, "ranks": count * RANKS_PER_NODE})
        count *= 2
    if sizes[-1]["nodes"] != nodes:
        sizes.append({"nodes": nodes, "ranks": nodes * RANKS_PER_NODE})
    return {
        "mode": "synthetic",
        "sizes": sizes,
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": TIMED_STEPS,
    }


class BenchmarkRehearsal(Rehearsal):
    """The rehearsal's nodes with node.json's `benchmark` set; the steps differ, nothing else."""

    def env(self, role: str = "rehearsal") -> dict[str, str]:
        return {**super().env(role), "HOROVOD_FLEET_ALLREDUCE_CHECK_MIB": CHECK_MIB}

    def node_json(self, path: Path, doc: dict) -> Path:
        if doc["role"] == "train":
            doc = {**doc, "benchmark": plan(self.args.nodes)}
            doc["trainer"] = {**doc["trainer"], "batch_per_gpu": BATCH_PER_RANK}
        return super().node_json(path, doc)

    def plan_steps(self) -> list:
        return [
            ("local S3 endpoint", self.start_s3),
            ("training nodes: benchmark", lambda: self.train(1)),
            ("benchmark results", self.report_benchmark),
        ]

    def report_benchmark(self) -> None:
        prefix = f"runs/{RUN}/"
        done = self.done_json()
        if done is None or done["status"] != "succeeded" or done.get("benchmark") != "synthetic":
            raise StepFailed(f"DONE.json: {done}")
        out = self.workdir / "s3" / "runs" / RUN
        out.mkdir(parents=True, exist_ok=True)
        for name in (*FILES, "DONE.json"):
            self.s3.download_file(BUCKET, prefix + name, str(out / name))
        say(f"s3://{BUCKET}/{prefix}benchmark.{{json,md,png}} copied to {out}/")
        say("CPU rehearsal, not GPU figures:")
        print((out / "benchmark.md").read_text(), flush=True)
