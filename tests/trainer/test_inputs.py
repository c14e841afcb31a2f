"""trainer/inputs.py: the input plan picks synthetic batches or this rank's TFRecord shards, and a
failed read turns into placeholders and one agreed line (here on one rank, in process)."""

import json

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from trainer.config import parse_config
from trainer.inputs import (
    SYNTHETIC_STEPS_PER_EPOCH,
    RecordBatches,
    SyntheticBatches,
    TrainBatches,
    plan_inputs,
)
from trainer.ranks import RunError

SMALL = ["--image-size", "32", "--batch-size", "4"]


def test_synthetic_plan_makes_its_batches_on_the_device_at_each_size(tmp_path):
    config = parse_config(["--synthetic", "--model-dir", str(tmp_path), *SMALL])
    plan = plan_inputs(config, global_batch=4)
    assert (plan.num_classes, plan.steps_per_epoch) == (1000, SYNTHETIC_STEPS_PER_EPOCH)
    assert plan.info is None and plan.train_shard.files == []
    batches = plan.batches(config, node_cpus=2, device=None)
    assert isinstance(batches, SyntheticBatches)
    [(images, labels)] = batches.eval()
    assert (images.shape, images.dtype, labels.shape) == ((4, 32, 32, 3), tf.uint8, (4,))
    source = batches.train(16, epoch=0, skip_steps=0)
    first, second = source.next(), source.next()
    assert first[0].shape == (4, 16, 16, 3) and first is second  # one batch, made once
    assert source.error is None

    flags = ["--num-classes", "10", "--steps-per-epoch", "3"]
    config = parse_config(["--synthetic", "--model-dir", str(tmp_path), *SMALL, *flags])
    plan = plan_inputs(config, global_batch=4)
    assert (plan.num_classes, plan.steps_per_epoch) == (10, 3)


def test_records_plan_reads_this_rank_s_shards(tiny_data, tmp_path):
    hvd.init()
    args = ["--data-dir", str(tiny_data), "--model-dir", str(tmp_path), "--num-classes", "4"]
    config = parse_config([*args, *SMALL])
    plan = plan_inputs(config, global_batch=4)
    # No manifest: the 32 train records were counted (8 steps of 4); labels 1-based by default.
    assert (plan.num_classes, plan.steps_per_epoch, plan.info.label_base) == (4, 8, 1)
    batches = plan.batches(config, node_cpus=2, device=None)
    assert isinstance(batches, RecordBatches)
    images, labels = batches.train(32, epoch=0, skip_steps=0).next()
    assert images.shape == (4, 32, 32, 3) and set(labels.numpy()) <= {0, 1, 2, 3}
    assert sum(int(labels.shape[0]) for _, labels in batches.eval()) == 8


def test_a_failed_read_names_the_error_and_feeds_zeros_until_the_ranks_agree():
    reads = []

    def failing():
        reads.append(1)
        raise tf.errors.DataLossError(None, None, "corrupted record at 12")
        yield  # a generator, as a dataset iterator is

    source = TrainBatches(failing(), 4, 16, describe_error=lambda exc: f"described: {exc.message}")
    images, labels = source.next()
    assert source.error == "described: corrupted record at 12"
    assert (images.shape, images.dtype, labels.shape, labels.dtype) == (
        (4, 16, 16, 3), tf.uint8, (4,), tf.int32,
    )  # fmt: skip
    assert not np.any(images.numpy())
    source.next()
    assert len(reads) == 1  # the failed pipeline is not read again


def test_a_rank_s_missing_shard_is_agreed_as_one_error(tiny_data, tmp_path):
    """The manifest lists a shard this node has not pulled: the rank waits --data-wait-s, then
    every rank stops with one line naming it."""
    hvd.init()
    names = ["train-00000-of-00002", "train-00001-of-00002", "train-00002-of-00002"]
    shards = [{"file": name, "split": "train"} for name in names]
    shards += [{"file": f"validation-0000{i}-of-00002", "split": "validation"} for i in (0, 1)]
    (tiny_data / "manifest.json").write_text(json.dumps({"num_classes": 4, "shards": shards}))
    args = ["--data-dir", str(tiny_data), "--model-dir", str(tmp_path), *SMALL]
    config = parse_config([*args, "--data-wait-s", "0"])
    with pytest.raises(RunError) as failed:
        plan_inputs(config, global_batch=4)
    missing = tiny_data / "train-00002-of-00002"
    assert str(failed.value) == (
        f"1 shard file of this rank not on disk after --data-wait-s 0: {missing}"
    )
