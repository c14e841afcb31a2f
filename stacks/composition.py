"""The five stacks wired together: DatasetStack <- TeardownStack <- PreprocessStack, TrainStack;
ImageStack <- TrainStack unless the user brings an AMI (-c ami=)."""

import math
from dataclasses import dataclass

from aws_cdk import App, Environment, Stack, Tags
from aws_cdk import aws_s3 as s3

from contract.names import (
    DATASET_STACK,
    IMAGE_STACK,
    PREPROCESS_STACK,
    PROJECT,
    PROJECT_TAG,
    TEARDOWN_STACK,
    TRAIN_STACK,
)
from stacks.config import FleetConfig
from stacks.dataset.bucket import default_bucket_name
from stacks.dataset.stack import DatasetStack
from stacks.image.stack import ImageStack
from stacks.instance_types import fleet_usd_per_hour
from stacks.preprocess.stack import PreprocessStack
from stacks.teardown.stack import TeardownStack
from stacks.train.stack import TrainStack


@dataclass(frozen=True)
class HorovodFleet:
    """The stacks of one app; dataset is None when the bucket is imported with datasetBucket,
    preprocess when a drill's dataset is converted off AWS (-c drillPreprocess=false)."""

    dataset: DatasetStack | None
    image: ImageStack
    teardown: TeardownStack
    preprocess: PreprocessStack | None
    train: TrainStack


def budget_limit_usd(config: FleetConfig) -> float:
    """The most a capped run can cost plus a day of the preprocessing node, rounded up."""
    fleet = fleet_usd_per_hour(config.gpu, config.nodes) * config.max_hours
    node = config.preprocess
    preprocessing = (node.usd_per_hour + node.max_surplus_usd_per_hour) * 24
    return float(math.ceil(fleet + preprocessing))


def compose(app: App, config: FleetConfig) -> HorovodFleet:
    """Add the stacks for `config` to `app`."""
    env = Environment(region=config.region)
    Tags.of(app).add(PROJECT_TAG, PROJECT)
    bucket_name = config.dataset_bucket or default_bucket_name(config.region)
    # Stacks find the bucket by name. An imported bucket creates nothing but needs a stack as
    # its scope: one outside the app, so no stack of the app owns or exports it.
    bucket = s3.Bucket.from_bucket_name(Stack(), "DatasetBucket", bucket_name)
    dataset = (
        None
        if config.dataset_bucket
        else DatasetStack(
            app,
            DATASET_STACK,
            bucket_name=bucket_name,
            env=env,
            description="horovod-fleet: the dataset bucket (raw/, tfrecords/, runs/), kept forever",
        )
    )
    teardown = TeardownStack(
        app,
        TEARDOWN_STACK,
        bucket=bucket,
        budget_email=config.budget_email,
        budget_limit_usd=budget_limit_usd(config),
        notify_email=config.notify_email,
        dataset_prefix=config.dataset_prefix,
        env=env,
        description="horovod-fleet: the run controller that stops the bill when a run ends, caps or idles",
    )
    preprocess = (
        None
        if config.drill and not config.drill.preprocess
        else PreprocessStack(
            app,
            PREPROCESS_STACK,
            config=config,
            bucket=bucket,
            guards=teardown.guards,
            env=env,
            description="horovod-fleet: the node that converts "
            + ("the drill's dataset" if config.drill else "ImageNet")
            + " to TFRecords",
        )
    )
    image = ImageStack(
        app,
        IMAGE_STACK,
        test_type=config.image_test,
        revision=config.image_revision,
        placement=config.placement,
        jit_type=config.image_jit,
        env=env,
        description="horovod-fleet: the training AMI, baked by Image Builder and proven on a GPU",
    )
    train = TrainStack(
        app,
        TRAIN_STACK,
        config=config,
        bucket=bucket,
        guards=teardown.guards,
        # Your AMI, else the one ImageStack baked, read when TrainStack deploys (image_check.py).
        image_id=config.ami,
        image_version=None if config.ami else image.version,
        env=env,
        description=f"horovod-fleet: run {config.run} on {config.nodes} x {config.gpu.name}",
    )
    for stack in (preprocess, train):
        if stack is not None:
            stack.add_stack_dependency(teardown)
    # No dependency of TrainStack on ImageStack: `cdk deploy TrainStack` never bakes for hours
    # first; its image check refuses it in one line until ImageStack holds the image (issue 50).
    if dataset is not None:
        teardown.add_stack_dependency(dataset)
    return HorovodFleet(dataset, image, teardown, preprocess, train)
