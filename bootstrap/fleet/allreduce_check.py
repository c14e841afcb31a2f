"""The pre-training allreduce check: one process per GPU on every node, before training starts.

    horovodrun --gloo -np 16 --hostfile HOSTFILE python3 -m bootstrap.fleet.allreduce_check

It runs a real flat NCCL allreduce across every node (as training does), times it, and prints one
summary line with the bus bandwidth (nccl-tests' definition, GB = 1e9 bytes). Below the floor for
the instance type (HOROVOD_FLEET_ALLREDUCE_FLOOR_GBPS, from stacks/instance_types.py through
node.json) every rank ends with one `error: ...` line. The head runs it with NCCL_DEBUG=INFO and
then reads which network NCCL used for the collective (bootstrap.node.health.check_transport).

bootstrap/records/allreduce_summary.py writes its summary line and reads it back (the head's log, DONE.json); it needs no TensorFlow.
"""

from __future__ import annotations

import os
import sys
import time

from bootstrap.records.allreduce_summary import summary_line

FLOOR_ENV = "HOROVOD_FLEET_ALLREDUCE_FLOOR_GBPS"
# The buffer in MiB: 256 on a fleet; the CPU rehearsal's benchmark makes it small (Gloo on a
# shared CPU takes ~3 s per 256 MiB round).
SIZE_ENV = "HOROVOD_FLEET_ALLREDUCE_CHECK_MIB"
SIZE_BYTES = int(os.environ.get(SIZE_ENV) or 256) * 1024 * 1024
ROUNDS = 10
TYPE_ENV = "HOROVOD_FLEET_INSTANCE_TYPE"


def bus_bandwidth_gbps(ranks: int, size_bytes: int, seconds_per_round: float) -> float:
    """A ring allreduce moves 2 (n - 1) / n of the buffer through each rank's link: the "bus
    bandwidth" of nccl-tests (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md),
    comparable across rank counts and with the published figures."""
    algorithm = size_bytes / seconds_per_round / 1e9
    return algorithm * 2 * (ranks - 1) / ranks if ranks > 1 else algorithm


def floor_error(bus: float, floor: float, nodes: int, instance_type: str) -> str | None:
    if floor and bus < floor:
        return (
            f"allreduce bus bandwidth {bus:.2f} GB/s over {nodes} node(s) is below the floor "
            f"{floor:g} GB/s for {instance_type or 'this instance type'} "
            "(stacks/instance_types.py): check EFA, the aws-ofi-nccl plugin and the placement group"
        )
    return None


def main() -> int:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    tensor = tf.ones([SIZE_BYTES // 4], tf.float32)
    hvd.allreduce(tensor, op=hvd.Sum, name="check_warmup").numpy()  # NCCL connects its channels
    start = time.perf_counter()
    for round_index in range(ROUNDS):
        hvd.allreduce(tensor, op=hvd.Sum, name=f"check_{round_index}").numpy()
    seconds = (time.perf_counter() - start) / ROUNDS
    # Every rank judges rank 0's figure, so they all pass or all fail.
    bus = float(hvd.broadcast(tf.constant(bus_bandwidth_gbps(hvd.size(), SIZE_BYTES, seconds)), 0))
    nodes = hvd.cross_size()
    if hvd.rank() == 0:
        print(summary_line(hvd.size(), nodes, bus, SIZE_BYTES >> 20, ROUNDS), flush=True)
    error = floor_error(bus, float(os.environ.get(FLOOR_ENV) or 0), nodes, os.environ.get(TYPE_ENV))
    if error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
