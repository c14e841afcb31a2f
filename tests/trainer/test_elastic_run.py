"""trainer/elastic_run.py and the world-dependent parts of trainer/step.py in this process, as one
rank: what the elastic state holds, saves, restores and syncs (the loss scale included), and
what a new world changes in the step (the global batch, the learning rate, the trace)."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError
from horovod.runner.elastic.worker import HostUpdateResult

from trainer import data, elastic_run
from trainer.config import parse_config
from trainer.elastic_run import TrainerState
from trainer.resume import start_from
from trainer.step import Trainer, distributed_tape, settle_recipe


def elastic_trainer(tmp_path, *flags: str, planned: int = 4) -> Trainer:
    """A ResNet-18 trainer whose recipe is settled for `planned` ranks of 4 images."""
    hvd.init()
    args = ["--synthetic", "--model-dir", str(tmp_path), "--arch", "resnet18", "--batch-size", "4"]
    args += ["--image-size", "32", "--elastic", "--planned-ranks", str(planned), *flags]
    config, recipe = settle_recipe(parse_config(args), 4 * planned)
    return Trainer(config, recipe, 10, steps_per_epoch=100, gpu=False, planned_ranks=planned)


@pytest.fixture
def fp16_trainer(tmp_path):
    try:
        yield elastic_trainer(tmp_path, "--precision", "fp16")
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def by_name(variables, name):
    [variable] = [v for v in variables if v.name.split(":")[0] == name]
    return variable


def test_the_state_restores_the_loss_scale_where_tensorflow_keras_state_does_not(fp16_trainer):
    """LossScaleOptimizer.variables leaves out current_loss_scale and good_steps, and Horovod's
    TensorFlowKerasState keeps only model.variables and optimizer.variables()
    (horovod/tensorflow/elastic.py v0.28.1 lines 137-153): after a restore its ranks would keep
    whatever loss scale they had. The trainer's state is every variable of its checkpoint."""
    trainer = fp16_trainer
    keras_state = hvd.elastic.TensorFlowKerasState(trainer.model, trainer.optimizer)
    state = TrainerState(trainer.state)
    scale = by_name(trainer.state, "current_loss_scale")
    good = by_name(trainer.state, "good_steps")
    kept = {id(v) for v in [*trainer.model.variables, *trainer.optimizer.variables]}
    assert id(scale) not in kept and id(good) not in kept  # the trap
    assert len(keras_state._saved_optimizer_state) == len(trainer.optimizer.variables)

    state.save()
    kernel = trainer.model.get_layer("stem_conv").kernel
    before = kernel.numpy().copy()
    scale.assign(512.0)
    good.assign(7)
    kernel.assign(kernel + 1.0)
    trainer.epoch_step.assign(9)
    keras_state.restore()
    assert (float(scale.numpy()), int(good.numpy())) == (512.0, 7)  # TensorFlowKerasState
    state.restore()
    assert (float(scale.numpy()), int(good.numpy())) == (32768.0, 0)
    assert np.array_equal(kernel.numpy(), before) and int(trainer.epoch_step.numpy()) == 0


def test_the_sync_broadcasts_every_variable_and_its_lost_peer_resets(fp16_trainer, monkeypatch):
    trainer = fp16_trainer
    state = TrainerState(trainer.state)
    state.resets = [{"steps_redone": 3}]
    state.save()
    state.record = {"uncommitted": True}
    broadcast = []
    monkeypatch.setattr(
        elastic_run.hvd, "broadcast_variables", lambda v, root_rank: broadcast.append(v)
    )
    state.sync()
    [variables] = broadcast
    assert [id(v) for v in variables] == [id(v) for v in trainer.state]
    assert {"current_loss_scale", "good_steps", "epoch_step"} <= {
        v.name.split(":")[0] for v in variables
    }
    # The committed Python record rides along; what changed since the commit does not
    # (ObjectState.sync broadcasts its saved copy: horovod/common/elastic.py lines 141-144).
    assert (state.resets, state.record) == ([{"steps_redone": 3}], {})

    def peer_lost(variables, root_rank):
        raise tf.errors.UnknownError(
            None, None, "Horovod has been shut down. [Op:HorovodBroadcast]"
        )

    monkeypatch.setattr(elastic_run.hvd, "broadcast_variables", peer_lost)
    # run_fn calls sync outside the function hvd.elastic.run wraps: without this it would end
    # the rank instead of resetting it.
    with pytest.raises(HorovodInternalError):
        state.sync()


