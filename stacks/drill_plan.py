"""The drill's configuration side (`-c drill=true`, issue 49): its defaults, the regions it may
run in, the plan node.json carries, and its length and cost as synthesis prints them.

The experiments are contract/drill.py's one list; TrainStack synthesizes each as an FIS
experiment template (stacks/train/drill.py) and the head starts each at its point in the run
(docs/contracts.md, node.json `drill`). Every figure below is an estimate: nothing of this
project has run on AWS yet, and the drill is what measures it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

from contract import drill
from stacks.benchmark import TEARDOWN_S
from stacks.instance_types import (
    SC1_USD_PER_GIB_MONTH,
    BurstableType,
    GpuType,
    fleet_usd_per_hour,
)
from stacks.root_volume import HOURS_PER_MONTH, initialization_usd, throughput_usd_per_hour
from stacks.startup_estimate import startup_phases, startup_s
from stacks.teardown.controller_cost import tick_usd_per_month

# The drill's fleet when -c instanceType and -c nodes are empty: the cheapest GPU type of the
# table, 3 x $0.526/h (g5.xlarge's 3 x $1.006/h would break the $3 budget in an hour alone), and
# 3 nodes, so that a node's loss leaves the default minNodes (nodes - 1 = 2) training.
DEFAULT_TYPE = drill.DEFAULT_INSTANCE_TYPE
DEFAULT_NODES = 3
# The drill's batch per GPU when -c batchPerGpu is empty: a step of every rank is 3 x 16 images,
# so its 200 training images (contract/drill.py DATASET) make several steps an epoch.
BATCH_PER_GPU = 16
# What the whole drill may cost at list price, the image bake aside (issue 49).
BUDGET_USD = 3.0
# The regions whose CloudFormation has AWS::FIS::ExperimentTemplate: the provider schemas of
# cfn-lint 1.58.0 (cfnlint/data/schemas/providers/<region>.json, schema_date 2026-10-20), which
# lack it in ap-east-2, ap-south-2, ap-southeast-3 to -7, ca-west-1, il-central-1, mx-central-1
# and China, and have no file for me-south-1. AWS's own list of FIS endpoints,
# https://docs.aws.amazon.com/general/latest/gr/fis.html, could not be read in full here.
FIS_REGIONS = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "sa-east-1",
    "eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-central-2", "eu-north-1",
    "eu-south-1", "eu-south-2", "af-south-1", "me-central-1", "ap-east-1", "ap-south-1",
    "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2",
    "us-gov-east-1", "us-gov-west-1",
)  # fmt: skip
# The first epochs before the first experiment: seconds each on the drill's few MB, budgeted
# with their checkpoint at a minute.
FIRST_EPOCHS_S = 60
# From a fault's end to the controller acting on it: the tick runs every minute, and at once on
# an instance's state change (TeardownStack's NodeStateRule).
DETECTION_S = 60
# Training going again after a fault that ends by itself (the S3 cut): its retries' backoff.
RESUME_S = 60
# The preprocessing node, launch to its stop: boot, its installs and a few MB converted
# (unmeasured; its ready signal allows 30 minutes, stacks/preprocess/preprocessor.py).
PREPROCESS_S = 900
# An action whose fault holds recovery back until it ends: a throttled controller cannot act,
# a cut subnet cannot reach S3, a noticed Spot node runs until EC2 reclaims it. Insufficient
# capacity does not: the relaunch moves zone at the first refusal (docs/faults-and-recovery.md,
# "Moving zone").
HOLDS_RECOVERY = frozenset({drill.THROTTLE, drill.DISRUPT_CONNECTIVITY, drill.SPOT_INTERRUPTION})
# What has to boot before an experiment's last observation: a node or a head launched again.
BOOTS = frozenset({drill.REPLACEMENT_JOINED, drill.NEW_HEAD})


@dataclass(frozen=True)
class DrillPlan:
    """The validated drill: its experiments in order, whether PreprocessStack converts its
    dataset on AWS, and the trainer's epoch bound until the head's agreed stop."""

    experiments: tuple[drill.Experiment, ...]
    preprocess: bool
    max_epochs: int
    dataset: drill.Dataset = drill.DATASET

    def document(self, template_ids: dict[str, str]) -> dict:
        """node.json's `drill` object (docs/contracts.md), with each experiment's FIS template
        id (a CloudFormation Ref in TrainStack)."""
        return {
            "start_after_epoch": drill.START_AFTER_EPOCH,
            "max_epochs": self.max_epochs,
            "experiments": [
                {
                    "name": e.name,
                    "template_id": template_ids[e.name],
                    "action_ids": list(e.action_ids),
                    "observe": list(e.observe),
                    "within_s": e.within_s,
                }
                for e in self.experiments
            ],
        }


def max_epochs(max_hours: float) -> int:
    """The trainer's epochs in a drill: one per second of the hard cap. An epoch of the drill's
    dataset is several steps of ResNet-50 and an input pipeline's start, more than a second on
    any GPU of the table, so the cap (or the head's agreed stop) ends the training first."""
    return math.ceil(max_hours * 3600)


def fleet_startup_s(gpu: GpuType, nodes: int) -> float:
    """Launch to the first step, with no volume initialization rate (the drill's roots load
    lazily, stacks/train/stack.py) and a pull of a few MB: stacks/startup_estimate.py's."""
    return startup_s(startup_phases(gpu, nodes, pulls_data=False, init_rate=None))


def expected_s(experiment: drill.Experiment, boot_s: float) -> float:
    """From an experiment's start to its last observation, as expected: the faults that hold
    recovery back, the detection, then a boot or training going again."""
    held = max(
        (a.minutes * 60 for a in experiment.actions if a.action_id in HOLDS_RECOVERY), default=0
    )
    recovery = boot_s if BOOTS & set(experiment.observe) else RESUME_S
    return held + DETECTION_S + recovery


def length_s(experiments: tuple[drill.Experiment, ...], boot_s: float) -> float:
    """The fleet's life in a drill that goes as expected: start-up, the first epochs, every
    experiment in turn, the agreed stop and the teardown."""
    played = sum(expected_s(e, boot_s) for e in experiments)
    return boot_s + FIRST_EPOCHS_S + played + TEARDOWN_S


def cap_hours(experiments: tuple[drill.Experiment, ...], boot_s: float) -> float:
    """The drill's own hard cap (maxHours when it is empty): every experiment taking its whole
    `within_s`, rounded up to a quarter of an hour, at least the 1 hour any cap is."""
    worst = boot_s + FIRST_EPOCHS_S + sum(e.within_s for e in experiments) + TEARDOWN_S
    return max(1.0, math.ceil(worst / 900) / 4)


@dataclass(frozen=True)
class DrillCost:
    seconds: float
    fleet_usd: float
    fis_usd: float
    volumes_usd: float
    preprocess_usd: float
    controller_usd: float

    @property
    def usd(self) -> float:
        parts = (self.fleet_usd, self.fis_usd, self.volumes_usd, self.preprocess_usd)
        return sum(parts) + self.controller_usd


def cost(
    plan: DrillPlan, gpu: GpuType, nodes: int, preprocess: BurstableType, volume_gib: int
) -> DrillCost:
    """The drill's list price as expected: the fleet and its head for its length, FIS's
    action-minutes, the roots' gp3 throughput, the preprocessing node and its sc1 volume
    (until the drill's teardown), and the controller's ticks meanwhile."""
    seconds = length_s(plan.experiments, fleet_startup_s(gpu, nodes))
    hours = seconds / 3600
    if plan.preprocess:
        node_hours = PREPROCESS_S / 3600
        node = (preprocess.usd_per_hour + preprocess.max_surplus_usd_per_hour) * node_hours
        volume = volume_gib * SC1_USD_PER_GIB_MONTH / HOURS_PER_MONTH * (node_hours + hours)
        preprocessing = node + volume
    else:
        preprocessing = 0.0
    return DrillCost(
        seconds=seconds,
        fleet_usd=fleet_usd_per_hour(gpu, nodes) * hours,
        fis_usd=drill.fis_usd(plan.experiments),
        volumes_usd=throughput_usd_per_hour(nodes) * hours,
        preprocess_usd=preprocessing,
        controller_usd=tick_usd_per_month() / HOURS_PER_MONTH * hours,
    )


class Refused(ValueError):
    """A drill key's bad value, as (key, value, allowed): config.py's ConfigError says it in
    one line."""


# The keys only a drill reads, with their values when there is no drill (cdk.json's).
DRILL_KEYS = {"drillConfirmCost": False, "drillPreprocess": True, "drillExperiments": ()}
# What a drill decides itself: these keys keep cdk.json's values (its epochs run to the stop).
DECIDED_KEYS = {"benchmark": "false", "epochs": "empty", "targetTop1": "empty"}
APP_DATASET_PREFIX = "tfrecords/"  # cdk.json's datasetPrefix, which a drill does not use


def refuse_without_drill(context: dict, parsed: dict[str, object]) -> None:
    """A drill's key set without -c drill=true would be ignored: it is refused instead."""
    for key, value in parsed.items():
        if value != DRILL_KEYS[key]:
            default = json.dumps(DRILL_KEYS[key]) if DRILL_KEYS[key] != () else "empty"
            raise Refused(key, context[key], f"{default} without drill=true (a drill's key)")


def experiment_names(value: object) -> tuple[str, ...]:
    """-c drillExperiments: empty, or names separated by commas (a JSON list in cdk.json)."""
    if value is None or value == "":
        return ()
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise Refused("drillExperiments", value, "experiment names separated by commas")
    return tuple(n.strip() for n in names if n.strip())


def settle(
    config: Any,
    context: dict,
    *,
    drilling: bool,
    confirmed: bool,
    preprocess: bool,
    max_hours: float | None,
) -> Any:
    """stacks/config.py's FleetConfig with -c drill=true's plan, its hard cap (-c maxHours,
    else cap_hours), its epoch bound and its dataset; or Refused naming the first key that
    cannot be: a region without FIS templates, a P-family type unconfirmed, a key the drill
    decides, an unknown experiment or a Spot one on an on-demand fleet. Without a drill, the
    configuration as it is, and a drill's key at other than its default refused."""
    if not drilling:
        names = experiment_names(context.get("drillExperiments"))
        given = {"drillConfirmCost": confirmed, "drillPreprocess": preprocess}
        refuse_without_drill(context, {**given, "drillExperiments": names})
        return config
    region, market, gpu, nodes = config.region, config.market, config.gpu, config.nodes
    if region not in FIS_REGIONS:
        raise Refused(
            "region",
            region,
            "with drill=true a region whose CloudFormation has AWS::FIS::ExperimentTemplate: "
            + ", ".join(FIS_REGIONS),
        )
    if gpu.name.startswith("p") and not confirmed:
        raise Refused(
            "instanceType",
            gpu.name,
            f"with drill=true a G type (empty: {DEFAULT_TYPE}), or drillConfirmCost=true to "
            f"drill on {gpu.name} at ${fleet_usd_per_hour(gpu, nodes):,.2f}/h",
        )
    for key, default in DECIDED_KEYS.items():
        if context.get(key) not in (None, "", False, "false"):
            raise Refused(
                key,
                context[key],
                f"{default} with drill=true: a drill trains until its last experiment is "
                "judged, then stops",
            )
    if context.get("datasetPrefix", APP_DATASET_PREFIX) != APP_DATASET_PREFIX:
        raise Refused(
            "datasetPrefix",
            context["datasetPrefix"],
            f"{APP_DATASET_PREFIX} with drill=true: the drill's dataset is "
            f"{drill.DATASET.tfrecords_prefix} of the bucket",
        )
    raw = context.get("drillExperiments")
    names = experiment_names(raw)
    try:
        experiments = drill.plan(market, names)
    except drill.UnknownExperiment as unknown:
        raise Refused("drillExperiments", raw, f"the drill's experiments ({unknown})") from None
    if spot := [
        e.name for e in drill.EXPERIMENTS if e.name in names and e.market not in (None, market)
    ]:
        raise Refused(
            "drillExperiments",
            raw,
            f"experiments of market={market} ({', '.join(spot)} needs market=spot): "
            + ", ".join(e.name for e in drill.plan(market)),
        )
    _refuse_what_the_plan_cannot_play(config, experiments)
    cap = max_hours or cap_hours(experiments, fleet_startup_s(gpu, nodes))
    plan = DrillPlan(experiments, preprocess, max_epochs(cap))
    return replace(
        config,
        drill=plan,
        max_hours=cap,
        epochs=plan.max_epochs,
        dataset_prefix=plan.dataset.tfrecords_prefix,
    )


def _refuse_what_the_plan_cannot_play(config: Any, experiments: tuple) -> None:
    """A node's loss must leave an elastic fleet training (docs/faults-and-recovery.md, "A lost
    node"); and an S3 cut applies to the whole subnet, so never to one of the user's own."""
    observed = {code for e in experiments for code in e.observe}
    if drill.RESET in observed and config.nodes < 2:
        raise Refused("nodes", config.nodes, "at least 2 with drill=true: a node is lost")
    if drill.RESET in observed and config.min_nodes >= config.nodes:
        raise Refused(
            "minNodes",
            config.min_nodes,
            f"at most nodes - 1 = {config.nodes - 1} with drill=true: a lost node leaves the "
            "fleet training",
        )
    cuts = [e.name for e in experiments if drill.DISRUPT_CONNECTIVITY in e.action_ids]
    if cuts and config.placement.vpc_id is not None:
        raise Refused(
            "vpcId",
            config.placement.vpc_id,
            f"empty with drill=true while it plays {', '.join(cuts)}: FIS cuts the whole subnet "
            "off S3, whatever else runs in it; or leave it out with -c drillExperiments",
        )


def synthesis_lines(
    plan: DrillPlan,
    *,
    gpu: GpuType,
    nodes: int,
    market: str,
    max_hours: float,
    preprocess: BurstableType,
    volume_gib: int,
) -> list[str]:
    """What synthesis prints for a drill: each experiment (what, when, what must follow,
    within how long, its FIS actions), what is left out, the length and the cost."""
    boot_s = fleet_startup_s(gpu, nodes)
    lines = [
        f"Drill (-c drill=true): {len(plan.experiments)} experiments on {nodes} x {gpu.name}, "
        f"one at a time, the first once epoch {drill.START_AFTER_EPOCH} is done and each next "
        "one once the one before is judged; the head starts each (its FIS experiment template "
        "in TrainStack), then stops the training at the next epoch's end"
    ]
    when = f"after epoch {drill.START_AFTER_EPOCH}"
    for number, e in enumerate(plan.experiments, 1):
        lines.append(
            f"  {number}. {e.name} [{', '.join(e.action_ids)}, {e.minutes} action-minute"
            f"{'s' if e.minutes > 1 else ''}], {when}: {e.what}; then {e.expect}; within "
            f"{e.within_s / 60:g} min (~{expected_s(e, boot_s) / 60:.0f} min expected)"
        )
        when = f"once {e.name} is judged"
    left_out = [e.name for e in drill.EXPERIMENTS if e not in plan.experiments]
    if left_out:
        lines.append(
            f"  not played: {', '.join(left_out)} (-c drillExperiments, or a Spot experiment "
            "on an on-demand fleet: -c market=spot plays it)"
        )
    spent = cost(plan, gpu, nodes, preprocess, volume_gib)
    minutes = drill.fis_minutes(plan.experiments)
    played_s = spent.seconds - boot_s - FIRST_EPOCHS_S - TEARDOWN_S
    before = f" after ~{PREPROCESS_S / 60:.0f} min of preprocessing" if plan.preprocess else ""
    budget = (
        f"within the ${BUDGET_USD:.0f} budget"
        if spent.usd <= BUDGET_USD
        else f"over the ${BUDGET_USD:.0f} budget of a drill on {DEFAULT_NODES} x {DEFAULT_TYPE}"
    )
    spot = "; its Spot nodes at the on-demand price, the most they cost" if market == "spot" else ""
    lines.append(
        f"Drill estimate: the fleet lives ~{spent.seconds / 60:.0f} min{before} (start-up "
        f"~{boot_s / 60:.1f} min, epoch {drill.START_AFTER_EPOCH} ~{FIRST_EPOCHS_S / 60:.0f} "
        f"min, the experiments ~{played_s / 60:.0f} min, the stop and teardown "
        f"~{TEARDOWN_S / 60:.0f} min); cost ~${spent.usd:.2f} at list price ({budget}, the "
        f"image bake aside{spot}): fleet and head ${spent.fleet_usd:.2f}, FIS "
        f"${spent.fis_usd:.2f} ({minutes} action-minutes at ${drill.USD_PER_ACTION_MINUTE:.2f}), "
        f"root volumes' gp3 throughput ${spent.volumes_usd:.2f}, preprocessing "
        f"${spent.preprocess_usd:.2f}, the controller's ticks ${spent.controller_usd:.2f}"
    )
    lines.append(
        f"Drill cap: maxHours={max_hours:g} (every experiment taking its whole bound) ends the "
        f"fleet at ${fleet_usd_per_hour(gpu, nodes) * max_hours:,.2f} at most, FIS's "
        f"${spent.fis_usd:.2f} besides; its roots load lazily (no volume initialization rate, "
        f"which would add up to ${initialization_usd(1):.2f} a launch)"
    )
    data = plan.dataset
    converted = (
        f"PreprocessStack converts it into {data.tfrecords_prefix}"
        if plan.preprocess
        else f"horovod-fleet drill converts it into {data.tfrecords_prefix} on this machine "
        "(-c drillPreprocess=false: PreprocessStack is not synthesized)"
    )
    lines.append(
        f"Drill dataset: {data.classes} classes x {data.train_per_class} training images and "
        f"{data.val_images} validation images (python -m trainer.preprocess.sample) under "
        f"{data.raw_prefix} of the dataset bucket; {converted}, {data.train_shards} + "
        f"{data.val_shards} shards; {market} fleet"
    )
    return lines
