"""The training nodes' root volume, ready at boot: what the fleet's and the replacement's launch
templates set, and what it costs.

A volume made from an AMI's snapshot loads its blocks from S3 on first read at a rate that
"fluctuates throughout the initialization process"; a launch template's
`VolumeInitializationRate` (100-300 MiB/s) downloads the snapshot at that rate after creation
instead, so the image's TensorFlow and CUDA files are on the volume within snapshot size / rate
(https://docs.aws.amazon.com/ebs/latest/userguide/initalize-volume.html). The time and the
charge count the snapshot's data, not the volume's size; the image bakes a 60 GiB root
(stacks/image/recipe.py ROOT_GIB), so its snapshot holds at most that.

gp3's throughput beyond its free 125 MiB/s serves those files once they are there: 500 MiB/s,
above the initialization's 300.
"""

from __future__ import annotations

from stacks.image.recipe import ROOT_GIB as IMAGE_GIB

ROOT_VOLUME_GIB = 200  # environment, checkpoints and logs; the dataset is on the NVMe drives
THROUGHPUT_MIB_S = 500  # gp3: 125 to 2,000 (AWS::EC2::LaunchTemplate Ebs, Throughput)
BASELINE_MIB_S = 125  # gp3's included throughput
# "You can specify a volume initialization rate of between 100 and 300 MiB/s"; "a limit of 5,000
# MiB/s on the cumulative volume initialization rate that you can request across concurrent
# volume creation requests ... per Region", over which a request fails (the page above).
MIN_INIT_RATE, MAX_INIT_RATE, REGION_INIT_MIB_S = 100, 300, 5000
# us-east-1: "up to $0.00360/GB" at 300 MiB/s, i.e. $0.000012 per GiB of snapshot data per MiB/s,
# billed once when the volume becomes active ("rate for Region x snapshot data size x volume
# initialization rate", the page above). The figure is a published article's (Craig Cooley,
# "EBS Provisioned Rate - Accelerate EBS volume initialization"); the pricing page,
# https://aws.amazon.com/ebs/pricing/, could not be read here: check it there.
INIT_USD_PER_GIB_MIB_S = 0.0036 / 300
# gp3 throughput above 125 MiB/s, us-east-1: $0.040 per MiB/s-month
# (https://aws.amazon.com/ebs/pricing/), a month being 730 hours.
THROUGHPUT_USD_PER_MIB_S_MONTH = 0.040
HOURS_PER_MONTH = 730


def init_rate(nodes: int) -> int | None:
    """The fastest rate every node's root volume can be created at together within the
    region's 5,000 MiB/s: 300 up to 16 nodes, less above; None past 50 nodes (100 each would
    exceed it, and a launch over the limit fails)."""
    rate = min(MAX_INIT_RATE, REGION_INIT_MIB_S // nodes)
    return rate if rate >= MIN_INIT_RATE else None


def head_init_rate(nodes: int) -> int | None:
    """The head's root volume's rate: what the region's 5,000 MiB/s leaves beside every node's
    (the head is created with them), at most 300; None when under 100 is left (past 16 nodes at
    300 each, the nodes take it all), and the head's image then loads at EBS's default rate."""
    nodes_rate = init_rate(nodes) or 0
    rate = min(MAX_INIT_RATE, REGION_INIT_MIB_S - nodes * nodes_rate)
    return rate if rate >= MIN_INIT_RATE else None


def initialization_usd(nodes: int) -> float:
    """The one-time charge for initializing every node's root at its rate (at most: the
    snapshot's data is at most the image's root)."""
    rate = init_rate(nodes)
    return nodes * IMAGE_GIB * rate * INIT_USD_PER_GIB_MIB_S if rate else 0.0


def throughput_usd_per_hour(nodes: int) -> float:
    extra = THROUGHPUT_MIB_S - BASELINE_MIB_S
    return nodes * extra * THROUGHPUT_USD_PER_MIB_S_MONTH / HOURS_PER_MONTH


def cost_note(nodes: int, hours: float) -> str:
    """The part of the estimate the root volumes add."""
    rate = init_rate(nodes)
    init = (
        f"initialized at {rate} MiB/s (at most ${initialization_usd(nodes):,.2f} once)"
        if rate
        else f"initialized at EBS's default rate ({nodes} nodes x 100 MiB/s would pass the "
        f"region's {REGION_INIT_MIB_S:,} MiB/s)"
    )
    throughput = throughput_usd_per_hour(nodes) * hours
    return f"root volumes {init}, {THROUGHPUT_MIB_S} MiB/s gp3 (${throughput:,.2f})"