def test_a_host_notice_is_pending_until_the_reset(fp16_trainer):
    state = TrainerState(fp16_trainer.state)
    assert not state.hosts_update_pending
    state.on_hosts_updated(1, HostUpdateResult.added)  # Horovod's notification thread
    assert state.hosts_update_pending
    state.on_reset()
    assert not state.hosts_update_pending


@pytest.mark.parametrize(("recipe", "scaling"), [("goyal", 0.5), ("fast", 0.5**0.5)])
def test_a_smaller_world_keeps_the_batch_per_rank_and_scales_the_lr_by_the_recipe_s_rule(
    tmp_path, recipe, scaling
):
    """4 ranks planned, 2 left: the global batch halves, the peak LR follows the recipe's own rule
    (goyal linear, fast the square root), and the schedule stands at the same fraction of the
    run: warmup and decay in epochs, realigned to the world's steps."""
    trainer = elastic_trainer(tmp_path, "--recipe", recipe, "--warmup-epochs", "1")
    planned_peak = trainer.recipe.peak_lr  # settled for the 4 planned ranks
    trainer.set_world(4, 100)  # the planned world
    assert trainer.peak_lr == planned_peak
    trainer.mark_position(1, 50)  # half of epoch 2, past the warmup
    start = start_from(trainer, None, 100)
    lr_at_half = trainer.learning_rate()
    assert (trainer.global_batch, start.skip_steps, trainer.global_step()) == (16, 50, 150)

    trainer.set_world(2, 200)  # half the ranks: twice the steps per epoch
    start = start_from(trainer, None, 200)
    assert (trainer.global_batch, start.skip_steps, trainer.global_step()) == (8, 100, 300)
    assert trainer.peak_lr == pytest.approx(planned_peak * scaling)
    assert trainer.learning_rate() == pytest.approx(lr_at_half * scaling, rel=1e-3)


@pytest.mark.slow  # trains: a trace of ResNet-18 and two steps, 7 s
def test_the_step_traced_in_one_world_applies_the_next_world_s_lr_without_a_new_trace(tmp_path):
    trainer = elastic_trainer(tmp_path, "--warmup-epochs", "0")
    images, labels = data.synthetic_batch(4, 32, 10)
    flags = tf.constant([0.0, 0.0, 0.0])
    trainer.set_world(4, 100)
    traced = trainer.train_step.get_concrete_function(images, labels, flags)
    trainer.train_step(images, labels, flags)
    applied = float(trainer.optimizer.learning_rate)  # what the traced step used, step 0
    assert applied == pytest.approx(trainer.recipe.peak_lr)

    trainer.set_world(2, 100)
    trainer.optimizer.iterations.assign(0)
    trainer.train_step(images, labels, flags)
    assert float(trainer.optimizer.learning_rate) == pytest.approx(applied / 2)
    assert trainer.train_step.get_concrete_function(images, labels, flags) is traced


def test_gradients_pre_divided_by_the_planned_ranks_average_in_a_smaller_world(tmp_path):
    """The step pre-divides by the planned ranks (4), whatever the world: Horovod multiplies the
    sum back and divides it by its size at run time (1 here), so the gradient is the average."""
    hvd.init()
    x = tf.Variable(3.0)
    with tf.GradientTape() as tape:
        loss = 5.0 * x
    (grad,) = distributed_tape(tape, predivide=4).gradient(loss, [x])
    assert float(grad) == 5.0
