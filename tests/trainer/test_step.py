"""trainer/step.py and trainer/resume.py in this process, as one rank: the step's variants, the
sums the loop reads, the evaluation and its agreed failure, the variables every rank shares."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from trainer import data
from trainer.config import parse_config
from trainer.ranks import RunError
from trainer.resume import resume_step
from trainer.step import (
    BAD_INPUT,
    CROSS_ENTROPY,
    HOSTS_UPDATED,
    STOP,
    TOTAL_LOSS,
    Trainer,
    checkpoint_variables,
    settle_recipe,
)


def small_trainer(tmp_path, *flags: str) -> Trainer:
    hvd.init()
    args = ["--synthetic", "--model-dir", str(tmp_path), "--arch", "resnet18", "--batch-size", "4"]
    config, recipe = settle_recipe(parse_config([*args, "--image-size", "32", *flags]), 4)
    return Trainer(config, recipe, num_classes=10, steps_per_epoch=2, gpu=False)


@pytest.mark.slow  # trains: a trace of ResNet-18 and three steps, 8 s (XLA's compile: 20 s)
@pytest.mark.parametrize(
    ("precision", "xla", "recipe", "lars"),
    [("fp32", "off", "goyal", False), ("fp16", "on", "fast", True)],
)
def test_train_step_variants_update_weights(tmp_path, precision, xla, recipe, lars):
    """The GPU settings (float16 loss scaling, XLA, LARS) run here on CPU, in one process."""
    hvd.init()
    args = ["--synthetic", "--model-dir", str(tmp_path), "--arch", "resnet18", "--batch-size", "4"]
    args += ["--recipe", recipe, "--warmup-epochs", "0"]  # no zero-LR first step
    config = parse_config([*args, "--image-size", "32", "--precision", precision, "--xla", xla])
    config, settled = settle_recipe(config, 4)
    try:
        trainer = Trainer(config, settled, num_classes=10, steps_per_epoch=2, gpu=False)
        assert (trainer.mixed, trainer.xla, trainer.lars) == (
            precision == "fp16",
            xla == "on",
            lars,
        )
        kernel = trainer.model.get_layer("stem_conv").kernel
        before = kernel.numpy().copy()
        images, labels = data.synthetic_batch(4, 32, 10)
        for flags in ([0.0, 0.0, 0.0], [1.0, 0.0, 1.0]):
            trainer.train_step(images, labels, tf.constant(flags))
        sums = trainer.read_step_sums()
        loss, total = sums[CROSS_ENTROPY], sums[TOTAL_LOSS]
        assert np.isfinite(total) and total > loss > 0
        assert (sums[BAD_INPUT], sums[STOP], sums[HOSTS_UPDATED]) == (1.0, 0.0, 1.0)
        assert not trainer.read_step_sums().any()  # read and reset
        assert int(trainer.optimizer.iterations) == 2
        assert not np.allclose(kernel.numpy(), before)
        assert (trainer.loss_scale_state() is None) == (precision == "fp32")

        # As the loop reads it: means over ranks and steps, and the flags as booleans.
        trainer.train(images, labels, bad_input=False, stop=True, hosts_updated=False)
        means = trainer.read_sums(steps=1)
        assert (means.bad_input, means.stop, means.hosts_updated) == (False, True, False)
        assert np.isfinite(means.total_loss) and means.total_loss > means.loss > 0
        assert trainer.global_step() == 3
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_evaluation_counts_every_image_and_agrees_on_a_failed_read(tmp_path):
    trainer = small_trainer(tmp_path)
    trainer.record_epoch(3)
    images, labels = data.synthetic_batch(4, 32, 10)
    result = trainer.evaluate([(images, labels), (images[:2], labels[:2])], describe_error=str)
    assert (result["epoch"], result["images"]) == (3, 6)
    assert 0 <= result["top1"] <= result["top5"] <= 1

    def failing():
        yield images, labels
        raise tf.errors.DataLossError(None, None, "corrupted record at 12")

    with pytest.raises(RunError, match=r"^described: corrupted record at 12$"):
        trainer.evaluate(failing(), lambda exc: f"described: {exc.message}")


def test_resume_step_keeps_the_fraction_of_the_epoch():
    assert resume_step(20, 200, 200) == 20
    assert resume_step(20, 200, 100) == 10  # twice the ranks: half the steps per epoch
    assert resume_step(0, 78, 39) == 0


def test_every_checkpoint_variable_is_broadcast_loss_scale_included(tmp_path):
    """LossScaleOptimizer.variables leaves out the loss scale and its good-step counter: after
    a resume, fp16 ranks other than 0 used to start again at 32768 while rank 0 used its own."""
    try:
        trainer = small_trainer(tmp_path, "--precision", "fp16")
        assert trainer.loss_scale_state() == (32768.0, 0)
        names = {variable.name.split(":")[0] for variable in trainer.state}
        assert {"current_loss_scale", "good_steps", "completed_epochs", "epoch_step"} <= names
        listed = [id(variable) for variable in trainer.state]
        assert not {id(v) for v in trainer.model.variables} - set(listed)
        assert not {id(v) for v in trainer.optimizer.variables} - set(listed)
        # Rank 0's saves add a save_counter the other ranks lack: the list must not change.
        trainer.checkpoint.save(str(tmp_path / "ckpt"))
        assert [id(variable) for variable in trainer.state] == listed
        assert len(checkpoint_variables(trainer.checkpoint)) == len(listed) + 1
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
