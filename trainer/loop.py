"""The outer training loop, shaped as Orbit's Controller (tensorflow/models, orbit/controller.py):
it owns the epochs, the flags the ranks agree on at check steps and the resolution schedule. The
step (trainer/step.py) owns the model and the step's collectives, the batches come from the input
plan (trainer/inputs.py), the recorder (trainer/recorder.py) writes what the run shows, and the
checkpoints and the stops are actions (trainer/actions.py) plugged in at check steps and epoch
ends, as Orbit's are (orbit/actions/).

No TensorFlow and no Horovod here: the parts are handed in, so tests drive the loop with fakes
(tests/trainer/test_loop.py). Every rank runs it with the same numbers and reads the same agreed
sums at the same steps, so every rank takes the same branches and reaches the step's allreduce,
the agreement on input failures, the BatchNorm average and the evaluation in the same order.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

# Ranks read the agreed input-failure and stop flags every this many steps (and at log steps and
# epoch ends): a device sync every step would stall the GPU, and this bounds a stop to seconds.
STOP_CHECK_STEPS = 20


class StepSums(NamedTuple):
    """What the step's allreduce summed since the last read: the losses as means over the ranks
    and the steps, whether any rank failed to read its input or was asked to stop, and whether
    Horovod's elastic driver told rank 0 that the hosts changed."""

    loss: float
    total_loss: float
    bad_input: bool
    stop: bool
    hosts_updated: bool = False


@dataclasses.dataclass(frozen=True)
class Check:
    """A check step, as every rank saw it: the same agreed flags everywhere."""

    epoch: int
    step: int  # 1-based, within the epoch
    steps_per_epoch: int
    global_step: int
    stop: bool  # some rank was asked to stop (SIGTERM)
    hosts_updated: bool = False  # elastic: the driver has new hosts for the job

    @property
    def last_in_epoch(self) -> bool:
        return self.step == self.steps_per_epoch


class Action:
    """Work plugged into the loop, run by every rank at the same points (Orbit's actions); a hook
    that is not overridden does nothing."""

    def at_check(self, check: Check) -> None:
        """At every check step, after its log row."""

    def at_epoch_trained(self, epoch: int, last: bool) -> None:
        """After an epoch's last step and the BatchNorm average, before its evaluation."""

    def at_epoch_end(self, epoch: int, evaluation: dict | None, last: bool) -> bool:
        """After the epoch line; True ends the training after this epoch."""
        return False


@dataclasses.dataclass(frozen=True)
class Schedule:
    epochs: int
    steps_per_epoch: int
    log_every: int
    eval_every: int
    image_size: int  # evaluation's; training's is train_size's
    train_size: Callable[[int], int]  # the training resolution of a 0-based epoch


