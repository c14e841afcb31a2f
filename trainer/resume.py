"""Where a run starts: rank 0's newest checkpoint, given to every rank, and the step in it.

A checkpoint taken mid-epoch (SIGTERM) records how far into the epoch it was and the epoch
length then, so a rerun with other ranks or another batch resumes at the same fraction.
"""

from __future__ import annotations

from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

from trainer.ranks import agree, log
from trainer.step import Trainer


class Start(NamedTuple):
    checkpoint: str | None  # the restored checkpoint's path; None: a fresh start
    epoch: int  # epochs done
    skip_steps: int  # steps done in the next epoch


def restore_newest(trainer: Trainer, manager: tf.train.CheckpointManager | None) -> str | None:
    """Rank 0 restores the newest checkpoint, then every rank gets its state. Returns its path."""
    local_error, path = None, None
    # Horovod: rank 0 alone reads the files; the broadcast below gives every rank their state.
    if hvd.rank() == 0 and manager.latest_checkpoint:
        path = manager.latest_checkpoint
        try:
            trainer.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            first_line = str(exc).strip().splitlines()[0]
            local_error = f"checkpoint {path} does not fit this model/flags: {first_line}"
    agree(local_error)
    trainer.broadcast_state()
    # Horovod: every rank learns what rank 0 restored (only rank 0 needs the files).
    return hvd.broadcast_object(path, root_rank=0, name="restored_path")


def resume_step(epoch_step: int, saved_steps_per_epoch: int, steps_per_epoch: int) -> int:
    """Steps already done in the epoch a checkpoint was taken in, in this run's step length."""
    if saved_steps_per_epoch == steps_per_epoch or saved_steps_per_epoch <= 0:
        return min(epoch_step, steps_per_epoch)
    return min(round(epoch_step * steps_per_epoch / saved_steps_per_epoch), steps_per_epoch)


def resume(
    trainer: Trainer, manager: tf.train.CheckpointManager | None, steps_per_epoch: int
) -> Start:
    """Collective: restore the newest checkpoint, if any, and set the step count from it."""
    restored = restore_newest(trainer, manager)
    start_epoch = int(trainer.epoch.numpy())
    skip_steps = 0
    if restored:
        skip_steps = resume_step(
            int(trainer.epoch_step.numpy()),
            int(trainer.saved_steps_per_epoch.numpy()),
            steps_per_epoch,
        )
        log(
            f"Resuming from {restored}: {start_epoch} epochs done"
            + (f", {skip_steps} steps into epoch {start_epoch + 1}" if skip_steps else "")
        )
        # The LR schedule follows the step count: realign it in case the ranks or batch changed.
        trainer.optimizer.iterations.assign(start_epoch * steps_per_epoch + skip_steps)
    trainer.saved_steps_per_epoch.assign(steps_per_epoch)
    return Start(restored, start_epoch, skip_steps)
