"""-c drill=true in the configuration: the drill's defaults, its plan, length and cost, and one
line for each bad input (stacks/drill_plan.py, stacks/config.py)."""

import pytest
from test_config import config

from contract import drill
from stacks import drill_plan
from stacks.config import ConfigError
from stacks.instance_types import GPU_TYPES, fleet_usd_per_hour

DRILL = {"drill": "true"}


def test_a_drill_s_defaults_are_a_small_cheap_fleet_on_its_own_dataset():
    c = config(**DRILL)
    assert (c.gpu.name, c.nodes, c.min_nodes, c.market) == ("g4dn.xlarge", 3, 2, "on-demand")
    assert not c.gpu.name.startswith("p")
    assert 1 <= c.max_hours <= 2
    assert c.dataset_prefix == drill.DATASET.tfrecords_prefix == "drill/tfrecords/"
    assert c.drill.preprocess is True
    assert [e.name for e in c.drill.experiments] == [e.name for e in drill.plan("on-demand")]
    # The trainer runs until the head's agreed stop: its epochs bound it only past the cap.
    assert c.trainer["epochs"] == c.drill.max_epochs >= c.max_hours * 3600
    assert c.trainer["target_top1"] is None
    steps = drill.DATASET.classes * drill.DATASET.train_per_class // (c.nodes * c.batch_per_gpu)
    assert steps >= 3, "an epoch of the drill's dataset is a few steps of the whole fleet"


def test_without_a_drill_nothing_changes():
    c = config()
    assert (c.gpu.name, c.nodes, c.min_nodes, c.max_hours) == ("p4d.24xlarge", 8, 7, 4)
    assert c.drill is None and c.dataset_prefix == "tfrecords/" and c.epochs is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"instanceType": "g5.8xlarge"},  # the EFA path, one GPU with an EFA interface
        {"instanceType": "g4dn.8xlarge", "nodes": "2", "maxHours": "3"},
        {"instanceType": "p4d.24xlarge", "drillConfirmCost": "true"},
    ],
)
def test_a_drill_takes_the_fleet_it_is_given(overrides):
    c = config(**DRILL, **overrides)
    assert c.gpu.name == overrides["instanceType"]
    assert c.nodes == int(overrides.get("nodes", drill_plan.DEFAULT_NODES))
    assert c.max_hours == float(overrides.get("maxHours", c.max_hours))


def test_the_efa_types_are_known_with_their_price():
    for name, price in (("g4dn.8xlarge", 2.176), ("g5.8xlarge", 2.448)):
        gpu = GPU_TYPES[name]
        assert (gpu.gpus, gpu.efa, gpu.usd_per_hour) == (1, True, price)


def test_chosen_experiments_play_in_the_list_s_order_and_set_the_cap():
    c = config(**DRILL, drillExperiments="s3-cut, node-terminated")
    assert [e.name for e in c.drill.experiments] == ["node-terminated", "s3-cut"]
    assert c.max_hours < config(**DRILL).max_hours
    spot = config(**DRILL, market="spot")
    assert "spot-notice" in [e.name for e in spot.drill.experiments]


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"instanceType": "p4d.24xlarge"}, "instanceType", "or drillConfirmCost=true to drill"),
        ({"instanceType": "p5.48xlarge"}, "instanceType", "a G type (empty: g4dn.xlarge)"),
        ({"drillExperiments": "melt"}, "drillExperiments", "unknown experiment 'melt': allowed"),
        ({"drillExperiments": "spot-notice"}, "drillExperiments", "spot-notice needs market=spot"),
        ({"region": "ca-west-1", "az": "ca-west-1a"}, "region", "AWS::FIS::ExperimentTemplate"),
        ({"region": "ap-southeast-3", "az": "ap-southeast-3a"}, "region", "us-east-1, us-east-2"),
        ({"epochs": "5"}, "epochs", "empty with drill=true"),
        ({"targetTop1": "0.5"}, "targetTop1", "empty with drill=true"),
        ({"benchmark": "true"}, "benchmark", "false with drill=true"),
        ({"datasetPrefix": "mine/"}, "datasetPrefix", "the drill's dataset is drill/tfrecords/"),
        ({"drill": "yes"}, "drill", "true or false"),
    ],
)
def test_a_bad_drill_is_one_line_naming_the_key_and_what_is_allowed(overrides, key, allowed):
    with pytest.raises(ConfigError) as error:
        config(**{**DRILL, **overrides})
    line = str(error.value)
    assert line.startswith(f"error: context key {key}=") and allowed in line, line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("key", "value"),
    [("drillExperiments", "s3-cut"), ("drillConfirmCost", "true"), ("drillPreprocess", "false")],
)
def test_a_drill_s_key_without_a_drill_is_refused(key, value):
    with pytest.raises(ConfigError, match=rf"^error: context key {key}='{value}' .*without drill"):
        config(**{key: value})


