#!/usr/bin/env python3
"""The CDK app: reads context once, validates it, composes the stacks, checks them with cdk-nag.

A bad context value ends synthesis with one line on stderr and exit status 2; nothing below
this file reads context or the environment.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

# On Node 20, jsii prints an 11-line end-of-life banner to stderr when aws_cdk is imported, which
# buries the one-line error a bad context value gets. Silenced before the import starts jsii.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App, Aspects, Validations
from cdk_nag import AwsSolutionsChecks

from stacks.benchmark import benchmark_estimate
from stacks.composition import HorovodFleet, compose
from stacks.config import ConfigError, FleetConfig
from stacks.drill_plan import synthesis_lines as drill_lines
from stacks.image.recipe import bake_estimate, jit_estimate
from stacks.instance_types import (
    PRICES_AS_OF,
    fleet_estimate,
    preprocess_estimate,
    quota_note,
    spot_estimate,
    zone_note,
)
from stacks.nag import LogGroupReasons
from stacks.root_volume import init_rate
from stacks.run_estimate import checkpoint_note, training_estimate
from stacks.startup_estimate import startup_lines, startup_phases
from stacks.teardown.controller_cost import controller_estimate
from stacks.teardown.failure_mail import mail_note

HERE = Path(__file__).resolve().parent


def default_context() -> dict[str, Any]:
    """cdk.json's context. The CLI passes it too; reading it here makes `python app.py` and the
    tests synthesize exactly what `cdk synth` does."""
    context = json.loads((HERE / "cdk.json").read_text())["context"]
    cached = HERE / "cdk.context.json"
    if cached.exists():
        context.update(json.loads(cached.read_text()))
    return context


def build(
    overrides: dict[str, Any] | None = None, outdir: str | None = None
) -> tuple[App, FleetConfig, HorovodFleet]:
    """The app for cdk.json's context plus `overrides` (and the CLI's -c values); raises
    ConfigError on a bad value before any stack exists."""
    app = App(context={**default_context(), **(overrides or {})}, outdir=outdir)
    config = FleetConfig.from_context(app.node.get_all_context())
    stacks = compose(app, config)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    Aspects.of(app).add(LogGroupReasons())
    return app, config, stacks


def capacity_note(config: FleetConfig) -> str:
    """What to check about the reservation before a deploy waits on it."""
    reservation = config.capacity_reservation
    kind = "Capacity Block for ML" if reservation.block else "On-Demand Capacity Reservation"
    return (
        f"TrainStack launches into {kind} {reservation.id}; check it is active in {config.placement.az} "
        f"for {config.nodes} x {config.gpu.name}: aws ec2 describe-capacity-reservations "
        f"--region {config.region} --capacity-reservation-ids {reservation.id} --query "
        "'CapacityReservations[].[State,AvailabilityZone,InstanceType,AvailableInstanceCount]'"
    )


def estimates(config: FleetConfig) -> list[str]:
    """What synthesis prints before it synthesizes: cost, quota, zone, capacity, the bake."""
    lines = [
        fleet_estimate(config.gpu, config.nodes, config.max_hours),
        spot_estimate(config.gpu, config.nodes, config.region),
    ]
    if config.benchmark:
        lines.append(
            benchmark_estimate(config.benchmark, config.gpu, config.nodes, config.max_hours)
        )
    elif config.drill:
        lines += drill_lines(
            config.drill,
            gpu=config.gpu,
            nodes=config.nodes,
            market=config.market,
            max_hours=config.max_hours,
            preprocess=config.preprocess,
            volume_gib=config.data_volume_gib,
        )
    else:
        lines.append(
            training_estimate(
                config.gpu, config.nodes, recipe=config.recipe, arch=config.arch, plan=config.plan
            )
        )
        plan = config.checkpoint
        lines.append(checkpoint_note(plan.every_s, plan.training_s, plan.chosen))
    # Each start-up phase's budget and its source (docs/cost.md, Start-up); a drill pulls a few
    # MB, onto roots that load lazily.
    lines += startup_lines(
        config.gpu,
        config.nodes,
        startup_phases(
            config.gpu,
            config.nodes,
            pulls_data=config.benchmark in (None, "data") and not config.drill,
            init_rate=None if config.drill else init_rate(config.nodes),
        ),
    )
    # A drill's replacement runs beside the node it replaces until that one is gone.
    quota_nodes = config.nodes + 1 if config.drill else config.nodes
    lines += [
        quota_note(config.gpu, quota_nodes, config.market),
        zone_note(config.gpu, config.region, config.placement.preferred_zone or None),
    ]
    if config.capacity_reservation:
        lines.append(capacity_note(config))
    if not config.drill or config.drill.preprocess:
        lines.append(preprocess_estimate(config.preprocess, config.data_volume_gib))
    if config.ami:
        lines.append(f"TrainStack boots your AMI {config.ami}; ImageStack is not needed")
    else:
        lines.append(bake_estimate(config.image_test))
        if config.image_jit:
            lines.append(jit_estimate(config.image_jit))
    lines.append(controller_estimate())
    lines.append(mail_note(config.notify_email, config.budget_email))
    return [*lines, f"prices: {PRICES_AS_OF} list prices"]


def main() -> int:
    try:
        app, config, _ = build()
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    for line in estimates(config):
        print(line, file=sys.stderr)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