class Loop:
    """Epochs of steps for one run. `step`, `batches`, `recorder`: trainer/step.py's Trainer,
    trainer/inputs.py's batches, trainer/recorder.py's Recorder (or fakes with their methods);
    `stop_request.requested` is this rank's SIGTERM; `agree` the collective of trainer/ranks.py;
    `hosts_updated()` whether Horovod's elastic driver told this rank the hosts changed;
    `on_step(global_step)` runs after each step."""

    def __init__(
        self,
        step,
        batches,
        recorder,
        schedule: Schedule,
        *,
        actions: list[Action],
        stop_request,
        agree: Callable[[str | None], None],
        hosts_updated: Callable[[], bool] = lambda: False,
        on_step: Callable[[int], None] = lambda global_step: None,
    ):
        self.step = step
        self.batches = batches
        self.recorder = recorder
        self.schedule = schedule
        self.actions = actions
        self.stop_request = stop_request
        self.agree = agree
        self.hosts_updated = hosts_updated
        self.on_step = on_step  # after each step this rank ran (recorder.steps_seen)
        self.global_step = 0
        self.unread_steps = 0  # steps since the sums were last read
        self.interval_steps = 0  # steps since the last log row
        # Wall times: when the host last saw steps done (a check step's read, the first step),
        # and when this loop's first step ended (None before it): a reset's recovery runs from
        # the one before it to the other after it.
        self.steps_seen_done_at: float | None = None
        self.first_step_ended_at: float | None = None

    def evaluate(self) -> dict:
        """Collective: every rank evaluates its share, and all get the summed result."""
        self.recorder.evaluating()
        result = self.step.evaluate(self.batches.eval(), self.batches.describe_eval_error)
        self.recorder.evaluated(result)
        return result

    def run(self, start_epoch: int, skip_steps: int) -> int:
        """Train from step skip_steps of epoch start_epoch + 1 to the last epoch, or to the epoch
        an action ends; evaluate the last epoch trained. Returns the epochs done."""
        schedule = self.schedule
        size = schedule.train_size(start_epoch)
        source = self.batches.train(size, start_epoch, skip_steps)
        if size != schedule.image_size:
            self.recorder.resized(size, start_epoch + 1)
        self.global_step = self.step.global_step()
        trained, evaluated = start_epoch, -1
        self.recorder.begin_training()
        for epoch in range(start_epoch + 1, schedule.epochs + 1):
            self.recorder.begin_epoch(epoch)
            if (resized := schedule.train_size(epoch - 1)) != size:
                # The recipe's next resolution: a new input pipeline, and one more trace (XLA).
                size, source = resized, self.batches.train(resized, epoch - 1, skip_steps)
                self.recorder.resized(size, epoch)
            self.recorder.start_clocks()
            self.train_epoch(epoch, skip_steps if epoch == start_epoch + 1 else 0, source)
            last = epoch == schedule.epochs
            self.step.average_batchnorm_statistics()
            self.step.record_epoch(epoch)
            for action in self.actions:
                action.at_epoch_trained(epoch, last)
            trained, evaluation = epoch, None
            if epoch % schedule.eval_every == 0 or last:
                evaluation, evaluated = self.evaluate(), epoch
            self.recorder.end_epoch(epoch)
            # Every action sees the epoch's end, even after one has asked to stop.
            if any([action.at_epoch_end(epoch, evaluation, last) for action in self.actions]):
                break
        if evaluated != trained:
            self.evaluate()
        return trained

    def train_epoch(self, epoch: int, first_step: int, source) -> None:
        steps_per_epoch = self.schedule.steps_per_epoch
        self.interval_steps = 0
        for index in range(first_step, steps_per_epoch):
            images, labels = source.next()
            bad_input, stop = source.error is not None, self.stop_request.requested
            began = time.perf_counter()
            self.step.train(
                images, labels, bad_input=bad_input, stop=stop, hosts_updated=self.hosts_updated()
            )
            if self.first_step_ended_at is None:
                self.first_step_done(began)
            self.interval_steps += 1
            self.unread_steps += 1
            self.global_step += 1
            self.on_step(self.global_step)
            log_step = self.global_step % self.schedule.log_every == 0
            log_step = log_step or index == steps_per_epoch - 1
            if log_step or self.global_step % STOP_CHECK_STEPS == 0:
                self.check(epoch, index + 1, source.error, log_step)

    def first_step_done(self, began: float) -> None:
        """Wait for the first step (tracing and compiling included) once, and time it."""
        self.step.wait()
        self.first_step_ended_at = self.steps_seen_done_at = time.time()
        self.recorder.first_step(time.perf_counter() - began, self.first_step_ended_at)

    def check(self, epoch: int, step: int, local_error: str | None, log_step: bool) -> None:
        """Read the agreed sums (a device sync), act on their flags, log if it is time."""
        sums = self.step.read_sums(self.unread_steps)
        self.steps_seen_done_at = time.time()
        self.unread_steps = 0
        if sums.bad_input:
            self.agree(local_error)
        if log_step:
            self.recorder.log_step(
                epoch=epoch,
                step=step,
                global_step=self.global_step,
                steps=self.interval_steps,
                loss=sums.loss,
                total_loss=sums.total_loss,
                learning_rate=self.step.learning_rate,
            )
            self.interval_steps = 0
        check = Check(
            epoch,
            step,
            self.schedule.steps_per_epoch,
            self.global_step,
            sums.stop,
            sums.hosts_updated,
        )
        for action in self.actions:
            action.at_check(check)
