"""ResNet v1.5 structure, parameter counts, mixed precision output, LR schedule."""

import math

import numpy as np
import pytest
import tensorflow as tf

from trainer import recipes
from trainer.model import build_resnet, decayed_variables
from trainer.optim import WarmupCosine, lars_scale

# torchvision's resnet50 / resnet18 (the v1.5 reference): conv + BN gamma/beta + fc weights/bias.
RESNET50_PARAMS = 25_557_032
RESNET18_PARAMS = 11_689_512


def trainable_count(model) -> int:
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


@pytest.fixture(scope="module")
def resnet50():
    return build_resnet("resnet50", 1000, 224)


def test_resnet50_v15_parameter_count(resnet50):
    assert trainable_count(resnet50) == RESNET50_PARAMS


def test_resnet50_stride_is_on_the_3x3_convolution(resnet50):
    for stage in (2, 3, 4):
        first = f"stage{stage}_block1"
        assert resnet50.get_layer(f"{first}_conv1").strides == (1, 1)
        assert resnet50.get_layer(f"{first}_conv2").kernel_size == (3, 3)
        assert resnet50.get_layer(f"{first}_conv2").strides == (2, 2)
        assert resnet50.get_layer(f"{first}_proj_conv").strides == (2, 2)
    assert resnet50.get_layer("stage1_block1_conv2").strides == (1, 1)
    assert resnet50.get_layer("stage4_block3_out").output.shape[1:] == (7, 7, 2048)


def test_last_batchnorm_of_each_block_starts_at_zero_gamma(resnet50):
    last_bns = [layer for layer in resnet50.layers if layer.name.endswith("_bn3")]
    assert len(last_bns) == 16
    assert all(not np.any(layer.gamma.numpy()) for layer in last_bns)
    assert np.all(resnet50.get_layer("stage1_block1_bn1").gamma.numpy() == 1)


def test_weight_decay_only_on_kernels(resnet50):
    decayed = decayed_variables(resnet50)
    assert len(decayed) == 53 + 1  # every convolution and the classifier
    assert all("kernel" in v.name for v in decayed)
    names = {v.name for v in decayed}
    assert not any("gamma" in n or "beta" in n or "bias" in n for n in names)


def test_resnet18_parameter_count_and_uint8_input():
    model = build_resnet("resnet18", 1000, 64)
    assert trainable_count(model) == RESNET18_PARAMS
    logits = model(tf.zeros([2, 64, 64, 3], tf.uint8), training=False)
    assert logits.shape == (2, 1000) and logits.dtype == tf.float32


def test_mixed_precision_computes_float16_returns_float32_logits():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_resnet("resnet18", 10, 32)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert model.get_layer("stage1_block1_conv1").compute_dtype == "float16"
    assert all(v.dtype == tf.float32 for v in model.trainable_variables)
    assert model(tf.zeros([1, 32, 32, 3], tf.uint8)).dtype == tf.float32


def test_learning_rate_warmup_then_cosine():
    assert recipes.goyal(16384, base_lr=0.1).peak_lr == pytest.approx(6.4)
    schedule = WarmupCosine(peak=1.0, warmup_steps=10, total_steps=110)
    assert float(schedule(0)) == pytest.approx(0.1)
    assert float(schedule(9)) == pytest.approx(1.0)
    assert float(schedule(10)) == pytest.approx(1.0)
    assert float(schedule(60)) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))
    assert float(schedule(110)) == pytest.approx(0.0, abs=1e-7)


def test_lars_scales_kernels_not_batchnorm():
    kernel, gamma = tf.Variable([3.0, 4.0]), tf.Variable([1.0])
    grads = lars_scale([tf.constant([0.6, 0.8]), tf.constant([2.0])], [kernel, gamma], {id(kernel)})
    assert np.allclose(grads[0].numpy(), np.array([0.6, 0.8]) * 0.001 * 5.0)
    assert np.allclose(grads[1].numpy(), [2.0])
