"""What every training node's node.json holds after its run and index (docs/contracts.md): the
fleet's half of the document, which the nodes, the replacement template and the head share."""

from contract import runs
from contract.names import METRIC_NAMESPACE
from stacks import startup_estimate
from stacks.image.recipe import read_pins
from stacks.instance_types import PRICES_AS_OF, GpuType, fleet_usd_per_hour

RENDEZVOUS_TIMEOUT_S = 1800
# How stale a node's heartbeat may be before it is lost (bootstrap/node_config.py's default, said
# in node.json so that the nodes and the run controller, which reads it from the stack's tags,
# judge by one number).
HEARTBEAT_TIMEOUT_S = 120
# How long an attempt's nodes get to start (the rendezvous, then ten minutes for the allreduce
# check and the trainer) before the run controller counts their silence or an idle fleet.
STARTUP_GRACE_S = RENDEZVOUS_TIMEOUT_S + 600
IMAGE_MANIFEST = "/opt/horovod-fleet/image.json"  # bootstrap/image/manifest.py writes it


def fleet_document(
    *,
    gpu: GpuType,
    nodes: int,
    image_id: str,
    dataset_prefix: str,
    run: str,
    trainer: dict,
    max_hours: float,
    benchmark: dict | None,
    market: str,
    notify_topic_arn: str | None,
    init_rate: int | None,
    elastic: dict | None,
    drill: dict | None,
) -> dict:
    """The fleet's keys of node.json; `drill`: the plan the head plays."""
    pins = read_pins()
    return {
        "nodes": nodes,
        "gpus_per_node": gpu.gpus,
        "instance_type": gpu.name,
        "efa": gpu.efa,
        "gpudirect": gpu.gpudirect,
        "allreduce_floor_gbps": gpu.allreduce_floor_gbps,
        "instance_store": gpu.nvme_drives > 0,
        "dataset_prefix": dataset_prefix,
        "runs_prefix": runs.prefix(run),
        "rendezvous_timeout_s": RENDEZVOUS_TIMEOUT_S,
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
        "trainer": trainer,
        "metrics": {"namespace": METRIC_NAMESPACE, "dimension": {"Run": run}},
        "image": {
            "manifest": IMAGE_MANIFEST,
            "ami": image_id,
            "tensorflow": pins["TENSORFLOW_VERSION"],
            "horovod": pins["HOROVOD_VERSION"],
        },
        "benchmark": benchmark,
        "market": market,
        # What the leader's status.json and `horovod-fleet status` price the run with.
        "cost": {
            "usd_per_hour": round(fleet_usd_per_hour(gpu, nodes), 4),
            "prices_as_of": PRICES_AS_OF,
            "max_hours": max_hours,
        },
        "notify_topic_arn": notify_topic_arn,
        # Synthesis's estimate of each start-up phase: DONE.json sets it beside the measured.
        "startup_budget_s": startup_estimate.budget(
            startup_estimate.startup_phases(
                gpu,
                nodes,
                pulls_data=(not benchmark or benchmark["mode"] == "data") and not drill,
                init_rate=init_rate,
            )
        ),
        # The head's elastic horovodrun (stacks/train/head.py); every node carries them so
        # that the code guard, which holds node 0's user data, sees them change.
        **(elastic or {}),
        **({"drill": drill} if drill else {}),  # the plan the head plays (contracts.md)
    }
