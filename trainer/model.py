"""ResNet v1.5 (stride on the 3x3 convolution) in tf.keras layers, channels-last.

Input: uint8 images [B, S, S, 3]; the first layer casts and normalises them on the accelerator.
Output: float32 logits even under mixed precision (softmax/loss stay in float32).
Every residual block's last BatchNorm starts with gamma = 0, so each block starts as identity
(Goyal et al., 2017). Convolutions have no bias; BatchNorm carries the shift.
"""

from __future__ import annotations

import tensorflow as tf

layers = tf.keras.layers

IMAGENET_MEAN_RGB = (123.675, 116.28, 103.53)
IMAGENET_STD_RGB = (58.395, 57.12, 57.375)
STAGES = {"resnet50": (3, 4, 6, 3), "resnet18": (2, 2, 2, 2)}
STAGE_FILTERS = (64, 128, 256, 512)
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def _conv_init():
    """He normal over fan-out; a fresh instance per layer so no two kernels start identical."""
    return tf.keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")


class Standardize(layers.Layer):
    """uint8 -> compute dtype, minus the ImageNet mean, over its std: on the device, not the CPU."""

    def call(self, images):
        images = tf.cast(images, self.compute_dtype)
        mean = tf.constant(IMAGENET_MEAN_RGB, dtype=self.compute_dtype)
        inv_std = tf.constant([1 / s for s in IMAGENET_STD_RGB], dtype=self.compute_dtype)
        return (images - mean) * inv_std


def _conv(x, filters: int, kernel: int, stride: int, name: str):
    if stride > 1:
        # Fixed, symmetric padding: "same" would pad asymmetrically for strided convolutions.
        pad = (kernel - 1) // 2
        x = layers.ZeroPadding2D(pad, name=f"{name}_pad")(x)
    return layers.Conv2D(
        filters,
        kernel,
        strides=stride,
        padding="valid" if stride > 1 else "same",
        use_bias=False,
        kernel_initializer=_conv_init(),
        name=name,
    )(x)


def _bn(x, name: str, zero_gamma: bool = False):
    return layers.BatchNormalization(
        momentum=BN_MOMENTUM,
        epsilon=BN_EPSILON,
        gamma_initializer="zeros" if zero_gamma else "ones",
        name=name,
    )(x)


def _bottleneck(x, filters: int, stride: int, name: str):
    shortcut = _projection(x, 4 * filters, stride, name)
    y = layers.ReLU()(_bn(_conv(x, filters, 1, 1, f"{name}_conv1"), f"{name}_bn1"))
    y = layers.ReLU()(_bn(_conv(y, filters, 3, stride, f"{name}_conv2"), f"{name}_bn2"))
    y = _bn(_conv(y, 4 * filters, 1, 1, f"{name}_conv3"), f"{name}_bn3", zero_gamma=True)
    return layers.ReLU(name=f"{name}_out")(layers.Add()([shortcut, y]))


def _basic(x, filters: int, stride: int, name: str):
    shortcut = _projection(x, filters, stride, name)
    y = layers.ReLU()(_bn(_conv(x, filters, 3, stride, f"{name}_conv1"), f"{name}_bn1"))
    y = _bn(_conv(y, filters, 3, 1, f"{name}_conv2"), f"{name}_bn2", zero_gamma=True)
    return layers.ReLU(name=f"{name}_out")(layers.Add()([shortcut, y]))


def _projection(x, filters: int, stride: int, name: str):
    """Identity when shapes match, else a strided 1x1 convolution + BatchNorm."""
    if stride == 1 and x.shape[-1] == filters:
        return x
    y = layers.Conv2D(
        filters,
        1,
        strides=stride,
        use_bias=False,
        kernel_initializer=_conv_init(),
        name=f"{name}_proj_conv",
    )(x)
    return _bn(y, f"{name}_proj_bn")


def build_resnet(arch: str, num_classes: int, image_size: int | None) -> tf.keras.Model:
    """ResNet-50 v1.5 (25,557,032 trainable parameters at 1000 classes) or ResNet-18; for images
    of image_size, or of any size with None (progressive resizing: one trace per size)."""
    block = _bottleneck if arch == "resnet50" else _basic
    images = layers.Input([image_size, image_size, 3], dtype=tf.uint8, name="images")
    x = Standardize(name="standardize")(images)
    x = layers.ReLU()(_bn(_conv(x, 64, 7, 2, "stem_conv"), "stem_bn"))
    x = layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)
    for stage, (blocks, filters) in enumerate(
        zip(STAGES[arch], STAGE_FILTERS, strict=True), start=1
    ):
        for index in range(1, blocks + 1):
            stride = 2 if stage > 1 and index == 1 else 1
            x = block(x, filters, stride, f"stage{stage}_block{index}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dense(
        num_classes,
        kernel_initializer=tf.keras.initializers.RandomNormal(stddev=0.01),
        name="logits",
    )(x)
    logits = layers.Activation("linear", dtype="float32", name="logits_float32")(x)
    return tf.keras.Model(images, logits, name=arch)


def decayed_variables(model: tf.keras.Model) -> list[tf.Variable]:
    """Convolution and dense kernels only: no weight decay on BatchNorm or biases."""
    return [
        layer.kernel for layer in model.layers if isinstance(layer, layers.Conv2D | layers.Dense)
    ]
