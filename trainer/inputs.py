"""The input plan: where this rank's batches come from, device-made synthetic batches or its share
of the TFRecord shards, and how many steps an epoch has. Resolving it is collective (every rank
agrees on bad input before any trains); the batches it then makes are this rank's alone.
"""

from __future__ import annotations

import dataclasses

import horovod.tensorflow as hvd
import tensorflow as tf

from trainer import data
from trainer.config import TrainConfig
from trainer.ranks import RunError, agree

SYNTHETIC_STEPS_PER_EPOCH = 100


@dataclasses.dataclass(frozen=True)
class InputPlan:
    num_classes: int
    steps_per_epoch: int
    info: data.DatasetInfo | None  # None: synthetic
    train_shard: data.RankShard
    val_shard: data.RankShard

    def batches(self, config: TrainConfig, node_cpus: int, device: str | None):
        """The batch factories for this rank (`device`: the GPU it trains on, or None)."""
        if self.info is None:
            return SyntheticBatches(config, self.num_classes)
        return RecordBatches(config, self, input_threads(node_cpus), device)


def plan_inputs(config: TrainConfig, global_batch: int) -> InputPlan:
    """Collective for TFRecords: this rank's shards and the steps per epoch, agreed by all."""
    if config.synthetic:
        return InputPlan(
            num_classes=config.num_classes or data.DEFAULT_NUM_CLASSES,
            steps_per_epoch=config.steps_per_epoch or SYNTHETIC_STEPS_PER_EPOCH,
            info=None,
            train_shard=data.RankShard([]),
            val_shard=data.RankShard([]),
        )
    info, train_shard, val_shard, steps_per_epoch = resolve_input(config, global_batch)
    return InputPlan(info.num_classes, steps_per_epoch, info, train_shard, val_shard)


class TrainBatches:
    """This rank's training batches at one resolution. After a failure to read one, `error` says
    what failed and the batches are zeros of the same shape: they keep this rank in the step's
    collectives until the ranks next read the flags, agree on the error and stop together."""

    def __init__(self, batches, batch_size: int, image_size: int, describe_error):
        self.batches = batches
        self.shape = [batch_size, image_size, image_size, 3]
        self.describe_error = describe_error
        self.error: str | None = None
        self.placeholder = None

    def next(self):
        if self.error is None:
            try:
                return next(self.batches)
            except tf.errors.OpError as exc:
                self.error = self.describe_error(exc)
                self.placeholder = (
                    tf.zeros(self.shape, tf.uint8),
                    tf.zeros(self.shape[:1], tf.int32),
                )
        return self.placeholder


class SyntheticBatches:
    """--synthetic: random batches made on the device (the smoke test), one for evaluation."""

    def __init__(self, config: TrainConfig, num_classes: int):
        self.config = config
        self.num_classes = num_classes
        self.batch = data.synthetic_batch(config.batch_size, config.image_size, num_classes)

    def eval(self):
        return [self.batch]

    def describe_eval_error(self, exc: tf.errors.OpError) -> str:
        """No file to name: these batches are made on the device (training's too)."""
        return data.describe_input_error(exc, [], self.config.image_size)

    def train(self, size: int, epoch: int, skip_steps: int) -> TrainBatches:
        """The same batch at `size` every step, made at the first."""
        repeated = self._repeated(size)
        return TrainBatches(repeated, self.config.batch_size, size, self.describe_eval_error)

    def _repeated(self, size: int):
        batch = data.synthetic_batch(self.config.batch_size, size, self.num_classes)
        while True:
            yield batch


