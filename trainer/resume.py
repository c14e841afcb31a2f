"""Where a run starts: rank 0's newest checkpoint (elastic: the newest on any rank's disk), given
to every rank, and the step in it.

A checkpoint taken mid-epoch (SIGTERM) records how far into the epoch it was and the epoch
length then, so a rerun with other ranks or another batch resumes at the same fraction.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

from trainer.ranks import agree, log
from trainer.recorder import checkpoint_step
from trainer.step import Trainer


class Start(NamedTuple):
    checkpoint: str | None  # the restored checkpoint's path; None: a fresh start
    epoch: int  # epochs done
    skip_steps: int  # steps done in the next epoch


def restore_newest(trainer: Trainer, manager: tf.train.CheckpointManager | None) -> str | None:
    """Rank 0 restores the newest checkpoint, then every rank gets its state. Returns its path."""
    # Horovod: rank 0 alone reads the files; the broadcast gives every rank their state.
    path = manager.latest_checkpoint if hvd.rank() == 0 else None
    return restore_on(trainer, path, root=0)


def restore_newest_anywhere(trainer: Trainer, checkpoint_dir: Path) -> str | None:
    """Elastic: the rank whose disk holds the newest checkpoint (the highest step; the lowest
    rank of a tie) restores it, then every rank gets its state. Horovod gives rank 0 to the
    discovery's hosts in no set order at the start (horovod/runner/elastic/discovery.py v0.28.1,
    HostManager.update_available_hosts: a set, then order_available_hosts), and a later rank 0
    may sit on a host other than the one that saved; a node need not hold the files."""
    latest = tf.train.latest_checkpoint(str(checkpoint_dir))
    # Horovod: every rank says the step of its newest checkpoint (-1: none).
    steps = hvd.allgather_object(checkpoint_step(latest) if latest else -1, name="newest_steps")
    root = steps.index(max(steps))
    return restore_on(trainer, latest if hvd.rank() == root else None, root=root)


def restore_on(trainer: Trainer, path: str | None, root: int) -> str | None:
    """Collective: `root` restores `path` (None: a fresh start) and broadcasts every variable."""
    local_error = None
    if path:
        try:
            trainer.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            first_line = str(exc).strip().splitlines()[0]
            local_error = f"checkpoint {path} does not fit this model/flags: {first_line}"
    agree(local_error)
    trainer.broadcast_state(root)
    # Horovod: every rank learns what the root restored (only it needs the files).
    return hvd.broadcast_object(path, root_rank=root, name="restored_path")


def resume_step(epoch_step: int, saved_steps_per_epoch: int, steps_per_epoch: int) -> int:
    """Steps already done in the epoch a checkpoint was taken in, in this run's step length."""
    if saved_steps_per_epoch == steps_per_epoch or saved_steps_per_epoch <= 0:
        return min(epoch_step, steps_per_epoch)
    return min(round(epoch_step * steps_per_epoch / saved_steps_per_epoch), steps_per_epoch)


def resume(
    trainer: Trainer, manager: tf.train.CheckpointManager | None, steps_per_epoch: int
) -> Start:
    """Collective: restore the newest checkpoint, if any, and set the step count from it."""
    return start_from(trainer, restore_newest(trainer, manager), steps_per_epoch)


def start_from(trainer: Trainer, restored: str | None, steps_per_epoch: int) -> Start:
    """Where the restored (or broadcast) state stands in this run's epochs: the step count is
    realigned to the same fraction of the epoch in this world's steps."""
    start_epoch = int(trainer.epoch.numpy())
    skip_steps = resume_step(
        int(trainer.epoch_step.numpy()),
        int(trainer.saved_steps_per_epoch.numpy()),
        steps_per_epoch,
    )
    if restored:
        log(
            f"Resuming from {restored}: {start_epoch} epochs done"
            + (f", {skip_steps} steps into epoch {start_epoch + 1}" if skip_steps else "")
        )
    # The LR schedule follows the step count: realign it in case the ranks or batch changed.
    trainer.optimizer.iterations.assign(start_epoch * steps_per_epoch + skip_steps)
    trainer.saved_steps_per_epoch.assign(steps_per_epoch)
    return Start(restored, start_epoch, skip_steps)
