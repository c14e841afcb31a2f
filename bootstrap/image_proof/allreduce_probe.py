"""One rank of the image's allreduce proof: every rank contributes rank + 1, so the sum over N
ranks must be N (N + 1) / 2 in every element. Run under horovodrun, one rank per GPU:

    horovodrun -np 8 -H localhost:8 python3 -m bootstrap.image_proof.allreduce_probe
"""

import horovod.tensorflow as hvd
import tensorflow as tf

ELEMENTS = 1 << 22  # 16 MiB of float32: large enough for NCCL to use its ring, not a shortcut


def main() -> None:
    hvd.init()
    # Horovod: one GPU per rank, chosen by the rank's place on this machine.
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    contribution = tf.fill([ELEMENTS], float(hvd.rank() + 1))
    total = hvd.allreduce(contribution, op=hvd.Sum).numpy()
    expected = hvd.size() * (hvd.size() + 1) / 2
    wrong = int((total != expected).sum())
    if hvd.rank() == 0:
        print(
            f"allreduce probe: {hvd.size()} ranks on {len(gpus)} GPU(s), sum {total[0]:g}, "
            f"expected {expected:g}, {wrong} wrong element(s)",
            flush=True,
        )
    if wrong:
        raise SystemExit(f"error: allreduce gave {wrong} wrong element(s) on rank {hvd.rank()}")


if __name__ == "__main__":
    main()