class RecordBatches:
    """This rank's share of the TFRecords: augmented training batches at the recipe's
    resolution, and its share of the validation records for evaluation."""

    def __init__(self, config: TrainConfig, plan: InputPlan, threads: int, device: str | None):
        self.config = config
        self.plan = plan
        self.threads = threads
        self.device = device
        self.shuffle_seed = (config.seed or 0) * 15485863  # --seed moves every rank's and epoch's

    def eval(self):
        shard = self.plan.val_shard
        return data.eval_dataset(
            shard.files,
            batch_size=self.config.batch_size,
            image_size=self.config.image_size,
            num_classes=self.plan.num_classes,
            label_base=self.plan.info.label_base,
            threads=self.threads,
            ways=shard.ways,
            index=shard.index,
            device=self.device,
        )

    def describe_eval_error(self, exc: tf.errors.OpError) -> str:
        return data.describe_input_error(exc, self.plan.val_shard.files, self.config.image_size)

    def train(self, size: int, epoch: int, skip_steps: int) -> TrainBatches:
        """Batches at `size`, shuffled differently for each rank, 0-based epoch and resume step."""
        shard = self.plan.train_shard
        batches = rank_train_batches(
            self.config,
            self.plan.info,
            shard,
            image_size=size,
            # Horovod: each rank shuffles its share with a seed of its own.
            seed=self.shuffle_seed + hvd.rank() * 7919 + epoch * 104729 + skip_steps,
            threads=self.threads,
            device=self.device,
        )
        return TrainBatches(batches, self.config.batch_size, size, self.describe_train_error)

    def describe_train_error(self, exc: tf.errors.OpError) -> str:
        return data.describe_input_error(exc, self.plan.train_shard.files, self.config.image_size)


def resolve_input(config: TrainConfig, global_batch: int):
    """This rank's shards, the class count and label base, and steps per epoch; agreed by all."""
    info, train_shard, val_shard, local_error = None, None, None, None
    try:
        info = data.resolve_dataset(config.data_dir, config.num_classes, config.label_base)
        # Horovod: every record goes to one rank, whole files where there are enough of them.
        train_shard = data.shard_for_rank(info.train_files, hvd.rank(), hvd.size())
        val_shard = data.shard_for_rank(info.validation_files, hvd.rank(), hvd.size())
        # The node may still be pulling: this rank's files first (docs/contracts.md).
        data.wait_for_files(train_shard.files + val_shard.files, config.data_wait_s, say=rank_says)
    except data.DataError as exc:
        local_error = str(exc)
    agree(local_error)
    if config.eval_only:  # no training: the schedule, hence steps per epoch, is irrelevant
        return info, train_shard, val_shard, 1
    split = train_shard.ways > 1
    # The same on every rank (the allreduce below needs them all); `split` may differ by rank.
    need_total = info.train_records is None and not config.steps_per_epoch
    local_count = 0
    try:
        # A rank whose own shards are empty would wait forever for its first batch while the
        # others wait for it in the step's allreduce, even when the whole split has records.
        what = f"rank {hvd.rank()}'s train shards, from {train_shard.files[0]},"
        data.require_records(train_shard.files, what)
        if split or need_total:
            local_count = data.count_shard_records(train_shard)
        if split and local_count == 0:
            raise data.DataError(
                f"rank {hvd.rank()}'s share of {train_shard.files[0]} (every "
                f"{train_shard.ways}th record) holds no records: use fewer ranks or more shards"
            )
    except data.DataError as exc:
        local_error = str(exc)
    agree(local_error)
    train_records = info.train_records
    if need_total:
        # Horovod: the split's records, counted by every rank over its share.
        train_records = int(hvd.allreduce(tf.constant(local_count), op=hvd.Sum, name="records"))
    steps = config.steps_per_epoch or train_records // global_batch
    if steps == 0:
        raise RunError(
            f"{train_records} train records in {config.data_dir} are fewer than one global batch "
            f"of {global_batch} ({hvd.size()} ranks x --batch-size {config.batch_size})"
        )
    return info, train_shard, val_shard, steps


def rank_says(message: str) -> None:
    """A line of this rank's own (the other ranks' output is horovodrun's [r]-prefixed lines)."""
    print(f"rank {hvd.rank()}: {message}", flush=True)


def input_threads(node_cpus: int) -> int:
    """This rank's share of the node's CPUs (counted before it was bound to its GPU's socket)."""
    # Horovod: the node's ranks share its CPUs.
    return max(1, node_cpus // hvd.local_size())


def rank_train_batches(
    config: TrainConfig,
    info: data.DatasetInfo,
    shard: data.RankShard,
    *,
    image_size: int,
    seed: int,
    threads: int,
    device: str | None,
):
    """This rank's endless training batches from its shard at image_size, augmented as the
    flags say."""
    return iter(
        data.train_dataset(
            shard.files,
            batch_size=config.batch_size,
            image_size=image_size,
            num_classes=info.num_classes,
            label_base=info.label_base,
            shuffle_buffer=config.shuffle_buffer,
            min_crop_area=config.min_crop_area,
            seed=seed,
            threads=threads,
            ways=shard.ways,
            index=shard.index,
            device=device,
        )
    )
