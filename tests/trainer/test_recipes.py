"""The recipes against the papers' and MLPerf's formulas, written out independently in numpy."""

import math

import numpy as np
import pytest
import tensorflow as tf

from trainer import recipes
from trainer.optim import WarmupPoly, lars_scale

BATCHES = (2048, 4096, 8192, 16384, 32768, 65536, 131072)


def mlperf_poly(step, peak, warmup, total, end=1e-4, power=2.0):
    """NVIDIA's PolySchedule (training_results_v4.0 .../eos_ngc24.04_mxnet/common/fit.py)."""
    if step <= warmup:
        return peak * step / warmup
    return end + (peak - end) * (1 - (step - warmup) / (total - warmup)) ** power


@pytest.mark.parametrize("global_batch", BATCHES)
def test_the_poly_schedule_is_mlperf_s_at_every_batch(global_batch):
    recipe = recipes.fast(global_batch)
    steps_per_epoch = math.ceil(1_281_167 / global_batch)
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    total = recipe.epochs * steps_per_epoch
    schedule = WarmupPoly(recipe.peak_lr, warmup, total)
    for step in (0, 1, warmup // 2, warmup, warmup + 1, (warmup + total) // 2, total - 1, total):
        expected = mlperf_poly(step, recipe.peak_lr, warmup, total)
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-7), step
        assert recipes.poly_learning_rate(step, recipe.peak_lr, warmup, total) == pytest.approx(
            expected, rel=1e-12
        )
    assert float(schedule(total)) == pytest.approx(recipes.END_LR)


def mlperf_lars_trust(w, g, wd, eta=0.001):
    """eta ||w|| / (||g|| + wd ||w||), g without weight decay (the reference's
    lars_optimizer.py, NVIDIA's fit.py)."""
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    return eta * w_norm / (g_norm + wd * w_norm) if w_norm > 0 and g_norm > 0 else 1.0


@pytest.mark.parametrize("weight_decay", [5e-5, 2e-4])
def test_lars_trust_ratio_is_mlperf_s_and_spares_batchnorm(weight_decay):
    rng = np.random.default_rng(7)
    w = rng.normal(size=(3, 3, 8, 16)).astype(np.float32)
    g = rng.normal(scale=1e-3, size=w.shape).astype(np.float32)
    kernel, gamma = tf.Variable(w), tf.Variable(np.ones(16, np.float32))
    # The loss holds 0.5 wd ||w||^2, so the kernel's gradient arrives as g + wd w.
    arriving = g + weight_decay * w
    scaled = lars_scale(
        [tf.constant(arriving), tf.constant(np.full(16, 0.5, np.float32))],
        [kernel, gamma],
        {id(kernel)},
        weight_decay,
    )
    trust = mlperf_lars_trust(w, g, weight_decay)
    assert np.allclose(scaled[0].numpy(), arriving * trust, rtol=1e-4)
    assert np.allclose(scaled[1].numpy(), 0.5)  # BatchNorm keeps the global rate
    zero = lars_scale([tf.constant(arriving)], [tf.Variable(np.zeros_like(w))], set(), 1e-4)
    assert np.allclose(zero[0].numpy(), arriving)  # not a layer-wise variable: untouched


def test_fast_takes_the_logged_run_nearest_the_batch():
    assert recipes.nearest_mlperf_run(8192).source == "v1.0 Google tpu-v4-128-TF"
    assert recipes.nearest_mlperf_run(13056).global_batch == 16384
    assert recipes.nearest_mlperf_run(64).global_batch == 1600
    assert recipes.nearest_mlperf_run(200_000).global_batch == 65536
    at_8k = recipes.fast(8192)
    assert (at_8k.peak_lr, at_8k.warmup_epochs, at_8k.epochs) == (17.0, 5, 44)
    assert (at_8k.weight_decay, at_8k.momentum, at_8k.lars, at_8k.decay) == (
        2e-4,
        0.9,
        True,
        "poly",
    )
    assert "75.9% at epoch 42" in at_8k.source


