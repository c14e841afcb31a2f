"""A replacement node's index. The run controller launches every missing node of a relaunch in
one request from one launch template, so such a node's node.json has no `node_index`: at boot it
waits for the controller's launch assignment, runs/<run>/launches/<instance-id>.json =
{"node_index", ...} (docs/contracts.md), and runs as that node from then on. The assignment stays
in S3, so the same node finds the same index at every later boot.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from bootstrap import aws
from bootstrap.fleet.rendezvous import read_object
from bootstrap.node_config import ConfigError, TrainConfig, with_node_index
from contract import causes, runs

# The controller writes the assignment seconds after EC2 answered the launch, before the node has
# booted; one that is not there after this means the controller failed between the two.
WAIT_S = 600
POLL_INTERVAL_S = 5


class Unassigned(RuntimeError):
    """No launch assignment for this instance within the wait: it cannot register as any node."""

    cause = causes.NODES_MISSING


def launch_key(cfg: TrainConfig, instance_id: str) -> str:
    return f"{cfg.runs_prefix}{runs.LAUNCHES}{instance_id}.json"


def assigned(
    cfg: TrainConfig,
    s3,
    instance_id: str,
    wait_s: float = WAIT_S,
    interval_s: float = POLL_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> TrainConfig:
    """`cfg` as the node the controller launched `instance_id` as; `cfg` itself when node.json
    names its index. Unassigned past `wait_s`; ConfigError for an assignment that names no node
    of the fleet."""
    if cfg.node_index is not None:
        return cfg
    key = launch_key(cfg, instance_id)
    found = aws.poll_until(
        lambda: read_object(s3, cfg.bucket, key), wait_s, interval_s, clock, sleep
    )
    where = f"s3://{cfg.bucket}/{key}"
    if not found:
        raise Unassigned(
            f"no launch assignment {where} after {wait_s:.0f} s: the run controller launched "
            f"{instance_id} but never said which node it is"
        )
    source = f"launch assignment {where}"
    try:
        index = json.loads(found)["node_index"]
    except (ValueError, TypeError, KeyError):
        raise ConfigError(f"{source}: no 'node_index' in it") from None
    launched = with_node_index(cfg, index, source)
    aws.log(f"{source}: node {index}")
    return launched
