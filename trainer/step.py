"""One training step and what it owns: the model, the optimizer and its schedule, the checkpoint's
variables and the sums the step allreduces; the evaluation step and its allreduce. The run's loop
(trainer/loop.py) drives it; trainer/benchmark.py times it.
"""

from __future__ import annotations

import dataclasses
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from trainer import recipes
from trainer.config import TrainConfig
from trainer.loop import StepSums
from trainer.model import build_resnet, decayed_variables
from trainer.optim import lars_scale, make_optimizer, make_schedule
from trainer.ranks import agree

# Layout of the vector every step allreduces (summed): the losses for the log, and the flags.
CROSS_ENTROPY, TOTAL_LOSS, BAD_INPUT, STOP = range(4)


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
    """The step of one run: model, optimizer, compiled train and eval steps, the checkpoint's
    variables and the allreduced sums (Orbit's trainer, orbit/standard_runner.py)."""

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
        # Horovod: every step trains on one batch per rank.
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
        tape = distributed_tape(tape)  # Horovod: the gradients, averaged over the ranks
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

    def train(self, images, labels, *, bad_input: bool, stop: bool) -> None:
        """One step; every rank's flags ride in its allreduce (a tensor: a Python value would
        trace the step anew for each)."""
        self.train_step(images, labels, tf.constant([float(bad_input), float(stop)]))

    def global_step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def learning_rate(self) -> float:
        return float(self.schedule(self.optimizer.iterations))

    def read_step_sums(self) -> np.ndarray:
        """The sums since the last read (a device sync: only at check steps), then reset."""
        sums = self.step_sums.numpy()
        self.step_sums.assign(tf.zeros([4]))
        return sums

    def read_sums(self, steps: int) -> StepSums:
        """read_step_sums over `steps` steps, as the loop reads them: the same on every rank."""
        sums = self.read_step_sums()
        # Horovod: the losses were summed over the ranks; the log shows their mean.
        ranks = hvd.size()
        return StepSums(
            loss=sums[CROSS_ENTROPY] / ranks / steps,
            total_loss=sums[TOTAL_LOSS] / ranks / steps,
            bad_input=bool(sums[BAD_INPUT]),
            stop=bool(sums[STOP]),
        )

    def record_epoch(self, epoch: int) -> None:
        """The checkpoint's count of completed epochs."""
        self.epoch.assign(epoch)

    def loss_scale_state(self) -> tuple[float, int] | None:
        """float16's loss scale and the steps skipped for non-finite gradients; None in float32."""
        if not self.mixed:
            return None
        return float(self.optimizer.loss_scale), int(self.skipped_steps.numpy())

    def evaluate(self, batches, describe_error) -> dict:
        """Collective: top-1/top-5 over this rank's batches, summed over all ranks. A failure
        reading them is agreed, as one line from describe_error(exc)."""
        counts = np.zeros(3, np.int64)
        local_error = None
        try:
            for images, labels in batches:
                top1, top5 = self.eval_step(images, labels)
                counts += (int(top1), int(top5), int(labels.shape[0]))
        except tf.errors.OpError as exc:
            local_error = describe_error(exc)
        agree(local_error)
        # Horovod: sum the counts from every rank's share of the validation records.
        top1, top5, images = hvd.allreduce(tf.constant(counts), op=hvd.Sum, name="eval").numpy()
        return {
            "top1": float(top1 / max(images, 1)),
            "top5": float(top5 / max(images, 1)),
            "epoch": int(self.epoch.numpy()),
            "images": int(images),
        }

    def broadcast_state(self) -> None:
        # Horovod: every rank starts from rank 0's variables, fresh or restored: all of the
        # checkpoint's, so that fp16 ranks also share rank 0's loss scale and good-step count.
        hvd.broadcast_variables(self.state, root_rank=0)

    def average_batchnorm_statistics(self) -> None:
        """Moving means/variances drift apart per rank (each sees its own data): average them."""
        stats = self.model.non_trainable_variables
        # Horovod: one grouped allreduce for all of them.
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