def test_fast_s_peak_lr_follows_the_logged_runs_square_root_trend():
    for run in recipes.MLPERF_RUNS:  # at a logged batch: that run's own LR
        assert recipes.fast(run.global_batch).peak_lr == pytest.approx(run.peak_lr)
    assert recipes.fast(4096).peak_lr == pytest.approx(10.5 * math.sqrt(4096 / 3264))
    rising = [recipes.fast(b).peak_lr for b in (1600, 3264, 8192, 16384)]
    assert rising == sorted(rising)


def test_more_epochs_for_bigger_batches_as_mlperf_needed():
    epochs = [recipes.fast(b).epochs for b in BATCHES]
    assert epochs == sorted(epochs) and epochs[0] < 45 < epochs[-1]


def test_flags_win_over_the_recipe():
    recipe = recipes.fast(8192, epochs=30, warmup_epochs=3, momentum=0.95, weight_decay=1e-5)
    assert (recipe.epochs, recipe.warmup_epochs, recipe.momentum, recipe.weight_decay) == (
        30,
        3,
        0.95,
        1e-5,
    )
    goyal = recipes.goyal(16384, base_lr=0.2)
    assert (goyal.peak_lr, goyal.epochs, goyal.decay, goyal.lars) == (12.8, 90, "cosine", False)


def ffcv_get_resolution(epoch, min_res, max_res, start_ramp, end_ramp):
    """libffcv/ffcv-imagenet@4dd291a train_imagenet.py get_resolution, in numpy."""
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / 32)) * 32


# FFCV's rn50 configs: epochs, start_ramp, end_ramp (rn50_configs/rn50_*_epochs.yaml).
FFCV_CONFIGS = ((16, 11, 13), (24, 17, 20), (32, 23, 27), (40, 29, 34), (56, 41, 48), (88, 65, 76))


@pytest.mark.parametrize(("epochs", "start", "end"), FFCV_CONFIGS)
def test_progressive_resizing_follows_ffcv(epochs, start, end):
    ours = [recipes.train_resolution(e, epochs, 224) for e in range(epochs)]
    assert set(ours) == {160, 192} and ours == sorted(ours)  # one step up, as FFCV's
    # The same interpolation and rounding as FFCV's at our ramp...
    ramp = (round(recipes.RAMP_START * epochs), round(recipes.RAMP_END * epochs))
    assert ours == [ffcv_get_resolution(e, 160, 192, *ramp) for e in range(epochs)]
    # ...whose step to 192 px lands within an epoch of each FFCV config's.
    theirs = [ffcv_get_resolution(e, 160, 192, start, end) for e in range(epochs)]
    assert abs(ours.index(192) - theirs.index(192)) <= 1


def test_only_the_fast_recipe_resizes():
    assert recipes.fast(16384).train_size(0, 224) == 160
    assert recipes.fast(16384).train_size(47, 224) == 192
    assert recipes.goyal(16384).train_size(0, 224) == 224


def test_the_fast_recipe_at_the_two_rank_digits_batch_and_its_resolution_steps():
    """What tests/trainer/test_train_horovod.py once proved with an 8-epoch two-rank run (12
    minutes): at a global batch of 64, MLPerf's 1.6k run's values with the LR scaled down and 2
    warm-up epochs, trained at 23 px, then 27 px in the last epoch, evaluated at 32. Its
    accuracy is the offline proxy's to show (trainer/proxy.py)."""
    recipe = recipes.fast(64, epochs=8)
    assert recipe.describe().startswith("recipe fast: peak LR 1.48 (LARS), 2 warmup epochs, poly")
    sizes = [recipe.train_size(epoch, 32) for epoch in range(recipe.epochs)]
    assert sizes == [23] * 7 + [27]


def test_an_elastic_world_scales_the_planned_peak_lr_by_the_recipe_s_own_rule():
    """goyal's peak follows the global batch linearly (Goyal et al.), fast's by its square root
    (the logged MLPerf runs' trend): 7 of 8 planned nodes keep 7/8 or sqrt(7/8) of the peak."""
    goyal, fast = recipes.goyal(16384), recipes.fast(16384)
    assert goyal.peak_lr_at(16384, 14336) == pytest.approx(6.4 * 7 / 8)
    assert fast.peak_lr_at(16384, 14336) == pytest.approx(22.0 * (7 / 8) ** 0.5)
    assert fast.peak_lr_at(16384, 16384) == fast.peak_lr