def test_the_drill_costs_at_most_its_budget_with_fis_and_says_what_it_adds_up_to():
    c = config(**DRILL)
    spent = drill_plan.cost(c.drill, c.gpu, c.nodes, c.preprocess, c.data_volume_gib)
    assert spent.usd <= drill_plan.BUDGET_USD
    assert spent.fis_usd == drill.fis_usd(c.drill.experiments) > 0
    assert spent.fleet_usd == pytest.approx(fleet_usd_per_hour(c.gpu, 3) * spent.seconds / 3600)
    lines = drill_plan.synthesis_lines(
        c.drill, gpu=c.gpu, nodes=c.nodes, market=c.market, max_hours=c.max_hours,
        preprocess=c.preprocess, volume_gib=c.data_volume_gib,
    )  # fmt: skip
    estimate = next(line for line in lines if line.startswith("Drill estimate:"))
    assert (
        f"~${spent.usd:.2f} at list price" in estimate and f"FIS ${spent.fis_usd:.2f}" in estimate
    )
    before = None
    for experiment in c.drill.experiments:
        [line] = [line for line in lines if f". {experiment.name} [" in line]
        assert all(a in line for a in experiment.action_ids)
        assert f"within {experiment.within_s / 60:g} min" in line
        when = f"once {before} is judged" if before else f"after epoch {drill.START_AFTER_EPOCH}"
        assert f"], {when}: {experiment.what}; then {experiment.expect};" in line
        before = experiment.name


def test_the_cap_allows_every_experiment_its_whole_bound():
    c = config(**DRILL)
    boot_s = drill_plan.fleet_startup_s(c.gpu, c.nodes)
    worst_s = boot_s + sum(e.within_s for e in c.drill.experiments)
    assert worst_s < c.max_hours * 3600
    expected = drill_plan.length_s(c.drill.experiments, boot_s)
    assert expected < worst_s


def test_a_drill_without_preprocessing_costs_no_preprocessing_node():
    c = config(**DRILL, drillPreprocess="false")
    assert c.drill.preprocess is False
    spent = drill_plan.cost(c.drill, c.gpu, c.nodes, c.preprocess, c.data_volume_gib)
    assert spent.preprocess_usd == 0


def test_the_spot_quota_of_a_g_type_is_named_with_its_code():
    from stacks.instance_types import quota_note

    line = quota_note(GPU_TYPES["g4dn.xlarge"], 4, "spot")
    assert "'All G and VT Spot Instance Requests' (L-3819A6DF)" in line
    assert "--quota-code L-3819A6DF" in line


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"nodes": "1"}, "nodes", "at least 2 with drill=true"),
        ({"minNodes": "3"}, "minNodes", "at most nodes - 1 = 2 with drill=true"),
        (
            {"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd"},
            "vpcId",
            "while it plays s3-cut: FIS cuts the whole subnet",
        ),
    ],
)
def test_a_drill_refuses_a_fleet_its_experiments_cannot_be_played_on(overrides, key, allowed):
    with pytest.raises(ConfigError) as error:
        config(**DRILL, **overrides)
    assert str(error.value).startswith(f"error: context key {key}=") and allowed in str(error.value)


def test_your_own_subnet_drills_without_the_s3_cut():
    c = config(**DRILL, vpcId="vpc-0123abcd", subnetId="subnet-0123abcd", az="us-east-1a",
               drillExperiments="node-terminated,head-terminated")  # fmt: skip
    assert [e.name for e in c.drill.experiments] == ["node-terminated", "head-terminated"]
