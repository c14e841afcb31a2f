"""The start-up's budget, phase by phase, from deploy to the first training step: what synthesis
prints, what node.json carries (`startup_budget_s`, which DONE.json's timeline and `horovod-fleet
runs` set beside the measured phases), and what the training and benchmark estimates add.

Each phase has its source, or says "unmeasured": nothing of this project has run on AWS, and no
published figure was found for p4d's launch, boot or the framework's start. The pull is derived
from published figures (docs/cost.md, "Start-up"); the rest of the pull runs beside the
rendezvous, the allreduce check and the framework's start (docs/contracts.md), so only a node's
own shards are on the critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

from stacks.image_root import IMAGE_ROOT_GIB
from stacks.instance_types import GpuType

# The official archives' sizes (ILSVRC2012_img_train.tar 147,897,477,120 bytes,
# ILSVRC2012_img_val.tar 6,744,924,160; e.g. CompVis/taming-transformers
# taming/data/imagenet.py SIZES, jkjung-avt/keras_imagenet README). The TFRecords hold the same
# images with the shorter side at most 256 (trainer/preprocess, never enlarged): at most this.
DATASET_BYTES = 147_897_477_120 + 6_744_924_160
# S3 to one instance, measured: 6,269 MB/s on p3dn.24xlarge and 8,003 MB/s on c5n.18xlarge, the
# 100 Gbps types of dvassallo/s3-benchmark (https://github.com/dvassallo/s3-benchmark, 2019-04-02);
# about 7 GB/s loading a 140 GB model on p4de (4 min 25 s to 20 s,
# https://www.anyscale.com/blog/loading-llama-2-70b-20x-faster-with-anyscale-endpoints). S3's
# traffic takes the ENA side of the first network card, 100 Gbps on p4d and p4de (4 x 100 Gbps,
# stacks/instance_types.py): the lower measured figure. Other types have no measured figure
# here: the budget takes a 10 Gbps card's 1,250 MB/s, marked unmeasured.
S3_MB_PER_S = {"p4d.24xlarge": 6269, "p4de.24xlarge": 6269}
UNMEASURED_S3_MB_PER_S = 1250
S3_SOURCE = "s3-benchmark's p3dn.24xlarge, 100 Gbps like p4d's first network card"
# How often a node looks at S3 while it waits (bootstrap node.json poll_interval_s, default 10).
POLL_S = 10


@dataclass(frozen=True)
class Phase:
    code: str
    seconds: float
    source: str
    critical: bool = True  # on the way to the first step (the rest of the pull runs beside it)


def startup_phases(
    gpu: GpuType, nodes: int, pulls_data: bool = True, init_rate: int | None = None
) -> list[Phase]:
    """The phases of docs/contracts.md with their budgets for `nodes` x `gpu`."""
    rate = S3_MB_PER_S.get(gpu.name)
    source = S3_SOURCE if rate else f"unmeasured for {gpu.name}: a 10 Gbps card's line rate"
    rate = rate or UNMEASURED_S3_MB_PER_S
    own_mb, all_mb = DATASET_BYTES / nodes / 1e6, DATASET_BYTES / 1e6
    volume = (
        f"; the root volume initializes at {init_rate} MiB/s: its image (at most {IMAGE_ROOT_GIB} "
        f"GiB) within {IMAGE_ROOT_GIB * 1024 / init_rate:.0f} s"
        if init_rate
        else ""
    )
    phases = [
        Phase("launch", 120, "unmeasured: no published launch-to-kernel figure for " + gpu.name),
        Phase("boot", 120, "unmeasured: kernel to the node script" + volume),
        Phase("image_check", 5, "unmeasured: reads image.json"),
        Phase("instance_store", 30, "unmeasured: RAID 0 and a file system on the NVMe drives"),
        Phase("health", 30, "unmeasured: GPUs, NVSwitch fabric manager, EFA"),
    ]
    if pulls_data:
        phases += [
            Phase(
                "own_shards",
                round(own_mb / rate, 1),
                f"{own_mb / 1e3:,.1f} GB (1/{nodes} of at most {all_mb / 1e3:,.1f} GB) at "
                f"{rate:,} MB/s ({source})",
            ),
            Phase(
                "data_pull",
                round(all_mb / rate, 1),
                f"{all_mb / 1e3:,.1f} GB at {rate:,} MB/s, beside the phases below",
                critical=False,
            ),
        ]
    phases += [
        Phase("rendezvous", POLL_S, f"one look at S3 ({POLL_S} s) after the last node registers"),
        Phase("allreduce_check", 60, "unmeasured: horovodrun's start and 256 MiB x 11 rounds"),
        Phase("framework_start", 120, "unmeasured: TensorFlow, Horovod, NCCL, the model"),
        Phase("first_step", 60, "unmeasured: tracing and XLA's compilation of the first step"),
    ]
    return phases


def startup_s(phases: list[Phase]) -> float:
    """Launch to the first step: the critical phases, plus whatever of the rest of the pull
    outlasts what runs beside it (the rendezvous, the allreduce check, the framework's start)."""
    critical = sum(p.seconds for p in phases if p.critical)
    by_code = {p.code: p.seconds for p in phases}
    rest = by_code.get("data_pull", 0) - by_code.get("own_shards", 0)
    beside = sum(by_code[c] for c in ("rendezvous", "allreduce_check", "framework_start"))
    return critical + max(0.0, rest - beside)


def budget(phases: list[Phase]) -> dict[str, float]:
    """node.json `startup_budget_s`."""
    return {p.code: p.seconds for p in phases}


def startup_lines(gpu: GpuType, nodes: int, phases: list[Phase]) -> list[str]:
    """What synthesis prints: the total and each phase with its source."""
    lines = [
        f"TrainStack start-up budget, launch to the first step: ~{startup_s(phases) / 60:.1f} min "
        f"on {nodes} x {gpu.name} (docs/cost.md, Start-up)"
    ]
    lines += [f"  {p.code:<16}{p.seconds:>6g} s  {p.source}" for p in phases]
    return lines
