"""What the ranks share: the agreement on failures, rank 0's log, and one device per rank.

Every rank must reach every collective in the same order: a rank that stopped on its own would
leave the others waiting in their next one. Failures are therefore agreed (agree) before any
rank acts on them.
"""

from __future__ import annotations

import contextlib
import os

import horovod.tensorflow as hvd
import tensorflow as tf


class RunError(Exception):
    """A failure every rank has agreed on; main() prints it as one `error: ...` line."""


def log(message: str) -> None:
    # Horovod: rank 0 alone prints, so the log reads as one run's.
    if hvd.rank() == 0:
        print(message, flush=True)


def agree(local_error: str | None) -> None:
    """Collective: raise RunError on every rank if any rank has an error (the first one's text)."""
    # Horovod: every rank says whether it failed; the sum tells all of them at once.
    failed = hvd.allreduce(
        tf.constant(0 if local_error is None else 1, tf.int32), op=hvd.Sum, name="agree_flag"
    )
    if int(failed) == 0:
        return
    # Horovod: then every rank learns every rank's message, and all raise the same one.
    messages = hvd.allgather_object(local_error, name="agree_messages")
    raise RunError(next(m for m in messages if m))


def any_rank(flag: bool, name: str) -> bool:
    """Collective: whether any rank's flag is set."""
    # Horovod: the largest of every rank's flag, on every rank.
    return int(hvd.allreduce(tf.constant(int(flag), tf.int32), op=hvd.Max, name=name)) > 0


def setup_devices() -> bool:
    """Collective: pin_devices, and every rank learns if one could not. Returns has_gpu."""
    gpu, local_error = pin_devices()
    agree(local_error)
    return gpu


def pin_devices() -> tuple[bool, str | None]:
    """Pin one GPU per local rank; on CPU share the cores among the local ranks. Returns has_gpu
    and this rank's error, for the ranks to agree on (elastic: inside the first world)."""
    gpus = tf.config.list_physical_devices("GPU")
    local_error = None
    if not gpus:
        cores = len(os.sched_getaffinity(0))
        # TensorFlow refuses once its runtime has started (an earlier run in this process, as in
        # the tests): that run's setting stays.
        with contextlib.suppress(RuntimeError):
            # Horovod: the node's ranks share its cores.
            tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // hvd.local_size()))
    elif hvd.local_size() > len(gpus):
        local_error = (
            f"{hvd.local_size()} ranks on one node with {len(gpus)} GPUs: one rank per GPU"
        )
    else:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        # Horovod: pin one GPU per process, chosen by local rank (an elastic rank keeps its
        # local rank, its slot on the host, across resets: horovod/runner/elastic/driver.py
        # get_slot_info).
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    return bool(gpus), local_error
