"""A short allreduce bandwidth check, one process per rank, before training starts.

    horovodrun --mpi -np 16 --hostfile HOSTFILE python3 -m bootstrap.allreduce_check

The leader runs it with NCCL_DEBUG=INFO and reads the transport from the output
(bootstrap.health.check_transport): EFA expected but NET/Socket used fails the run loudly.
"""

import time

import horovod.tensorflow as hvd
import tensorflow as tf

SIZE_MB = 256
ROUNDS = 10


def main() -> None:
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    tensor = tf.ones([SIZE_MB * 1024 * 1024 // 4], tf.float32)
    hvd.allreduce(tensor)  # warm-up: NCCL builds its rings here and logs the transport
    start = time.perf_counter()
    for _ in range(ROUNDS):
        hvd.allreduce(tensor).numpy()
    seconds = time.perf_counter() - start
    if hvd.rank() == 0:
        # Ring allreduce moves 2 (n - 1) / n of the buffer per rank: the "bus bandwidth".
        bus = 2 * (hvd.size() - 1) / hvd.size() * SIZE_MB * ROUNDS / 1024 / seconds
        print(f"allreduce check: {hvd.size()} ranks, {SIZE_MB} MiB x {ROUNDS}: {bus:.1f} GB/s bus")


if __name__ == "__main__":
    main()
