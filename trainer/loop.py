"""The training run of `python -m trainer.train` (trainer/train.py parses the command line, then
imports this module, TensorFlow and Horovod): ResNet on ImageNet TFRecords, resumable, then
evaluated.

Outputs (rank 0): <model-dir>/checkpoints/ (at epoch ends every --checkpoint-every-s, at the end,
and on SIGTERM; a restart resumes from the newest, mid-epoch included), <model-dir>/tensorboard/,
<model-dir>/eval.json, <model-dir>/train.json, <model-dir>/progress.json (trainer/progress.py), and
<model-dir>/interrupted.json after a SIGTERM.
Bad input ends every rank with one `error: ...` line and exit status 2: ranks agree on failures
through a collective before going on, so none is left waiting on a rank that stopped.
SIGTERM to any rank: every rank stops at the same step within STOP_CHECK_STEPS steps, rank 0
saves a checkpoint of that step and writes interrupted.json, and every rank exits with status
EXIT_INTERRUPTED (docs/contracts.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from trainer import affinity, data, recipes
from trainer.cli import fail
from trainer.config import TrainConfig
from trainer.model import build_resnet, decayed_variables
from trainer.optim import lars_scale, make_optimizer, make_schedule
from trainer.progress import ProgressFile

SYNTHETIC_STEPS_PER_EPOCH = 100
# Test hook: when set, every rank writes rank-<r>.sha256 of every variable of its checkpoint
# (weights, optimizer slots, loss scale state, counters) at the end into this directory.
WEIGHTS_DIGEST_ENV = "TRAINER_WEIGHTS_DIGEST_DIR"
HEADER = f"{'Step':>8} {'Epoch':>6} {'Speed':>9} {'Loss':>7} {'FinLoss':>7} {'LR':>9}"
# Ranks read the agreed input-failure and stop flags every this many steps (and at log steps and
# epoch ends): a device sync every step would stall the GPU, and this bounds a stop to seconds.
STOP_CHECK_STEPS = 20
# Exit status of every rank after a SIGTERM that was turned into a checkpoint (sysexits.h
# EX_TEMPFAIL: try again, and the rerun resumes); rank 0 also writes INTERRUPTED_FILE.
EXIT_INTERRUPTED = 75
INTERRUPTED_FILE = "interrupted.json"
# Layout of the vector every step allreduces (summed): the losses for the log, and the flags.
CROSS_ENTROPY, TOTAL_LOSS, BAD_INPUT, STOP = range(4)


class RunError(Exception):
    """A failure every rank has agreed on; main() prints it as one `error: ...` line."""


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


def log(message: str) -> None:
    if hvd.rank() == 0:
        print(message, flush=True)


def agree(local_error: str | None) -> None:
    """Collective: raise RunError on every rank if any rank has an error (the first one's text)."""
    failed = hvd.allreduce(
        tf.constant(0 if local_error is None else 1, tf.int32), op=hvd.Sum, name="agree_flag"
    )
    if int(failed) == 0:
        return
    messages = hvd.allgather_object(local_error, name="agree_messages")
    raise RunError(next(m for m in messages if m))


def setup_devices() -> bool:
    """Pin one GPU per local rank; on CPU share the cores among the local ranks. Returns has_gpu."""
    gpus = tf.config.list_physical_devices("GPU")
    local_error = None
    if not gpus:
        cores = len(os.sched_getaffinity(0))
        # TensorFlow refuses once its runtime has started (an earlier run in this process, as in
        # the tests): that run's setting stays.
        with contextlib.suppress(RuntimeError):
            tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // hvd.local_size()))
    elif hvd.local_size() > len(gpus):
        local_error = (
            f"{hvd.local_size()} ranks on one node with {len(gpus)} GPUs: one rank per GPU"
        )
    else:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        # Horovod: pin one GPU per process, chosen by local rank.
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    agree(local_error)
    return bool(gpus)


def resolve_input(config: TrainConfig, global_batch: int):
    """This rank's shards, the class count and label base, and steps per epoch; agreed by all."""
    info, train_shard, val_shard, local_error = None, None, None, None
    try:
        info = data.resolve_dataset(config.data_dir, config.num_classes, config.label_base)
        # Horovod: every record goes to one rank, whole files where there are enough of them.
        train_shard = data.shard_for_rank(info.train_files, hvd.rank(), hvd.size())
        val_shard = data.shard_for_rank(info.validation_files, hvd.rank(), hvd.size())
    except data.DataError as exc:
        local_error = str(exc)
    agree(local_error)
    if config.eval_only:  # no training: the schedule, hence steps per epoch, is irrelevant
        return info, train_shard, val_shard, 1
    split = train_shard.ways > 1
    # The same on every rank (the allreduce below needs them all); `split` may differ by rank.
    need_total = info.train_records is None and not config.steps_per_epoch
    local_count = 0
    try:
        # A rank whose own shards are empty would wait forever for its first batch while the
        # others wait for it in the step's allreduce, even when the whole split has records.
        what = f"rank {hvd.rank()}'s train shards, from {train_shard.files[0]},"
        data.require_records(train_shard.files, what)
        if split or need_total:
            local_count = data.count_shard_records(train_shard)
        if split and local_count == 0:
            raise data.DataError(
                f"rank {hvd.rank()}'s share of {train_shard.files[0]} (every "
                f"{train_shard.ways}th record) holds no records: use fewer ranks or more shards"
            )
    except data.DataError as exc:
        local_error = str(exc)
    agree(local_error)
    train_records = info.train_records
    if need_total:
        train_records = int(hvd.allreduce(tf.constant(local_count), op=hvd.Sum, name="records"))
    steps = config.steps_per_epoch or train_records // global_batch
    if steps == 0:
        raise RunError(
            f"{train_records} train records in {config.data_dir} are fewer than one global batch "
            f"of {global_batch} ({hvd.size()} ranks x --batch-size {config.batch_size})"
        )
    return info, train_shard, val_shard, steps


def input_threads(node_cpus: int) -> int:
    """This rank's share of the node's CPUs (counted before it was bound to its GPU's socket)."""
    return max(1, node_cpus // hvd.local_size())


def rank_train_batches(
    config: TrainConfig,
    info: data.DatasetInfo,
    shard: data.RankShard,
    *,
    image_size: int,
    seed: int,
    threads: int,
    device: str | None,
):
    """This rank's endless training batches from its shard at image_size, augmented as the
    flags say."""
    return iter(
        data.train_dataset(
            shard.files,
            batch_size=config.batch_size,
            image_size=image_size,
            num_classes=info.num_classes,
            label_base=info.label_base,
            shuffle_buffer=config.shuffle_buffer,
            min_crop_area=config.min_crop_area,
            seed=seed,
            threads=threads,
            ways=shard.ways,
            index=shard.index,
            device=device,
        )
    )


def checkpoint_variables(checkpoint: tf.train.Checkpoint) -> list[tf.Variable]:
    """Every variable the checkpoint saves, in its object graph's order (the same on every rank):
    the model, the optimizer's slots and iterations, the loss scale and its good-step counter
    (LossScaleOptimizer.variables leaves those two out), and the progress counters."""
    return [
        node
        for node in tf.train.TrackableView(checkpoint).descendants()
        if isinstance(node, tf.Variable)
    ]


class Trainer:
    """Model, optimizer, compiled steps and checkpoint for one run."""

    def __init__(
        self,
        config: TrainConfig,
        recipe: recipes.Recipe,
        num_classes: int,
        steps_per_epoch: int,
        gpu: bool,
    ):
        assert config.epochs == recipe.epochs, "run with settle_recipe's config"
        self.config = config
        self.recipe = recipe
        self.num_classes = num_classes
        self.global_batch = config.batch_size * hvd.size()
        mixed = config.precision == "fp16" or (config.precision == "auto" and gpu)
        self.xla = config.xla == "on" or (config.xla == "auto" and gpu)
        self.lars = recipe.lars
        self.warmup_epochs = recipe.warmup_epochs
        self.mixed = mixed
        if mixed:
            tf.keras.mixed_precision.set_global_policy("mixed_float16")
        sized = None if recipe.progressive else config.image_size
        self.model = build_resnet(config.arch, num_classes, sized)
        # Horovod: the learning rate follows the global batch (the recipe's rule for it).
        self.peak_lr = recipe.peak_lr
        total_steps = config.epochs * steps_per_epoch
        warmup_steps = min(round(self.warmup_epochs * steps_per_epoch), total_steps)
        self.schedule = make_schedule(recipe.decay, self.peak_lr, warmup_steps, total_steps)
        self.optimizer = make_optimizer(self.schedule, recipe.momentum, mixed, self.lars)
        self.optimizer.build(self.model.trainable_variables)
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_epochs")
        # A checkpoint taken mid-epoch (SIGTERM) records how far into the epoch it was, and the
        # epoch length then, so a rerun with other ranks or batch resumes at the same fraction.
        self.epoch_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch_step")
        self.saved_steps_per_epoch = tf.Variable(
            steps_per_epoch, dtype=tf.int64, trainable=False, name="steps_per_epoch"
        )
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            epoch=self.epoch,
            epoch_step=self.epoch_step,
            steps_per_epoch=self.saved_steps_per_epoch,
        )
        # Listed once, before any save or restore: rank 0's CheckpointManager later adds a
        # save_counter the other ranks never get, and every rank must broadcast the same list.
        self.state = checkpoint_variables(self.checkpoint)
        # Summed over steps between two reads: [cross entropy, total loss, bad input, stop].
        self.step_sums = tf.Variable(tf.zeros([4]), trainable=False, name="step_sums")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped")
        self.decayed = decayed_variables(self.model)
        self.lars_ids = {id(v) for v in self.decayed}
        self.forward = tf.function(self._forward, jit_compile=self.xla)
        self.train_step = tf.function(self._train_step)
        self.eval_step = tf.function(self._eval_step, jit_compile=self.xla, reduce_retracing=True)

    def _forward(self, images, labels):
        logits = self.model(images, training=True)
        smoothed = tf.one_hot(labels, self.num_classes) * (1 - self.recipe.label_smoothing)
        smoothed += self.recipe.label_smoothing / self.num_classes
        cross_entropy = tf.reduce_mean(
            tf.nn.softmax_cross_entropy_with_logits(labels=smoothed, logits=logits)
        )
        l2 = tf.add_n([tf.reduce_sum(tf.square(v)) for v in self.decayed])
        return cross_entropy, cross_entropy + 0.5 * self.recipe.weight_decay * l2

    def _train_step(self, images, labels, flags):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            cross_entropy, total = self.forward(images, labels)
            loss = self.optimizer.get_scaled_loss(total) if self.mixed else total
        tape = distributed_tape(tape)
        grads = tape.gradient(loss, variables)
        if self.mixed:
            grads = self.optimizer.get_unscaled_gradients(grads)
            scale_before = self.optimizer.loss_scale
        if self.lars:
            # MLPerf's trust ratio for its recipe; LARC's above 16k in goyal's.
            mlperf = self.recipe.weight_decay if self.recipe.decay == "poly" else None
            grads = lars_scale(grads, variables, self.lars_ids, mlperf)
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        if self.mixed:  # a step with non-finite gradients is skipped and halves the loss scale
            skipped = self.optimizer.loss_scale < scale_before
            self.skipped_steps.assign_add(tf.cast(skipped, tf.int64))
        # Horovod: one small allreduce carries the losses for the log and every rank's input
        # failure and stop flags; the host reads the sums only at check steps.
        local = tf.concat([tf.stack([cross_entropy, total]), tf.cast(flags, tf.float32)], 0)
        self.step_sums.assign_add(hvd.allreduce(local, op=hvd.Sum, name="step_sums"))

    def _eval_step(self, images, labels):
        logits = self.model(images, training=False)
        top1 = tf.math.in_top_k(labels, logits, 1)
        top5 = tf.math.in_top_k(labels, logits, min(5, self.num_classes))
        return tf.reduce_sum(tf.cast(top1, tf.int64)), tf.reduce_sum(tf.cast(top5, tf.int64))

    def learning_rate(self) -> float:
        return float(self.schedule(self.optimizer.iterations))

    def read_step_sums(self) -> np.ndarray:
        """The sums since the last read (a device sync: only at check steps), then reset."""
        sums = self.step_sums.numpy()
        self.step_sums.assign(tf.zeros([4]))
        return sums

    def broadcast_state(self) -> None:
        # Horovod: every rank starts from rank 0's variables, fresh or restored: all of the
        # checkpoint's, so that fp16 ranks also share rank 0's loss scale and good-step count.
        hvd.broadcast_variables(self.state, root_rank=0)

    def average_batchnorm_statistics(self) -> None:
        """Moving means/variances drift apart per rank (each sees its own data): average them."""
        stats = self.model.non_trainable_variables
        averaged = hvd.grouped_allreduce(stats, op=hvd.Average, name="bn_statistics")
        for variable, value in zip(stats, averaged, strict=True):
            variable.assign(value)

    def weights_digest(self) -> str:
        digest = hashlib.sha256()
        for variable in self.state:
            digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
        return digest.hexdigest()


def distributed_tape(tape: tf.GradientTape) -> hvd.DistributedGradientTape:
    """Horovod: average gradients over ranks, sent as float16 to halve the traffic. Each rank's
    gradient is divided by the rank count before the sum (prescale 1/size), not after it: the
    sum of 512 loss-scaled float16 gradients would overflow where their average does not."""
    return hvd.DistributedGradientTape(
        tape, compression=hvd.Compression.fp16, gradient_predivide_factor=float(hvd.size())
    )


def restore_newest(trainer: Trainer, manager: tf.train.CheckpointManager | None) -> str | None:
    """Rank 0 restores the newest checkpoint, then every rank gets its state. Returns its path."""
    local_error, path = None, None
    if hvd.rank() == 0 and manager.latest_checkpoint:
        path = manager.latest_checkpoint
        try:
            trainer.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            first_line = str(exc).strip().splitlines()[0]
            local_error = f"checkpoint {path} does not fit this model/flags: {first_line}"
    agree(local_error)
    trainer.broadcast_state()
    return hvd.broadcast_object(path, root_rank=0, name="restored_path")


def resume_step(epoch_step: int, saved_steps_per_epoch: int, steps_per_epoch: int) -> int:
    """Steps already done in the epoch a checkpoint was taken in, in this run's step length."""
    if saved_steps_per_epoch == steps_per_epoch or saved_steps_per_epoch <= 0:
        return min(epoch_step, steps_per_epoch)
    return min(round(epoch_step * steps_per_epoch / saved_steps_per_epoch), steps_per_epoch)


def evaluate(trainer: Trainer, batches, shard: data.RankShard) -> dict:
    """Top-1/top-5 over this rank's batches, summed over all ranks."""
    counts = np.zeros(3, np.int64)
    local_error = None
    try:
        for images, labels in batches:
            top1, top5 = trainer.eval_step(images, labels)
            counts += (int(top1), int(top5), int(labels.shape[0]))
    except tf.errors.OpError as exc:
        local_error = data.describe_input_error(exc, shard.files, trainer.config.image_size)
    agree(local_error)
    # Horovod: sum the counts from every rank's share of the validation records.
    top1, top5, images = hvd.allreduce(tf.constant(counts), op=hvd.Sum, name="eval").numpy()
    return {
        "top1": float(top1 / max(images, 1)),
        "top5": float(top5 / max(images, 1)),
        "epoch": int(trainer.epoch.numpy()),
        "images": int(images),
    }


def write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS for the ETA."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Timings:
    """Where this invocation's wall time went, for train.json and the epoch lines."""

    def __init__(self, started: float):
        self.started = started
        self.train_start = None  # set when the first step is about to run
        self.timed_images, self.timed_seconds = 0, 0.0  # steady state: the first interval left out
        self.all_images, self.all_seconds = 0, 0.0
        self.first_interval = True
        self.evaluation_s = 0.0
        self.checkpoint_s = 0.0
        self.epochs_done = 0
        self.epochs_s = 0.0

    def interval(self, images: int, seconds: float) -> None:
        """The first interval includes graph tracing and compilation: the steady rate leaves it
        out, unless the run is too short to have another (then all_* is the best there is)."""
        self.all_images += images
        self.all_seconds += seconds
        if not self.first_interval:
            self.timed_images += images
            self.timed_seconds += seconds
        self.first_interval = False

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


def settle_recipe(config: TrainConfig, global_batch: int) -> tuple[TrainConfig, recipes.Recipe]:
    """The recipe at this global batch, and the config with its epochs."""
    recipe = recipes.resolve(
        config.recipe,
        global_batch,
        base_lr=config.base_lr,
        epochs=config.epochs,
        warmup_epochs=config.warmup_epochs,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        label_smoothing=config.label_smoothing,
    )
    return dataclasses.replace(config, epochs=recipe.epochs), recipe


def run(config: TrainConfig, stop: StopRequest, node_cpus: int) -> None:
    started = time.perf_counter()
    timings = Timings(started)
    gpu = setup_devices()
    global_batch = config.batch_size * hvd.size()
    config, recipe = settle_recipe(config, global_batch)
    if config.synthetic:
        num_classes = config.num_classes or data.DEFAULT_NUM_CLASSES
        steps_per_epoch = config.steps_per_epoch or SYNTHETIC_STEPS_PER_EPOCH
        train_shard = val_shard = data.RankShard([])
    else:
        info, train_shard, val_shard, steps_per_epoch = resolve_input(config, global_batch)
        num_classes = info.num_classes
    if config.seed is not None:
        # Rank 0's initial weights are broadcast to every rank, so its seed decides them.
        tf.keras.utils.set_random_seed(config.seed)
    trainer = Trainer(config, recipe, num_classes, steps_per_epoch, gpu)
    model_dir = config.model_dir
    manager, writer, local_error = None, None, None
    if hvd.rank() == 0:
        try:
            (model_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            # A marker left by an earlier interrupted attempt must not describe this one.
            (model_dir / INTERRUPTED_FILE).unlink(missing_ok=True)
        except OSError as exc:
            local_error = f"cannot create --model-dir {model_dir}: {exc.strerror}"
    agree(local_error)
    if hvd.rank() == 0:
        manager = tf.train.CheckpointManager(
            trainer.checkpoint, str(model_dir / "checkpoints"), config.keep_checkpoints
        )
        writer = tf.summary.create_file_writer(str(model_dir / "tensorboard"))
    progress_file = ProgressFile(
        model_dir,
        enabled=hvd.rank() == 0,
        epochs=config.epochs,
        steps_per_epoch=steps_per_epoch,
        global_batch=global_batch,
    )
    log(
        f"{config.arch}: {num_classes} classes, {hvd.size()} ranks x {config.batch_size} = "
        f"global batch {global_batch}, {steps_per_epoch} steps/epoch, peak LR {trainer.peak_lr:g}"
        f"{' (LARS)' if trainer.lars else ''}, {trainer.warmup_epochs:g} warmup epochs, "
        f"{'mixed float16' if trainer.mixed else 'float32'}, XLA {'on' if trainer.xla else 'off'}"
    )
    log(recipe.describe())
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

    device = "/gpu:0" if gpu else None  # the one GPU this rank sees
    if config.synthetic:
        batch = data.synthetic_batch(config.batch_size, config.image_size, num_classes)

        def eval_batches():
            return [batch]

        def train_batches(size: int, epoch: int):
            sized = data.synthetic_batch(config.batch_size, size, num_classes)
            while True:
                yield sized
    else:
        threads = input_threads(node_cpus)
        shuffle_seed = (config.seed or 0) * 15485863  # --seed moves every rank's and epoch's

        def eval_batches():
            return data.eval_dataset(
                val_shard.files,
                batch_size=config.batch_size,
                image_size=config.image_size,
                num_classes=num_classes,
                label_base=info.label_base,
                threads=threads,
                ways=val_shard.ways,
                index=val_shard.index,
                device=device,
            )

        def train_batches(size: int, epoch: int):
            return rank_train_batches(
                config,
                info,
                train_shard,
                image_size=size,
                seed=shuffle_seed + hvd.rank() * 7919 + epoch * 104729 + skip_steps,
                threads=threads,
                device=device,
            )

    def evaluate_and_record() -> dict:
        began = time.perf_counter()
        progress_file.evaluating()
        result = evaluate(trainer, eval_batches(), val_shard)
        progress_file.evaluated(result["top1"])
        timings.evaluation_s += time.perf_counter() - began
        log(
            f"Eval epoch {result['epoch']}: top1 {result['top1']:.4f} top5 {result['top5']:.4f} "
            f"on {result['images']} images"
        )
        if hvd.rank() == 0:
            write_json(model_dir / "eval.json", result)
            with writer.as_default(step=result["epoch"]):
                tf.summary.scalar("eval/top1", result["top1"])
                tf.summary.scalar("eval/top5", result["top5"])
        return result

    if config.eval_only:
        if not restored:
            raise RunError(f"--eval-only: no checkpoint in {model_dir / 'checkpoints'}")
        evaluate_and_record()
        log(f"Finished in {time.perf_counter() - started:.1f}")
        return

    last_saved = time.perf_counter()

    def save_checkpoint(epoch_step: int) -> None:
        """Rank 0 writes; the others go on to the next step and wait there only for its end.
        Synchronous: TF 2.15's async checkpointing skips mixed precision's AutoCastVariables."""
        nonlocal last_saved
        began = time.perf_counter()
        trainer.epoch_step.assign(epoch_step)
        if hvd.rank() == 0:
            step_number = int(trainer.optimizer.iterations.numpy())
            print(f"Saved checkpoint {manager.save(checkpoint_number=step_number)}", flush=True)
        last_saved = time.perf_counter()
        timings.checkpoint_s += last_saved - began

    size = recipe.train_size(start_epoch, config.image_size)
    batches = train_batches(size, start_epoch)
    if size != config.image_size:
        log(f"training at {size}x{size} from epoch {start_epoch + 1} (evaluation at "
            f"{config.image_size})")  # fmt: skip
    step = int(trainer.optimizer.iterations.numpy())
    evaluated_epoch = -1
    trained_epoch = start_epoch
    reached: dict | None = None  # the evaluation that reached --target-top1
    local_error = None
    steps_since_read = 0
    log(HEADER)
    timings.train_start = time.perf_counter()
    for epoch in range(start_epoch + 1, config.epochs + 1):
        log(f"Epoch {epoch}/{config.epochs}")
        if (resized := recipe.train_size(epoch - 1, config.image_size)) != size:
            # The recipe's next resolution: a new input pipeline, and one more trace (XLA).
            size, batches = resized, train_batches(resized, epoch - 1)
            log(f"training at {size}x{size} from epoch {epoch} (evaluation at {config.image_size})")
        images_shape = [config.batch_size, size, size, 3]
        placeholder = (tf.zeros(images_shape, tf.uint8), tf.zeros([config.batch_size], tf.int32))
        epoch_began = time.perf_counter()
        interval_start, interval_steps = time.perf_counter(), 0
        first_step = skip_steps if epoch == start_epoch + 1 else 0
        for step_in_epoch in range(first_step, steps_per_epoch):
            if local_error is None:
                try:
                    images, labels = next(batches)
                except tf.errors.OpError as exc:
                    local_error = data.describe_input_error(
                        exc, train_shard.files, config.image_size
                    )
            if local_error is not None:
                # Keep this rank in the step's collectives until the ranks next read the flags.
                images, labels = placeholder
            flags = [float(local_error is not None), float(stop.requested)]
            trainer.train_step(images, labels, tf.constant(flags))
            interval_steps += 1
            steps_since_read += 1
            step += 1
            last_in_epoch = step_in_epoch == steps_per_epoch - 1
            log_step = step % config.log_every == 0 or last_in_epoch
            if not (log_step or step % STOP_CHECK_STEPS == 0):
                continue
            sums = trainer.read_step_sums()  # the same values on every rank: they agree here
            summed_steps, steps_since_read = steps_since_read, 0
            if sums[BAD_INPUT]:
                agree(local_error)
            if log_step:
                now = time.perf_counter()
                speed = global_batch * interval_steps / (now - interval_start)
                timings.interval(global_batch * interval_steps, now - interval_start)
                progress = epoch - 1 + (step_in_epoch + 1) / steps_per_epoch
                lr = trainer.learning_rate()
                # Mean over the ranks and over the steps since the previous read.
                loss = sums[CROSS_ENTROPY] / hvd.size() / summed_steps
                total = sums[TOTAL_LOSS] / hvd.size() / summed_steps
                log(f"{step:8d} {progress:6.2f} {speed:9.1f} {loss:7.3f} {total:7.3f} {lr:9.5f}")
                if hvd.rank() == 0:
                    with writer.as_default(step=step):
                        tf.summary.scalar("train/loss", loss)
                        tf.summary.scalar("train/total_loss", total)
                        tf.summary.scalar("train/learning_rate", lr)
                        tf.summary.scalar("train/images_per_s", speed)
                    progress_file.log_step(
                        epoch=epoch,
                        step=step_in_epoch + 1,
                        global_step=step,
                        images_per_s=speed,
                        loss=loss,
                        steady_images_per_s=timings.steady_rate(),
                    )
                interval_start, interval_steps = time.perf_counter(), 0
            if sums[STOP]:
                trainer.average_batchnorm_statistics()
                if last_in_epoch:
                    trainer.epoch.assign(epoch)
                save_checkpoint(0 if last_in_epoch else step_in_epoch + 1)
                message = (
                    f"{stop.signal_name or 'a signal on another rank'}: stopped at step {step} "
                    f"(epoch {epoch}, step {step_in_epoch + 1} of {steps_per_epoch})"
                )
                write_interrupted(config, message)
                # A barrier: horovodrun ends the other ranks 5 s after the first one exits, so
                # none may leave before rank 0's checkpoint and marker are on disk.
                agree(None)
                raise Interrupted(message)
        trainer.average_batchnorm_statistics()
        trainer.epoch.assign(epoch)
        last_epoch = epoch == config.epochs
        if last_epoch or time.perf_counter() - last_saved >= config.checkpoint_every_s:
            save_checkpoint(0)
        trained_epoch = epoch
        result = None
        if epoch % config.eval_every == 0 or last_epoch:
            result = evaluate_and_record()
            evaluated_epoch = epoch
        epoch_s = time.perf_counter() - epoch_began
        timings.epochs_done += 1
        timings.epochs_s += epoch_s
        log(epoch_line(trainer, timings, epoch, config.epochs, epoch_s, global_batch))
        # Every rank has the same allreduced top-1, so every rank stops here together.
        if config.target_top1 is not None and result and result["top1"] >= config.target_top1:
            reached = {
                "epoch": epoch,
                "time_to_target_s": round(time.perf_counter() - timings.train_start, 1),
            }
            if not last_epoch:
                save_checkpoint(0)
            log(
                f"Reached the target top-1 {config.target_top1:.4f} at epoch {epoch} "
                f"({result['top1']:.4f}) in {clock(reached['time_to_target_s'])}: stopping"
            )
            break
    if evaluated_epoch != trained_epoch:
        evaluate_and_record()

    now = time.perf_counter()
    if hvd.rank() == 0:
        target = (
            {}
            if config.target_top1 is None
            else {
                "target_top1": config.target_top1,
                "reached_target_at_epoch": reached and reached["epoch"],
                "time_to_target_s": reached and reached["time_to_target_s"],
            }
        )
        write_json(
            model_dir / "train.json",
            {
                "epochs": trained_epoch,
                "epochs_planned": config.epochs,
                "global_batch": global_batch,
                **target,
                **timings.summary(now),
            },
        )
        writer.flush()
    write_digest(trainer)
    log(f"Finished in {now - started:.1f}")


def epoch_line(
    trainer: Trainer, timings: Timings, epoch: int, epochs: int, epoch_s: float, global_batch: int
) -> str:
    """What a fleet user reads per epoch: its wall time (evaluation and checkpoint included),
    the rate per GPU beside the global one, the ETA, and fp16's loss scale and skipped steps."""
    steady = timings.steady_images_per_s() or 0.0
    eta = (epochs - epoch) * timings.epochs_s / timings.epochs_done
    line = (
        f"Epoch {epoch}/{epochs} done in {epoch_s:.1f} s: {steady:.1f} img/s "
        f"({steady / hvd.size():.1f} per GPU), {global_batch} images/step, ETA {clock(eta)}"
    )
    if trainer.mixed:
        line += (
            f", loss scale {float(trainer.optimizer.loss_scale):g}, "
            f"{int(trainer.skipped_steps.numpy())} skipped steps"
        )
    return line


def write_digest(trainer: Trainer) -> None:
    digest_dir = os.environ.get(WEIGHTS_DIGEST_ENV)
    if digest_dir:
        Path(digest_dir, f"rank-{hvd.rank()}.sha256").write_text(trainer.weights_digest() + "\n")


def write_interrupted(config: TrainConfig, message: str) -> None:
    """Rank 0's marker for the node (docs/contracts.md): the checkpoint is on disk."""
    if hvd.rank() == 0:
        latest = tf.train.latest_checkpoint(str(config.model_dir / "checkpoints"))
        write_json(
            config.model_dir / INTERRUPTED_FILE,
            {"reason": message, "checkpoint": latest, "step": _checkpoint_step(latest)},
        )


def _checkpoint_step(path: str | None) -> int | None:
    """ckpt-<global step>, the number the checkpoints are saved under."""
    return int(path.rsplit("-", 1)[1]) if path else None


def start(config: TrainConfig) -> int:
    """Train as `config` says on this rank; returns the exit status (0, or EXIT_INTERRUPTED)."""
    stop = StopRequest()
    # The node's CPUs, counted before this rank is bound to its GPU's socket: the input threads
    # are a share of the node, not of the socket.
    node_cpus = len(os.sched_getaffinity(0))
    bound = affinity.bind_to_gpu_socket()  # before Horovod and TensorFlow start their threads
    # Horovod: initialise before anything asks for rank, size or local rank.
    hvd.init()
    stop.install()  # after MPI_Init, which may install handlers of its own
    if bound:
        log(bound)
    try:
        run(config, stop, node_cpus)
    except RunError as exc:
        fail(str(exc))
    except Interrupted as exc:
        log(f"interrupted: {exc}; checkpoint saved, a rerun resumes from this step")
        return EXIT_INTERRUPTED
    return 0
