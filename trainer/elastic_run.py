"""The TensorFlow and Horovod side of `python -m trainer.train --elastic` (trainer/elastic.py has
the control): the state hvd.elastic keeps and syncs, the parts that live across worlds (model,
optimizer, recorder, checkpoint saver) and the opening of each world after a reset.

Nothing here calls a collective before hvd.elastic.run's first sync: a rank that joins later
runs this same code while the others wait in their sync (docs/elastic.rst, "no Horovod
collective ops ... can be called before this function"). The devices are pinned and the model
built first; every agreement (device, model dir, restore, shards) happens inside each world.
"""

from __future__ import annotations

import copy
import os
import socket

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState
from horovod.common.exceptions import HorovodInternalError

from trainer import data
from trainer.actions import Checkpoints
from trainer.cli import fail
from trainer.config import TrainConfig
from trainer.elastic import ElasticSession, Parts, UnexpectedError, World, is_collective_failure
from trainer.inputs import plan_inputs
from trainer.ranks import agree, log, pin_devices
from trainer.recorder import Recorder, make_model_dir
from trainer.resume import restore_newest_anywhere, start_from
from trainer.step import Trainer, settle_recipe


class TrainerState(ObjectState):
    """hvd.elastic's state: every variable of the trainer's checkpoint (trainer.state: weights,
    optimizer slots and iterations, the loss scale and its good-step counter, the position) and
    the run's Python record (started, the world, its resets, the start-up figures).

    Not TensorFlowKerasState: it keeps model.variables and optimizer.variables(), and
    LossScaleOptimizer's leave out current_loss_scale and good_steps (tests/trainer/
    test_elastic.py shows it). Not TensorFlowState: under TF2 its sync broadcasts nothing, only
    through a TF1 session (horovod/tensorflow/elastic.py v0.28.1 lines 191-195), and it
    broadcasts once when built (line 169), a collective before the first sync."""

    def __init__(self, variables: list[tf.Variable]):
        self.variables = variables
        self.hosts_update_pending = False  # set from Horovod's notification thread
        self._saved_values: list[tf.Tensor] = []
        self._save_variables()
        super().__init__(
            bcast_object=hvd.broadcast_object,
            get_rank=hvd.rank,
            started=False,
            world=None,
            resets=[],
            record={},
        )

    def _save_variables(self) -> None:
        # A copy on the variable's own device (the GPU): ~200 MB for ResNet-50, milliseconds.
        self._saved_values = [tf.identity(variable) for variable in self.variables]

    def save(self) -> None:
        self._save_variables()
        super().save()
        self._saved_state = copy.deepcopy(self._saved_state)  # ObjectState keeps references

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._saved_values, strict=True):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        """Horovod: rank 0's variables and record to every rank. run_fn calls this outside the
        function hvd.elastic.run wraps, so a peer lost here raises HorovodInternalError itself
        (a bare UnknownError would end the rank instead of resetting it)."""
        try:
            hvd.broadcast_variables(self.variables, root_rank=0)
            self._save_variables()
            super().sync()
        except tf.errors.UnknownError as exc:
            if is_collective_failure(exc):
                raise HorovodInternalError(exc) from exc
            raise UnexpectedError(f"{type(exc).__name__}: {exc}") from exc

    def on_hosts_updated(self, timestamp, update_res) -> None:
        super().on_hosts_updated(timestamp, update_res)
        self.hosts_update_pending = True  # rides in the next step's allreduce (trainer/step.py)

    def reset(self) -> None:
        self.hosts_update_pending = False


class HorovodCollectives:
    """The collectives trainer/elastic.py asks for, each named."""

    def agree(self, local_error: str | None) -> None:
        agree(local_error)

    def gather(self, value, name: str) -> list:
        return hvd.allgather_object(value, name=name)

    def broadcast(self, value, name: str):
        return hvd.broadcast_object(value, root_rank=0, name=name)

    def most(self, value: float, name: str) -> float:
        return float(hvd.allreduce(tf.constant(value, tf.float64), op=hvd.Max, name=name))


def host_name() -> str:
    """Horovod's name for this rank's host: the discovery's line, which resets.json reports."""
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


