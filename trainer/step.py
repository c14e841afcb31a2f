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

# Layout of the vector every step allreduces (summed): the losses for the log, and the flags:
# a rank failed to read its input, was asked to stop (SIGTERM), or (rank 0, elastic) was told by
# Horovod's driver that the hosts changed.
CROSS_ENTROPY, TOTAL_LOSS, BAD_INPUT, STOP, HOSTS_UPDATED = range(5)
SUMS = 5


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
        planned_ranks: int | None = None,
    ):
        assert config.epochs == recipe.epochs, "run with settle_recipe's config"
        self.config = config
        self.recipe = recipe
        self.num_classes = num_classes
        # The world the recipe was settled for (elastic: --planned-ranks): set_world scales the
        # peak LR from its global batch, and the step pre-divides gradients by its rank count.
        self.planned_ranks = planned_ranks or hvd.size()
        self.planned_batch = config.batch_size * self.planned_ranks
        mixed = config.precision == "fp16" or (config.precision == "auto" and gpu)
        self.xla = config.xla == "on" or (config.xla == "auto" and gpu)
        self.lars = recipe.lars
        self.warmup_epochs = recipe.warmup_epochs
        self.mixed = mixed
        if mixed:
            tf.keras.mixed_precision.set_global_policy("mixed_float16")
        sized = None if recipe.progressive else config.image_size
        self.model = build_resnet(config.arch, num_classes, sized)
        # Placeholder numbers: set_world sets this world's.
        self.schedule = make_schedule(recipe.decay, recipe.peak_lr, 0, 1)
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
        # Summed over steps between two reads: the losses and the flags (SUMS above).
        self.step_sums = tf.Variable(tf.zeros([SUMS]), trainable=False, name="step_sums")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped")
        self.decayed = decayed_variables(self.model)
        self.lars_ids = {id(v) for v in self.decayed}
        # No AutoGraph: these steps branch on Python values only (precision, LARS, the recipe), and
        # converting every Keras and Horovod function they call was half of each rank's trace
        # (ResNet-18 on a CPU: 10.05 s to 5.88 s, docs/test-tiers.md).
        self.forward = tf.function(self._forward, jit_compile=self.xla, autograph=False)
        # Traced once for every world: nothing in it depends on the world's size (the LR is the
        # schedule's variables, the pre-divide the planned world's: distributed_tape).
        self.train_step = tf.function(self._train_step, autograph=False)
        self.eval_step = tf.function(
            self._eval_step, jit_compile=self.xla, reduce_retracing=True, autograph=False
        )
        self.set_world(hvd.size(), steps_per_epoch)

    def set_world(self, ranks: int, steps_per_epoch: int) -> None:
        """This world's global batch, peak LR and schedule (an elastic run calls it after every
        reset). The per-rank batch stays; the peak LR follows the recipe's rule from the planned
        batch, and the schedule's warmup and length are the recipe's epochs in this world's
        steps. Variables, not Python values frozen in the traced step: no retrace."""
        # Horovod: every step trains on one batch per rank.
        self.global_batch = self.config.batch_size * ranks
        # Horovod: the learning rate follows the global batch (the recipe's rule for it).
        self.peak_lr = self.recipe.peak_lr_at(self.planned_batch, self.global_batch)
        total_steps = self.config.epochs * steps_per_epoch
        warmup_steps = min(round(self.warmup_epochs * steps_per_epoch), total_steps)
        self.schedule.retarget(self.peak_lr, warmup_steps, total_steps)
        self.ranks = ranks
        self.step_sums.assign(tf.zeros([SUMS]))  # a failed world's unread sums are void

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
        tape = distributed_tape(tape, self.planned_ranks)  # Horovod: the gradients, averaged
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

    def train(self, images, labels, *, bad_input: bool, stop: bool, hosts_updated: bool) -> None:
        """One step; every rank's flags ride in its allreduce (a tensor: a Python value would
        trace the step anew for each)."""
        flags = tf.constant([float(bad_input), float(stop), float(hosts_updated)])
        self.train_step(images, labels, flags)

    def wait(self) -> None:
        """Block until the steps issued so far have run: their sums are written last."""
        self.step_sums.numpy()

    def global_step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def learning_rate(self) -> float:
        return float(self.schedule(self.optimizer.iterations))

    def read_step_sums(self) -> np.ndarray:
        """The sums since the last read (a device sync: only at check steps), then reset."""
        sums = self.step_sums.numpy()
        self.step_sums.assign(tf.zeros([SUMS]))
        return sums

    def read_sums(self, steps: int) -> StepSums:
        """read_step_sums over `steps` steps, as the loop reads them: the same on every rank."""
        sums = self.read_step_sums()
        # Horovod: the losses were summed over the ranks; the log shows their mean.
        ranks = self.ranks
        return StepSums(
            loss=sums[CROSS_ENTROPY] / ranks / steps,
            total_loss=sums[TOTAL_LOSS] / ranks / steps,
            bad_input=bool(sums[BAD_INPUT]),
            stop=bool(sums[STOP]),
            hosts_updated=bool(sums[HOSTS_UPDATED]),
        )

    def record_epoch(self, epoch: int) -> None:
        """The checkpoint's count of completed epochs."""
        self.epoch.assign(epoch)

    def mark_position(self, epochs_done: int, epoch_step: int) -> None:
        """Where the state stands, in its variables (an elastic commit, a checkpoint): epochs
        done, and steps done into the next one (of saved_steps_per_epoch)."""
        self.epoch.assign(epochs_done)
        self.epoch_step.assign(epoch_step)

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

    def broadcast_state(self, root: int = 0) -> None:
        # Horovod: every rank starts from the root's variables, fresh or restored: all of the
        # checkpoint's, so that fp16 ranks also share its loss scale and good-step count.
        hvd.broadcast_variables(self.state, root_rank=root)

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


def distributed_tape(tape: tf.GradientTape, predivide: int) -> hvd.DistributedGradientTape:
    """Horovod: average gradients over the ranks, sent as float16 to halve the traffic. Each
    rank's gradient is divided by `predivide` (the planned rank count) before the sum, not after
    it: the sum of 512 loss-scaled float16 gradients would overflow where their average does not.
    Horovod multiplies the sum back by `predivide` and divides it by its own size at run time
    (horovod/tensorflow/__init__.py v0.28.1 lines 557-561, horovod/common/operations.cc lines
    1805-1808), so the result is the average in any world; in one of at most `predivide` ranks
    the sum of the pre-divided gradients stays below the largest of them. An elastic run's step
    is therefore traced once: the Python number it freezes is the planned world's, not the
    current one's hvd.size()."""
    return hvd.DistributedGradientTape(
        tape, compression=hvd.Compression.fp16, gradient_predivide_factor=float(predivide)
    )
