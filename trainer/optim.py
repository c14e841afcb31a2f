"""Learning-rate schedule (linear warmup, cosine decay), SGD Nesterov, LARS gradient scaling."""

from __future__ import annotations

import math

import tensorflow as tf

from trainer.config import LARGE_BATCH, LARGE_BATCH_WARMUP_EPOCHS, WARMUP_EPOCHS

# LARS trust coefficient (You et al., 2017: "Large Batch Training of Convolutional Networks").
LARS_ETA = 0.001


def uses_lars(global_batch: int) -> bool:
    return global_batch > LARGE_BATCH


def warmup_epochs_for(global_batch: int, requested: float | None) -> float:
    """--warmup-epochs if given, else 5 epochs, 10 from LARGE_BATCH on (inclusive)."""
    if requested is not None:
        return requested
    return LARGE_BATCH_WARMUP_EPOCHS if global_batch >= LARGE_BATCH else WARMUP_EPOCHS


def peak_learning_rate(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule (Goyal et al., 2017): base_lr is the rate for 256 images."""
    return base_lr * global_batch / 256


class WarmupCosine(tf.keras.optimizers.schedules.LearningRateSchedule):
    """0 -> peak linearly over warmup_steps, then cosine from peak to 0 at total_steps."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        assert 0 <= warmup_steps <= total_steps and total_steps > 0, (warmup_steps, total_steps)
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = self.peak * (step + 1) / max(self.warmup_steps, 1)
        progress = (step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1)
        cosine = 0.5 * self.peak * (1 + tf.cos(math.pi * tf.clip_by_value(progress, 0.0, 1.0)))
        return tf.where(step < self.warmup_steps, warmup, cosine)

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
        }


def make_optimizer(schedule, momentum: float, mixed_precision: bool, lars: bool):
    """SGD with Nesterov momentum (plain momentum under LARS), loss-scaled for float16."""
    optimizer = tf.keras.optimizers.SGD(schedule, momentum=momentum, nesterov=not lars)
    if mixed_precision:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def lars_scale(grads, variables, layerwise):
    """Scale each layer-wise variable's gradient by eta * ||w|| / ||g|| (LARC 'scale' mode).

    `layerwise` holds the ids of the variables LARS adapts (kernels); BatchNorm and biases keep
    the global rate. Gradients already include weight decay (it is in the loss).
    """
    scaled = []
    for grad, var in zip(grads, variables, strict=True):
        if id(var) in layerwise:
            w_norm = tf.norm(var)
            g_norm = tf.norm(tf.cast(grad, var.dtype))
            trust = tf.where((w_norm > 0) & (g_norm > 0), LARS_ETA * w_norm / (g_norm + 1e-12), 1.0)
            grad = grad * tf.cast(trust, grad.dtype)
        scaled.append(grad)
    return scaled