class ElasticRun:
    """The parts that live across worlds, and each world's opening."""

    def __init__(self, config: TrainConfig, stop, node_cpus: int, timings, schedule_for):
        self.node_cpus = node_cpus
        self.timings = timings
        self.schedule_for = schedule_for  # trainer/run.py's loop_schedule
        self.gpu, self.device_error = pin_devices()
        # The recipe of the planned world, on every rank, a joining one included.
        config, self.recipe = settle_recipe(config, config.batch_size * config.planned_ranks)
        self.config = config
        log(f"{self.recipe.describe()}; planned for {config.planned_ranks} ranks")
        if config.seed is not None:
            tf.keras.utils.set_random_seed(config.seed)  # rank 0's weights are synced to all
        self.trainer = Trainer(
            config,
            self.recipe,
            local_num_classes(config),
            steps_per_epoch=1,  # each world sets its own
            gpu=self.gpu,
            planned_ranks=config.planned_ranks,
        )
        self.recorder = Recorder(
            config,
            rank=hvd.rank(),
            ranks=hvd.size(),
            steps_per_epoch=1,
            timings=timings,
            step=self.trainer,
            local_rank=hvd.local_rank(),
        )
        self.checkpoints = Checkpoints(self.trainer, None, timings)
        self.manager = None
        self.state = TrainerState(self.trainer.state)
        parts = Parts(
            open_world=self.open_world,
            step=self.trainer,
            recorder=self.recorder,
            checkpoints=self.checkpoints,
            collectives=HorovodCollectives(),
            finish=self.finish,
            stop_request=stop,
            log=log,
        )
        self.session = ElasticSession(
            parts,
            min_ranks=config.min_ranks,
            commit_every_s=config.commit_every_s,
            checkpoint_every_s=config.checkpoint_every_s,
            target_top1=config.target_top1,
            stop_file=config.stop_file,
        )

    def run(self) -> None:
        """Train to the end, through every reset. A rank whose host Horovod's driver takes out
        of the job does not come back from its reset: Horovod aborts it there (SIGABRT:
        horovod/common/operations.cc v0.28.1 line 444 initialises Gloo outside the try of line
        654, and gloo_context.cc line 192 throws "has been removed from elastic job")."""
        hvd.elastic.run(self.session.run_world)(self.state)

    def open_world(self, state) -> World:
        """Collective, after hvd.elastic.run's sync: this world's devices, hosts, model dir and
        shards; the first world also restores the newest checkpoint on any rank's disk."""
        config, trainer = self.config, self.trainer
        rank, ranks = hvd.rank(), hvd.size()
        synced_step = trainer.global_step()
        agree(self.device_error)
        # Horovod: every rank's host, for the record of what a reset lost or added.
        hosts = hvd.allgather_object(host_name(), name="world_hosts")
        # Horovod: rank 0 writes the model dir (a later rank 0 may sit on another host).
        agree(make_model_dir(config.model_dir) if rank == 0 else None)
        if rank == 0 and self.manager is None:
            self.manager = tf.train.CheckpointManager(
                trainer.checkpoint, str(config.model_dir / "checkpoints"), config.keep_checkpoints
            )
        self.checkpoints.manager = self.manager if rank == 0 else None
        restored = None
        if not state.started:
            restored = restore_newest_anywhere(trainer, config.model_dir / "checkpoints")
        # Horovod: this world's shards (each rank waits for its files) and steps per epoch.
        plan = plan_inputs(config, config.batch_size * ranks)
        trainer.set_world(ranks, plan.steps_per_epoch)
        start = start_from(trainer, restored, plan.steps_per_epoch)
        self.recorder.set_world(rank, ranks, plan.steps_per_epoch, hvd.local_rank())
        log(
            f"elastic world: {ranks} ranks on {len(set(hosts))} hosts x {config.batch_size} = "
            f"global batch {trainer.global_batch}, {plan.steps_per_epoch} steps/epoch, peak LR "
            f"{trainer.peak_lr:g} (planned: {config.planned_ranks} ranks), from step "
            f"{trainer.global_step()} (epoch {start.epoch + 1}, step {start.skip_steps})"
        )
        return World(
            rank=rank,
            ranks=ranks,
            hosts=hosts,
            host=host_name(),
            synced_step=synced_step,
            start_step=trainer.global_step(),
            start_epoch=start.epoch,
            skip_steps=start.skip_steps,
            steps_per_epoch=plan.steps_per_epoch,
            batches=plan.batches(config, self.node_cpus, "/gpu:0" if self.gpu else None),
            schedule=self.schedule_for(config, self.recipe, plan.steps_per_epoch),
        )

    def finish(self, epochs: int, target: dict, resets: list[dict], record: dict) -> None:
        """train.json with the attempt's start-up figures (kept in the synced record, so a rank 0
        that joined later reports the first world's), and the digest hook."""
        timings = self.timings
        timings.start_step = record.get("start_step", 0)
        for name in ("framework_start_s", "first_step_s", "first_step_at"):
            setattr(timings, name, record.get(name, getattr(timings, name)))
        end_step = self.trainer.global_step()
        self.recorder.finish(epochs, target, end_step=end_step, resets=resets)


def local_num_classes(config: TrainConfig) -> int:
    """The class count, read by this rank alone (no collective before the first sync): the
    flag, else the manifest's. A bad manifest ends this rank with one line, exit 2."""
    if config.synthetic:
        return config.num_classes or data.DEFAULT_NUM_CLASSES
    try:
        return data.resolve_dataset(
            config.data_dir, config.num_classes, config.label_base
        ).num_classes
    except data.DataError as exc:
        fail(str(exc))
