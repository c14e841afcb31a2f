"""The actions plugged into the loop (trainer/loop.py), as Orbit plugs its own into its
Controller (tensorflow/models, orbit/actions/): the periodic checkpoint, the checkpoint on
SIGTERM (Orbit's save_checkpoint_if_preempted.py), the stop at --target-top1 and the stop asked
through --stop-file.

No TensorFlow and no Horovod here: the step, the checkpoint manager and the recorder are handed
in. Every rank runs every action at the same points with the same agreed values, so a
collective inside one (the BatchNorm average, the barrier) is reached by every rank.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from trainer.loop import Action, Check


class Interrupted(Exception):
    """A SIGTERM that every rank has agreed on, after the checkpoint of its step was saved."""


class StopRequest:
    """Set by SIGTERM (a shutdown, a Spot interruption, cdk destroy); read between steps."""

    def __init__(self):
        self.requested = False
        self.signal_name = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name


class Checkpoints:
    """Saves the step's checkpoint: `manager` (a tf.train.CheckpointManager) on rank 0, None on
    the others, which go on to the next step and wait there only for rank 0's save to end.
    Synchronous: TF 2.15's async checkpointing skips mixed precision's AutoCastVariables."""

    def __init__(self, step, manager, timings, clock: Callable[[], float] = time.perf_counter):
        self.step = step
        self.manager = manager
        self.timings = timings
        self.clock = clock
        self.last_saved = clock()

    def save(self, epoch_step: int) -> None:
        """Save at `epoch_step` steps into the epoch the checkpoint records (0: at its start)."""
        began = self.clock()
        self.step.epoch_step.assign(epoch_step)
        # Horovod: rank 0 alone writes, so ranks never write the same files.
        if self.manager is not None:
            number = self.step.global_step()
            path = self.manager.save(checkpoint_number=number)
            # The pause every rank waits out at the next step's allreduce: what the checkpoint
            # interval's cost is measured by (docs/trainer.md, "The checkpoint interval").
            print(f"Saved checkpoint {path} in {self.clock() - began:.2f} s", flush=True)
        self.last_saved = self.clock()
        self.timings.checkpoint_s += self.last_saved - began

    def seconds_since_save(self) -> float:
        return self.clock() - self.last_saved


class PeriodicCheckpoint(Action):
    """At an epoch end once `every_s` seconds have passed since the last save, and after the
    last epoch: a 200 MB save every 16 s epoch would cost a fleet several percent."""

    def __init__(self, checkpoints: Checkpoints, every_s: float):
        self.checkpoints = checkpoints
        self.every_s = every_s

    def at_epoch_trained(self, epoch: int, last: bool) -> None:
        if last or self.checkpoints.seconds_since_save() >= self.every_s:
            self.checkpoints.save(0)


class CheckpointOnStop(Action):
    """When a rank was asked to stop: every rank stops at this check step, rank 0 saves the
    step's checkpoint and writes interrupted.json, then every rank raises Interrupted."""

    def __init__(
        self,
        step,
        checkpoints: Checkpoints,
        recorder,
        request: StopRequest,
        agree: Callable[[str | None], None],
    ):
        self.step = step
        self.checkpoints = checkpoints
        self.recorder = recorder
        self.request = request
        self.agree = agree

    def at_check(self, check: Check) -> None:
        if not check.stop:
            return
        self.step.average_batchnorm_statistics()
        if check.last_in_epoch:
            self.step.record_epoch(check.epoch)
        self.checkpoints.save(0 if check.last_in_epoch else check.step)
        message = (
            f"{self.request.signal_name or 'a signal on another rank'}: stopped at step "
            f"{check.global_step} (epoch {check.epoch}, step {check.step} of "
            f"{check.steps_per_epoch})"
        )
        self.recorder.interrupted(message)
        # A barrier: horovodrun ends the other ranks 5 s after the first one exits, so none may
        # leave before rank 0's checkpoint and marker are on disk.
        self.agree(None)
        raise Interrupted(message)


class StopAtTarget(Action):
    """MLPerf's time to accuracy: stop at the first evaluation whose top-1 reaches `target`.
    Every rank has the same allreduced top-1, so every rank stops at the same epoch."""

    def __init__(self, target: float, checkpoints: Checkpoints, recorder):
        self.target = target
        self.checkpoints = checkpoints
        self.recorder = recorder
        self.reached: dict | None = None

    def at_epoch_end(self, epoch: int, evaluation: dict | None, last: bool) -> bool:
        if evaluation is None or evaluation["top1"] < self.target:
            return False
        seconds = round(self.recorder.training_seconds(), 1)
        self.reached = {"epoch": epoch, "time_to_target_s": seconds}
        if not last:  # the last epoch's checkpoint is saved already
            self.checkpoints.save(0)
        self.recorder.reached_target(self.target, epoch, evaluation["top1"], seconds)
        return True

    def summary(self) -> dict:
        """train.json's fields for the target."""
        reached = self.reached
        return {
            "target_top1": self.target,
            "reached_target_at_epoch": reached and reached["epoch"],
            "time_to_target_s": reached and reached["time_to_target_s"],
        }


class StopWhenAsked(Action):
    """The agreed stop asked from outside the trainer (--stop-file; a drill's head asks it once
    its last experiment is judged, docs/contracts.md): at an epoch's end, when the file is on
    any rank's node, every rank stops there, its checkpoint saved, as a success (the training's
    end, not an interruption). `any_rank(flag, name)` is the collective that tells every rank
    whether any rank's flag is set, so every rank stops at the same epoch."""

    def __init__(
        self, path: Path, any_rank: Callable[[bool, str], bool], checkpoints: Checkpoints, log
    ):
        self.path = path
        self.any_rank = any_rank
        self.checkpoints = checkpoints
        self.log = log
        self.stopped_at: int | None = None

    def at_epoch_end(self, epoch: int, evaluation: dict | None, last: bool) -> bool:
        if not self.any_rank(self.path.exists(), "stop_asked"):
            return False
        self.stopped_at = epoch
        if not last:  # the last epoch's checkpoint is saved already
            self.checkpoints.save(0)
        self.log(f"stopped as asked ({self.path}) at the end of epoch {epoch}")
        return True


def checkpoint_and_target(
    checkpoints: Checkpoints, every_s: float, target_top1: float | None, recorder
) -> tuple[list[Action], StopAtTarget | None]:
    """The periodic checkpoint and, with --target-top1, the stop at the target (also returned,
    for train.json's fields), in the order the loop runs them after a run's stop action."""
    actions: list[Action] = [PeriodicCheckpoint(checkpoints, every_s)]
    target = None
    if target_top1 is not None:
        target = StopAtTarget(target_top1, checkpoints, recorder)
        actions.append(target)
    return actions, target
