"""The run's configuration on the record (issue 50): every context value of a TrainStack deploy in
runs/<run>/config.json, and a redeploy of the same run that would train it otherwise refused.

Two deploy-time answers (controller/run_answers.py):
- RunCheck, before any instance: reads config.json (read only) and refuses, in one line naming
  the differences, a deploy whose training values differ from the record's, unless
  -c allowChange=true. The checkpoints in runs/<run>/ would otherwise resume under another
  recipe, global batch or model.
- RunRecord, after every node and the head are created (their signals received): writes
  config.json. So the record holds what a deploy that got its fleet up was made with; a deploy
  that failed on its way never wrote one, and a rollback's Update writes the values back.
"""

import json
from typing import Any

from aws_cdk import CustomResource
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract.names import RUN_CHECK_TYPE, RUN_RECORD_TYPE
from stacks.config import FleetConfig
from stacks.teardown.answered import answered
from stacks.teardown.guards import FleetGuards


def training_values(config: FleetConfig) -> dict[str, Any]:
    """What a run trains, by context key, as resolved (the recipe's epochs at this global batch):
    the values a redeploy of the run may change only with allowChange."""
    return {
        "recipe": config.recipe,
        "nodes": config.nodes,
        "instanceType": config.gpu.name,
        "epochs": config.plan.epochs,
        "batchPerGpu": config.batch_per_gpu,
        "arch": config.arch,
        "imageSize": config.image_size,
    }


def text(value: Any) -> str:
    """A JSON property: CloudFormation passes strings through unchanged."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def run_check(
    scope: Construct, *, guards: FleetGuards, config: FleetConfig, bucket: s3.IBucket
) -> CustomResource:
    return answered(
        scope,
        "RunCheck",
        guards=guards,
        resource_type=RUN_CHECK_TYPE,
        properties={
            "Bucket": bucket.bucket_name,
            "Run": config.run,
            "Training": text(training_values(config)),
            "AllowChange": str(config.allow_change).lower(),
        },
    )


def run_record(
    scope: Construct,
    *,
    guards: FleetGuards,
    config: FleetConfig,
    bucket: s3.IBucket,
    after: list[Construct],
) -> CustomResource:
    """Created once every construct of `after` (the nodes and the head) is."""
    record = answered(
        scope,
        "RunRecord",
        guards=guards,
        resource_type=RUN_RECORD_TYPE,
        properties={
            "Bucket": bucket.bucket_name,
            "Run": config.run,
            "Training": text(training_values(config)),
            "Context": text(dict(config.context)),
        },
    )
    record.node.add_dependency(*after)
    return record
