"""Benchmark mode (`-c benchmark=true|synthetic|data`): the fleet measures itself, then is torn down.

Node 0 runs ResNet-50 at 1 GPU, 1 node, then 2, 4, ... nodes up to `nodes` (warm-up steps, then
timed steps) and the allreduce check at each size, writes runs/<run>/benchmark.{json,md,png} and
DONE.json; the run controller deletes the fleet as after any run. The schedule is made here and reaches
node 0 through node.json, so a size larger than the fleet cannot be asked for.

`python -m stacks.benchmark --mode synthetic|data --nodes N --gpus-per-node G` prints that
node.json `benchmark` object as JSON (the rehearsal's benchmark takes its schedule from it).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from stacks import startup_estimate
from stacks.instance_types import GpuType, fleet_usd_per_hour

# `-c benchmark=` value -> the mode node.json carries (None: a training run).
MODES: dict[str, str | None] = {
    "false": None,
    "true": "synthetic",
    "synthetic": "synthetic",
    "data": "data",
}
# Horovod's synthetic benchmark times 10 iterations of 10 batches after 10 warm-up batches
# (https://github.com/horovod/horovod/blob/master/examples/tensorflow2/tensorflow2_synthetic_benchmark.py);
# here each timed step is one figure, so the spread is across steps.
WARMUP_STEPS = 10
TIMED_STEPS = 100
MAX_HOURS = 1.0  # the mode's default hard cap; -c maxHours= overrides it

# Duration estimate, in seconds (estimates: nothing of this project has run on AWS yet).
# Per size: horovodrun start over ssh, TensorFlow and Horovod start, building and XLA-compiling
# ResNet-50, warm-up and timed steps (~0.2 s each on a V100 at batch 256 with fp16), and the
# allreduce check (256 MiB x 10).
PER_SIZE_S = 150
# From DONE.json until the run controller's delete has terminated the instances.
TEARDOWN_S = 300
# The start-up's phases before node 0 measures (stacks/startup_estimate.py): the framework's
# start, the first step and the allreduce check are each size's (PER_SIZE_S).
PER_SIZE_PHASES = ("allreduce_check", "framework_start", "first_step")


def boot_s(mode: str, gpu: GpuType, nodes: int) -> float:
    """Launch to the rendezvous, with the whole data pull for real data: a benchmark's sizes
    are not the fleet's first world, so its ranks may read any shard."""
    phases = startup_estimate.startup_phases(gpu, nodes, pulls_data=mode == "data")
    return sum(p.seconds for p in phases if p.code not in (*PER_SIZE_PHASES, "own_shards"))


@dataclass(frozen=True)
class Size:
    """One row of the table: `ranks` GPUs over the first `nodes` nodes."""

    nodes: int
    ranks: int


def schedule(nodes: int, gpus_per_node: int) -> list[Size]:
    """1 GPU, 1 node, 2, 4, ... nodes, and the whole fleet: never more nodes than the fleet has.
    A CPU node (gpus_per_node 0) runs one rank, so its 1-GPU row is its 1-node row."""
    per_node = max(gpus_per_node, 1)
    sizes = [Size(1, 1)]
    count = 1
    while count <= nodes:
        sizes.append(Size(count, count * per_node))
        count *= 2
    if sizes[-1].nodes != nodes:
        sizes.append(Size(nodes, nodes * per_node))
    unique: list[Size] = []
    for size in sizes:
        if size not in unique:
            unique.append(size)
    return unique


def plan(mode: str, nodes: int, gpus_per_node: int) -> dict:
    """node.json's `benchmark` object (docs/contracts.md)."""
    return {
        "mode": mode,
        "sizes": [{"nodes": s.nodes, "ranks": s.ranks} for s in schedule(nodes, gpus_per_node)],
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": TIMED_STEPS,
    }


def expected_seconds(mode: str, gpu: GpuType, nodes: int) -> float:
    sizes = len(schedule(nodes, gpu.gpus))
    return boot_s(mode, gpu, nodes) + PER_SIZE_S * sizes + TEARDOWN_S


def benchmark_estimate(mode: str, gpu: GpuType, nodes: int, max_hours: float) -> str:
    """The line synthesis prints in benchmark mode: expected duration x fleet price, and the cap."""
    seconds = expected_seconds(mode, gpu, nodes)
    hourly = fleet_usd_per_hour(gpu, nodes)
    sizes = ", ".join(
        f"{s.ranks} GPU{'s' if s.ranks > 1 else ''}" for s in schedule(nodes, gpu.gpus)
    )
    return (
        f"Benchmark ({'the local TFRecords' if mode == 'data' else 'synthetic images'}): {sizes}; about {seconds / 60:.0f} min x ${hourly:,.2f}/h "
        f"= ~${hourly * seconds / 3600:,.2f} (estimate); capped at {max_hours:g} h -> at most "
        f"${hourly * max_hours:,.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stacks.benchmark",
        description="Print node.json's `benchmark` object for a fleet (docs/contracts.md).",
    )
    parser.add_argument(
        "--mode",
        choices=("synthetic", "data"),
        default="synthetic",
        help="generated images, or the local TFRecords (default: %(default)s)",
    )
    parser.add_argument("--nodes", type=int, required=True, help="nodes in the fleet")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="GPUs of each node")
    args = parser.parse_args(argv)
    print(json.dumps(plan(args.mode, args.nodes, args.gpus_per_node)))


if __name__ == "__main__":
    main()
