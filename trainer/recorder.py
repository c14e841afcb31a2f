"""What a run shows, written by rank 0: the log (the table, the epoch lines), TensorBoard events,
<model-dir>/progress.json (trainer/progress.py), eval.json, train.json, resets.json and
interrupted.json (docs/contracts.md); startup.json by every node's local rank 0; and the
TRAINER_WEIGHTS_DIGEST_DIR test hook, written by every rank.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import tensorflow as tf

from trainer.config import TrainConfig
from trainer.progress import ProgressFile, utc_stamp, write_node_steps

HEADER = f"{'Step':>8} {'Epoch':>6} {'Speed':>9} {'Loss':>7} {'FinLoss':>7} {'LR':>9}"
# bootstrap/spot.py mirrors this name: the node reads the marker after the trainer exits.
INTERRUPTED_FILE = "interrupted.json"
STARTUP_FILE = "startup.json"
NODE_STEPS_EVERY_S = 1.0  # node-steps.json is rewritten at most this often
RESETS_FILE = "resets.json"
# Test hook: when set, every rank writes rank-<r>.sha256 of every variable of its checkpoint
# (weights, optimizer slots, loss scale state, counters) at the end into this directory, and
# under --elastic world-<n>-rank-<r>.sha256 after the sync of each world n (0: the first).
WEIGHTS_DIGEST_ENV = "TRAINER_WEIGHTS_DIGEST_DIR"


def make_model_dir(model_dir: Path) -> str | None:
    """Rank 0's: create the output directory; the error, if that failed, for the ranks to agree."""
    try:
        (model_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        # A marker left by an earlier interrupted attempt must not describe this one.
        (model_dir / INTERRUPTED_FILE).unlink(missing_ok=True)
    except OSError as exc:
        return f"cannot create --model-dir {model_dir}: {exc.strerror}"
    return None


def write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS for the ETA."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Timings:
    """Where this invocation's wall time went, for train.json and the epoch lines. `started` is
    the process's start on time.perf_counter's clock (trainer.train's main takes it first)."""

    def __init__(self, started: float):
        self.started = started
        self.started_at = time.time() - (time.perf_counter() - started)  # the same, wall clock
        self.train_start = None  # set when the first step is about to run
        # steady state: the first interval (of the run, and after each elastic reset) left out
        self.timed_images, self.timed_seconds, self.timed_steps = 0, 0.0, 0
        self.all_images, self.all_seconds = 0, 0.0
        self.first_interval = True
        # The start-up record (docs/contracts.md): the attempt's, which an elastic run keeps in
        # its synced state so that a later rank 0 reports the same.
        self.start_step = 0
        self.framework_start_s: float | None = None
        self.first_step_s: float | None = None
        self.first_step_at: str | None = None
        self.evaluation_s = 0.0
        self.checkpoint_s = 0.0
        self.epochs_done = 0
        self.epochs_s = 0.0

    def interval(self, images: int, seconds: float, steps: int) -> None:
        """The first interval includes graph tracing and compilation: the steady rate leaves it
        out, unless the run is too short to have another (then all_* is the best there is)."""
        self.all_images += images
        self.all_seconds += seconds
        if not self.first_interval:
            self.timed_images += images
            self.timed_seconds += seconds
            self.timed_steps += steps
        self.first_interval = False

    def step_seconds(self) -> float | None:
        """Mean seconds of a steady step (train.json's `step_s`); None before one was timed."""
        return self.timed_seconds / self.timed_steps if self.timed_steps else None

    def first_step(self, seconds: float, ended_at: float) -> bool:
        """The process's first step ended at `ended_at` (wall) after `seconds`; False when an
        earlier world already had its first step."""
        if self.first_step_s is not None:
            return False
        self.first_step_s = round(seconds, 1)
        self.first_step_at = utc_stamp(ended_at)
        self.framework_start_s = round(ended_at - seconds - self.started_at, 1)
        return True

    def startup(self) -> dict:
        """startup.json (docs/contracts.md)."""
        return {
            "started_at": utc_stamp(self.started_at),
            "framework_start_s": self.framework_start_s,
            "first_step_s": self.first_step_s,
            "first_step_at": self.first_step_at,
        }

    def steady_rate(self) -> float | None:
        """The rate without the compiling first interval; None while there is only that one."""
        return self.timed_images / self.timed_seconds if self.timed_seconds else None

    def steady_images_per_s(self) -> float | None:
        if self.timed_seconds:
            return round(self.timed_images / self.timed_seconds, 1)
        return round(self.all_images / self.all_seconds, 1) if self.all_seconds else None

    def summary(self, now: float) -> dict:
        duration = now - self.started
        return {
            "images_per_s": self.steady_images_per_s(),
            # Everything included: start-up, compilation, evaluation, checkpoints.
            "end_to_end_images_per_s": round(self.all_images / duration, 1) if duration else None,
            "duration_s": round(duration, 3),
            "startup_s": round((self.train_start or now) - self.started, 3),
            "evaluation_s": round(self.evaluation_s, 3),
            "checkpoint_s": round(self.checkpoint_s, 3),
        }


class Recorder:
    """The run's outputs. Only rank 0 prints and writes files (`rank`); every rank keeps the
    timings. `step` is trainer/step.py's Trainer (its loss scale and weights digest)."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        rank: int,
        ranks: int,
        steps_per_epoch: int,
        timings,
        step,
        local_rank: int = 0,
    ):
        self.model_dir = config.model_dir
        self.epochs = config.epochs
        self.image_size = config.image_size
        self.batch_size = config.batch_size
        self.timings = timings
        self.step = step
        self.writer = None
        self.progress = ProgressFile(
            self.model_dir,
            enabled=rank == 0,
            epochs=config.epochs,
            steps_per_epoch=steps_per_epoch,
            global_batch=config.batch_size * ranks,
            ranks=ranks,
        )
        self.set_world(rank, ranks, steps_per_epoch, local_rank)
        self.epoch_began = self.interval_began = self.evaluation_began = 0.0
        self.steps_written_at = -NODE_STEPS_EVERY_S  # node-steps.json's last write (monotonic)

    def set_world(self, rank: int, ranks: int, steps_per_epoch: int, local_rank: int) -> None:
        """This rank's place in the world; an elastic run calls it again after every reset,
        after which this process may be rank 0 (the writer) where it was not before."""
        self.rank = rank
        self.local_rank = local_rank
        self.ranks = ranks
        self.global_batch = self.batch_size * ranks
        self.steps_per_epoch = steps_per_epoch
        if rank == 0 and self.writer is None:
            self.writer = tf.summary.create_file_writer(str(self.model_dir / "tensorboard"))
        self.progress.set_world(
            enabled=rank == 0,
            ranks=ranks,
            steps_per_epoch=steps_per_epoch,
            global_batch=self.global_batch,
        )
        self.timings.first_interval = True  # the next one includes the reset's recovery

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(message, flush=True)

    def resized(self, size: int, epoch: int) -> None:
        self.log(f"training at {size}x{size} from epoch {epoch} (evaluation at {self.image_size})")

    def begin_training(self) -> None:
        self.log(HEADER)
        if self.timings.train_start is None:  # the first world's: elastic worlds begin again
            self.timings.train_start = time.perf_counter()

    def training_seconds(self) -> float:
        return time.perf_counter() - self.timings.train_start

    def begin_epoch(self, epoch: int) -> None:
        self.log(f"Epoch {epoch}/{self.epochs}")

    def start_clocks(self) -> None:
        """The epoch's and its first interval's, once its input pipeline is built."""
        self.epoch_began = time.perf_counter()
        self.interval_began = time.perf_counter()

    def log_step(self, *, epoch, step, global_step, steps, loss, total_loss, learning_rate) -> None:
        """A table row for the `steps` since the last: `step` is 1-based within `epoch`, the
        losses are means, learning_rate() is read after the interval's clock stopped."""
        now = time.perf_counter()
        images, seconds = self.global_batch * steps, now - self.interval_began
        speed = images / seconds
        self.timings.interval(images, seconds, steps)
        progress = epoch - 1 + step / self.steps_per_epoch
        lr = learning_rate()
        self.log(
            f"{global_step:8d} {progress:6.2f} {speed:9.1f} {loss:7.3f} {total_loss:7.3f} {lr:9.5f}"
        )
        if self.rank == 0:
            with self.writer.as_default(step=global_step):
                tf.summary.scalar("train/loss", loss)
                tf.summary.scalar("train/total_loss", total_loss)
                tf.summary.scalar("train/learning_rate", lr)
                tf.summary.scalar("train/images_per_s", speed)
            self.progress.log_step(
                epoch=epoch,
                step=step,
                global_step=global_step,
                images_per_s=speed,
                loss=loss,
                steady_images_per_s=self.timings.steady_rate(),
            )
        self.interval_began = time.perf_counter()

    def steps_seen(self, global_step: int) -> None:
        """After each step: the node's local rank 0 says its ranks step (node-steps.json, at
        most once a second: a rename, beside a GPU step of a tenth of a second), and its
        bootstrap waits for a silent head while they do (docs/contracts.md). A step's ops may
        still run (no device sync here), but a rank hung in a collective stops stepping within
        the loop's next sync, at most STOP_CHECK_STEPS steps on."""
        now = time.monotonic()
        if self.local_rank != 0 or now - self.steps_written_at < NODE_STEPS_EVERY_S:
            return
        self.steps_written_at = now
        self.model_dir.mkdir(parents=True, exist_ok=True)
        write_node_steps(self.model_dir, global_step)

    def evaluating(self) -> None:
        self.evaluation_began = time.perf_counter()
        self.progress.evaluating()

    def evaluated(self, result: dict) -> None:
        self.progress.evaluated(result["top1"])
        self.timings.evaluation_s += time.perf_counter() - self.evaluation_began
        self.log(
            f"Eval epoch {result['epoch']}: top1 {result['top1']:.4f} top5 {result['top5']:.4f} "
            f"on {result['images']} images"
        )
        if self.rank == 0:
            write_json(self.model_dir / "eval.json", result)
            with self.writer.as_default(step=result["epoch"]):
                tf.summary.scalar("eval/top1", result["top1"])
                tf.summary.scalar("eval/top5", result["top5"])

    def end_epoch(self, epoch: int) -> None:
        epoch_s = time.perf_counter() - self.epoch_began
        self.timings.epochs_done += 1
        self.timings.epochs_s += epoch_s
        self.log(self.epoch_line(epoch, epoch_s))

    def epoch_line(self, epoch: int, epoch_s: float) -> str:
        """What a fleet user reads per epoch: its wall time (evaluation and checkpoint included),
        the rate per GPU beside the global one, the ETA, and fp16's loss scale and skipped
        steps."""
        timings = self.timings
        steady = timings.steady_images_per_s() or 0.0
        eta = (self.epochs - epoch) * timings.epochs_s / timings.epochs_done
        line = (
            f"Epoch {epoch}/{self.epochs} done in {epoch_s:.1f} s: {steady:.1f} img/s "
            f"({steady / self.ranks:.1f} per GPU), {self.global_batch} images/step, "
            f"ETA {clock(eta)}"
        )
        if (loss_scale := self.step.loss_scale_state()) is not None:
            line += f", loss scale {loss_scale[0]:g}, {loss_scale[1]} skipped steps"
        return line

    def reached_target(self, target: float, epoch: int, top1: float, seconds: float) -> None:
        self.log(
            f"Reached the target top-1 {target:.4f} at epoch {epoch} ({top1:.4f}) in "
            f"{clock(seconds)}: stopping"
        )

    def first_step(self, seconds: float, ended_at: float) -> None:
        """The process's first step ended: every node's local rank 0 writes startup.json."""
        if self.timings.first_step(seconds, ended_at) and self.local_rank == 0:
            self.model_dir.mkdir(parents=True, exist_ok=True)
            write_json(self.model_dir / STARTUP_FILE, self.timings.startup())

    def write_resets(self, resets: list[dict]) -> None:
        """resets.json: rank 0 rewrites it after every elastic reset (docs/contracts.md)."""
        if self.rank == 0:
            write_json(self.model_dir / RESETS_FILE, resets)

    def interrupted(self, message: str) -> None:
        """Rank 0's marker for the node (docs/contracts.md): the checkpoint is on disk."""
        if self.rank == 0:
            latest = tf.train.latest_checkpoint(str(self.model_dir / "checkpoints"))
            write_json(
                self.model_dir / INTERRUPTED_FILE,
                {"reason": message, "checkpoint": latest, "step": checkpoint_step(latest)},
            )

    def finish(
        self, epochs_trained: int, target: dict, *, end_step: int, resets: list[dict]
    ) -> None:
        """train.json (with `target`'s fields and the attempt's start-up and resets), the digest
        hook, and the last line. `end_step` is the global step reached."""
        now = time.perf_counter()
        if self.rank == 0:
            timings = self.timings
            step_s = timings.step_seconds()
            write_json(
                self.model_dir / "train.json",
                {
                    "epochs": epochs_trained,
                    "epochs_planned": self.epochs,
                    "global_batch": self.global_batch,
                    **target,
                    **timings.summary(now),
                    "start_step": timings.start_step,
                    "end_step": end_step,
                    "step_s": None if step_s is None else round(step_s, 4),
                    "framework_start_s": timings.framework_start_s,
                    "first_step_s": timings.first_step_s,
                    "first_step_at": timings.first_step_at,
                    "steps_redone": sum(reset["steps_redone"] for reset in resets),
                    "resets": resets,
                },
            )
            self.writer.flush()
        self.write_digest()
        self.log_finished(now)

    def log_finished(self, now: float) -> None:
        self.log(f"Finished in {now - self.timings.started:.1f}")

    def write_digest(self, prefix: str = "") -> None:
        """The test hook: `<prefix>rank-<r>.sha256` of every state variable (elastic: also
        `world-<n>-rank-<r>.sha256` right after the n-th world's sync)."""
        digest_dir = os.environ.get(WEIGHTS_DIGEST_ENV)
        if digest_dir:
            path = Path(digest_dir, f"{prefix}rank-{self.rank}.sha256")
            path.write_text(self.step.weights_digest() + "\n")


def checkpoint_step(path: str | None) -> int | None:
    """ckpt-<global step>, the number the checkpoints are saved under."""
    return int(path.rsplit("-", 1)[1]) if path else None
