"""Learning-rate schedules (linear warmup, then cosine or MLPerf's polynomial decay), SGD, and
LARS gradient scaling; the recipes' numbers are in trainer/recipes.py."""

from __future__ import annotations

import math

import tensorflow as tf

from trainer.recipes import END_LR, LARS_ETA, POLY_POWER


class _WarmupSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    """A peak reached by a linear warmup over warmup_steps, then a decay to total_steps.

    The three numbers are variables, not Python values a traced step would freeze: an elastic
    run retargets them when the world changes (the peak scales, an epoch has other steps), as
    Horovod's docs reassign the LR after a reset (docs/elastic.rst, "Elastic TensorFlow":
    `optimizer.lr.assign(lr * hvd.size())` in on_state_reset). They are in no checkpoint: the
    optimizer tracks no schedule, and each world sets them from the recipe."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak = tf.Variable(0.0, trainable=False, name="lr_peak")
        self.warmup_steps = tf.Variable(0.0, trainable=False, name="lr_warmup_steps")
        self.total_steps = tf.Variable(1.0, trainable=False, name="lr_total_steps")
        self.retarget(peak, warmup_steps, total_steps)

    def retarget(self, peak: float, warmup_steps: int, total_steps: int) -> None:
        assert 0 <= warmup_steps <= total_steps and total_steps > 0, (warmup_steps, total_steps)
        self.peak.assign(peak)
        self.warmup_steps.assign(float(warmup_steps))
        self.total_steps.assign(float(total_steps))

    def _progress(self, step):
        """The step as a float, and the fraction of the decay done (0 before it, 1 after)."""
        step = tf.cast(step, tf.float32)
        decay_steps = tf.maximum(self.total_steps - self.warmup_steps, 1.0)
        return step, tf.clip_by_value((step - self.warmup_steps) / decay_steps, 0.0, 1.0)

    def get_config(self):
        return {
            "peak": float(self.peak.numpy()),
            "warmup_steps": int(self.warmup_steps.numpy()),
            "total_steps": int(self.total_steps.numpy()),
        }


class WarmupCosine(_WarmupSchedule):
    """0 -> peak linearly over warmup_steps, then cosine from peak to 0 at total_steps."""

    def __call__(self, step):
        step, progress = self._progress(step)
        warmup = self.peak * (step + 1) / tf.maximum(self.warmup_steps, 1.0)
        cosine = 0.5 * self.peak * (1 + tf.cos(math.pi * progress))
        return tf.where(step < self.warmup_steps, warmup, cosine)


class WarmupPoly(_WarmupSchedule):
    """MLPerf's schedule (recipes.poly_learning_rate): 0 -> peak linearly over warmup_steps, then
    END_LR + (peak - END_LR) (1 - progress)^POLY_POWER at total_steps."""

    def __call__(self, step):
        step, progress = self._progress(step)
        warmup = self.peak * step / tf.maximum(self.warmup_steps, 1.0)
        poly = END_LR + (self.peak - END_LR) * tf.pow(1.0 - progress, POLY_POWER)
        return tf.where(step < self.warmup_steps, warmup, poly)


def make_schedule(decay: str, peak: float, warmup_steps: int, total_steps: int):
    schedule = {"cosine": WarmupCosine, "poly": WarmupPoly}[decay]
    return schedule(peak, warmup_steps, total_steps)


def make_optimizer(schedule, momentum: float, mixed_precision: bool, lars: bool):
    """SGD with Nesterov momentum (plain momentum under LARS, as MLPerf's), loss-scaled for
    float16."""
    optimizer = tf.keras.optimizers.SGD(schedule, momentum=momentum, nesterov=not lars)
    if mixed_precision:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def lars_scale(grads, variables, layerwise, weight_decay: float | None = None):
    """Scale each layer-wise variable's gradient by its trust ratio.

    `layerwise` holds the ids of the variables LARS adapts (kernels); BatchNorm and biases keep
    the global rate. Gradients already include weight decay (it is in the loss). Without
    `weight_decay` the ratio is eta ||w|| / ||g|| of that gradient (LARC's 'scale' mode, the goyal
    recipe above 16k); with it, MLPerf's eta ||w|| / (||g|| + wd ||w||), g the loss's own gradient
    (NVIDIA's fit.py, the reference's lars_optimizer.py), 1 where a norm is 0.
    """
    scaled = []
    for grad, var in zip(grads, variables, strict=True):
        if id(var) in layerwise:
            w_norm = tf.norm(var)
            total = tf.cast(grad, var.dtype)
            if weight_decay is None:
                g_norm = tf.norm(total)
                denominator = g_norm
            else:
                g_norm = tf.norm(total - weight_decay * var)
                denominator = g_norm + weight_decay * w_norm
            trust = tf.where(
                (w_norm > 0) & (g_norm > 0), LARS_ETA * w_norm / (denominator + 1e-12), 1.0
            )
            grad = grad * tf.cast(trust, grad.dtype)
        scaled.append(grad)
    return scaled
