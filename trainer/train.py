"""Train ResNet-50 v1.5 on ImageNet TFRecords with TensorFlow 2 + Horovod; resumable, then evaluate.

Run (one process, or under horovodrun for several ranks; every rank gets the same flags):
    python -m trainer.train --data-dir /data/tfrecords --model-dir /data/model
    horovodrun -np 2 -H localhost:2 --gloo python -m trainer.train --data-dir D --model-dir M \
        --arch resnet18 --image-size 64 --batch-size 16 --epochs 2
    python -m trainer.train --synthetic --model-dir /tmp/m --epochs 1   # device-only smoke test

Outputs (rank 0): <model-dir>/checkpoints/ (one per epoch; a restart resumes from the newest),
<model-dir>/tensorboard/, <model-dir>/eval.json, <model-dir>/train.json.
Bad input ends every rank with one `error: ...` line and exit status 2: ranks agree on failures
through a collective before going on, so none is left waiting on a rank that stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from trainer import data
from trainer.cli import fail
from trainer.config import LARS_ABOVE_GLOBAL_BATCH, ConfigError, TrainConfig, parse_config
from trainer.model import build_resnet, decayed_variables
from trainer.optim import WarmupCosine, lars_scale, make_optimizer, peak_learning_rate

SYNTHETIC_STEPS_PER_EPOCH = 100
# Test hook: when set, every rank writes rank-<r>.sha256 of its final weights into this directory.
WEIGHTS_DIGEST_ENV = "TRAINER_WEIGHTS_DIGEST_DIR"
HEADER = f"{'Step':>8} {'Epoch':>6} {'Speed':>9} {'Loss':>7} {'FinLoss':>7} {'LR':>9}"


class RunError(Exception):
    """A failure every rank has agreed on; main() prints it as one `error: ...` line."""


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
    info, train_files, val_files, local_error = None, [], [], None
    try:
        info = data.resolve_dataset(config.data_dir, config.num_classes, config.label_base)
        # Horovod: each rank reads its own whole files, so no record is seen twice per epoch.
        train_files = data.shard_for_rank(info.train_files, hvd.rank(), hvd.size(), "train")
        val_files = data.shard_for_rank(info.validation_files, hvd.rank(), hvd.size(), "validation")
    except data.DataError as exc:
        local_error = str(exc)
    agree(local_error)
    if config.eval_only:  # no training: the schedule, hence steps per epoch, is irrelevant
        return info, train_files, val_files, 1
    count = info.train_records is None and not config.steps_per_epoch
    local_count = 0
    try:
        # A rank whose own shards are empty would wait forever for its first batch while the
        # others wait for it in the step's allreduce, even when the whole split has records.
        first = train_files[0]
        data.require_records(train_files, f"rank {hvd.rank()}'s train shards, from {first},")
        if count:
            local_count = data.count_records(train_files)
    except data.DataError as exc:
        local_error = str(exc)
    agree(local_error)
    train_records = info.train_records
    if count:
        train_records = int(hvd.allreduce(tf.constant(local_count), op=hvd.Sum, name="records"))
    steps = config.steps_per_epoch or train_records // global_batch
    if steps == 0:
        raise RunError(
            f"{train_records} train records in {config.data_dir} are fewer than one global batch "
            f"of {global_batch} ({hvd.size()} ranks x --batch-size {config.batch_size})"
        )
    return info, train_files, val_files, steps


class Trainer:
    """Model, optimizer, compiled steps and checkpoint for one run."""

    def __init__(self, config: TrainConfig, num_classes: int, steps_per_epoch: int, gpu: bool):
        self.config = config
        self.num_classes = num_classes
        self.global_batch = config.batch_size * hvd.size()
        mixed = config.precision == "fp16" or (config.precision == "auto" and gpu)
        self.xla = config.xla == "on" or (config.xla == "auto" and gpu)
        self.lars = self.global_batch > LARS_ABOVE_GLOBAL_BATCH
        self.mixed = mixed
        if mixed:
            tf.keras.mixed_precision.set_global_policy("mixed_float16")
        self.model = build_resnet(config.arch, num_classes, config.image_size)
        # Horovod: scale the learning rate with the global batch (linear scaling rule).
        self.peak_lr = peak_learning_rate(config.base_lr, self.global_batch)
        total_steps = config.epochs * steps_per_epoch
        warmup_steps = min(round(config.warmup_epochs * steps_per_epoch), total_steps)
        self.schedule = WarmupCosine(self.peak_lr, warmup_steps, total_steps)
        self.optimizer = make_optimizer(self.schedule, config.momentum, mixed, self.lars)
        self.optimizer.build(self.model.trainable_variables)
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_epochs")
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, epoch=self.epoch
        )
        self.decayed = decayed_variables(self.model)
        self.lars_ids = {id(v) for v in self.decayed}
        self.forward = tf.function(self._forward, jit_compile=self.xla)
        self.train_step = tf.function(self._train_step)
        self.eval_step = tf.function(self._eval_step, jit_compile=self.xla, reduce_retracing=True)

    def _forward(self, images, labels):
        logits = self.model(images, training=True)
        smoothed = tf.one_hot(labels, self.num_classes) * (1 - self.config.label_smoothing)
        smoothed += self.config.label_smoothing / self.num_classes
        cross_entropy = tf.reduce_mean(
            tf.nn.softmax_cross_entropy_with_logits(labels=smoothed, logits=logits)
        )
        l2 = tf.add_n([tf.reduce_sum(tf.square(v)) for v in self.decayed])
        return cross_entropy, cross_entropy + 0.5 * self.config.weight_decay * l2

    def _train_step(self, images, labels, input_ok):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            cross_entropy, total = self.forward(images, labels)
            loss = self.optimizer.get_scaled_loss(total) if self.mixed else total
        # Horovod: average gradients over ranks, sent as float16 to halve the allreduce traffic.
        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
        grads = tape.gradient(loss, variables)
        if self.mixed:
            grads = self.optimizer.get_unscaled_gradients(grads)
        if self.lars:
            grads = lars_scale(grads, variables, self.lars_ids)
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        # Horovod: average the losses for the log; count the ranks whose input batch was good.
        losses = hvd.allreduce(tf.stack([cross_entropy, total]), op=hvd.Average, name="losses")
        ranks_ok = hvd.allreduce(input_ok, op=hvd.Sum, name="input_ok")
        return losses[0], losses[1], ranks_ok

    def _eval_step(self, images, labels):
        logits = self.model(images, training=False)
        top1 = tf.math.in_top_k(labels, logits, 1)
        top5 = tf.math.in_top_k(labels, logits, min(5, self.num_classes))
        return tf.reduce_sum(tf.cast(top1, tf.int64)), tf.reduce_sum(tf.cast(top5, tf.int64))

    def learning_rate(self) -> float:
        return float(self.schedule(self.optimizer.iterations))

    def broadcast_state(self) -> None:
        # Horovod: every rank starts from rank 0's weights, optimizer slots and epoch (fresh or
        # restored); the optimizer is built up front, so this can happen before the first step.
        hvd.broadcast_variables(self.model.variables, root_rank=0)
        hvd.broadcast_variables(self.optimizer.variables, root_rank=0)
        hvd.broadcast_variables([self.epoch], root_rank=0)

    def average_batchnorm_statistics(self) -> None:
        """Moving means/variances drift apart per rank (each sees its own data): average them."""
        stats = self.model.non_trainable_variables
        averaged = hvd.grouped_allreduce(stats, op=hvd.Average, name="bn_statistics")
        for variable, value in zip(stats, averaged, strict=True):
            variable.assign(value)

    def weights_digest(self) -> str:
        digest = hashlib.sha256()
        for weight in self.model.weights:
            digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
        return digest.hexdigest()


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


def evaluate(trainer: Trainer, batches, files: list[str]) -> dict:
    """Top-1/top-5 over this rank's batches, summed over all ranks."""
    counts = np.zeros(3, np.int64)
    local_error = None
    try:
        for images, labels in batches:
            top1, top5 = trainer.eval_step(images, labels)
            counts += (int(top1), int(top5), int(labels.shape[0]))
    except tf.errors.OpError as exc:
        local_error = data.describe_input_error(exc, files, trainer.config.image_size)
    agree(local_error)
    # Horovod: sum the counts from every rank's shards.
    top1, top5, images = hvd.allreduce(tf.constant(counts), op=hvd.Sum, name="eval").numpy()
    return {
        "top1": float(top1 / max(images, 1)),
        "top5": float(top5 / max(images, 1)),
        "epoch": int(trainer.epoch.numpy()),
        "images": int(images),
    }


def write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")


def run(config: TrainConfig) -> None:
    started = time.perf_counter()
    gpu = setup_devices()
    global_batch = config.batch_size * hvd.size()
    if config.synthetic:
        num_classes = config.num_classes or data.DEFAULT_NUM_CLASSES
        steps_per_epoch = config.steps_per_epoch or SYNTHETIC_STEPS_PER_EPOCH
        train_files = val_files = []
    else:
        info, train_files, val_files, steps_per_epoch = resolve_input(config, global_batch)
        num_classes = info.num_classes
    trainer = Trainer(config, num_classes, steps_per_epoch, gpu)
    model_dir = config.model_dir
    manager, writer, local_error = None, None, None
    if hvd.rank() == 0:
        try:
            (model_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            local_error = f"cannot create --model-dir {model_dir}: {exc.strerror}"
    agree(local_error)
    if hvd.rank() == 0:
        manager = tf.train.CheckpointManager(
            trainer.checkpoint, str(model_dir / "checkpoints"), config.keep_checkpoints
        )
        writer = tf.summary.create_file_writer(str(model_dir / "tensorboard"))
    log(
        f"{config.arch}: {num_classes} classes, {hvd.size()} ranks x {config.batch_size} = "
        f"global batch {global_batch}, {steps_per_epoch} steps/epoch, peak LR {trainer.peak_lr:g}"
        f"{' (LARS)' if trainer.lars else ''}, {'mixed float16' if trainer.mixed else 'float32'}"
        f", XLA {'on' if trainer.xla else 'off'}"
    )
    restored = restore_newest(trainer, manager)
    start_epoch = int(trainer.epoch.numpy())
    if restored:
        log(f"Resuming from {restored}: {start_epoch} epochs done")
        # The LR schedule follows the step count: realign it in case the ranks or batch changed.
        trainer.optimizer.iterations.assign(start_epoch * steps_per_epoch)

    if config.synthetic:
        batch = data.synthetic_batch(config.batch_size, config.image_size, num_classes)

        def eval_batches():
            return [batch]

        def train_batches():
            while True:
                yield batch
    else:
        input_threads = max(1, len(os.sched_getaffinity(0)) // hvd.local_size())

        def eval_batches():
            return data.eval_dataset(
                val_files,
                batch_size=config.batch_size,
                image_size=config.image_size,
                num_classes=num_classes,
                label_base=info.label_base,
                threads=input_threads,
            )

        def train_batches():
            return iter(
                data.train_dataset(
                    train_files,
                    batch_size=config.batch_size,
                    image_size=config.image_size,
                    num_classes=num_classes,
                    label_base=info.label_base,
                    shuffle_buffer=config.shuffle_buffer,
                    min_crop_area=config.min_crop_area,
                    seed=hvd.rank() * 7919 + start_epoch,
                    threads=input_threads,
                )
            )

    def evaluate_and_record() -> dict:
        result = evaluate(trainer, eval_batches(), val_files)
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

    batches = train_batches()
    images_shape = [config.batch_size, config.image_size, config.image_size, 3]
    placeholder = (tf.zeros(images_shape, tf.uint8), tf.zeros([config.batch_size], tf.int32))
    # The first interval includes graph tracing and compilation: the speed leaves it out, unless
    # the run is too short to have another (then all_* is the best there is).
    timed_images, timed_seconds, all_images, all_seconds = 0, 0.0, 0, 0.0
    first_interval = True
    step = int(trainer.optimizer.iterations.numpy())
    evaluated_epoch = -1
    log(HEADER)
    for epoch in range(start_epoch + 1, config.epochs + 1):
        log(f"Epoch {epoch}/{config.epochs}")
        interval_start, interval_steps = time.perf_counter(), 0
        for step_in_epoch in range(steps_per_epoch):
            local_error = None
            try:
                images, labels = next(batches)
            except tf.errors.OpError as exc:
                local_error = data.describe_input_error(exc, train_files, config.image_size)
                # Keep this rank in the step's collectives; all ranks stop right after it.
                images, labels = placeholder
            loss, total, ranks_ok = trainer.train_step(
                images, labels, tf.constant(0 if local_error else 1, tf.int32)
            )
            if int(ranks_ok) < hvd.size():
                agree(local_error or None)
            interval_steps += 1
            step += 1
            if step % config.log_every == 0 or step_in_epoch == steps_per_epoch - 1:
                now = time.perf_counter()
                speed = global_batch * interval_steps / (now - interval_start)
                all_images += global_batch * interval_steps
                all_seconds += now - interval_start
                if not first_interval:
                    timed_images += global_batch * interval_steps
                    timed_seconds += now - interval_start
                first_interval = False
                progress = epoch - 1 + (step_in_epoch + 1) / steps_per_epoch
                lr = trainer.learning_rate()
                log(
                    f"{step:8d} {progress:6.2f} {speed:9.1f} {float(loss):7.3f} "
                    f"{float(total):7.3f} {lr:9.5f}"
                )
                if hvd.rank() == 0:
                    with writer.as_default(step=step):
                        tf.summary.scalar("train/loss", loss)
                        tf.summary.scalar("train/total_loss", total)
                        tf.summary.scalar("train/learning_rate", lr)
                        tf.summary.scalar("train/images_per_s", speed)
                interval_start, interval_steps = time.perf_counter(), 0
        trainer.average_batchnorm_statistics()
        trainer.epoch.assign(epoch)
        if hvd.rank() == 0:
            saved = manager.save(checkpoint_number=epoch)
            print(f"Saved checkpoint {saved}", flush=True)
        if epoch % config.eval_every == 0 or epoch == config.epochs:
            evaluate_and_record()
            evaluated_epoch = epoch
    if evaluated_epoch != config.epochs:
        evaluate_and_record()

    duration = time.perf_counter() - started
    if hvd.rank() == 0:
        if timed_seconds:
            images_per_s = round(timed_images / timed_seconds, 1)
        else:
            images_per_s = round(all_images / all_seconds, 1) if all_seconds else None
        write_json(
            model_dir / "train.json",
            {
                "epochs": config.epochs,
                "images_per_s": images_per_s,
                "duration_s": round(duration, 3),
                "global_batch": global_batch,
            },
        )
        writer.flush()
    digest_dir = os.environ.get(WEIGHTS_DIGEST_ENV)
    if digest_dir:
        Path(digest_dir, f"rank-{hvd.rank()}.sha256").write_text(trainer.weights_digest() + "\n")
    log(f"Finished in {duration:.1f}")


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)  # the same argv on every rank: no agreement needed
    except ConfigError as exc:
        fail(str(exc))
    # Horovod: initialise before anything asks for rank, size or local rank.
    hvd.init()
    try:
        run(config)
    except RunError as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
