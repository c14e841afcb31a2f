"""Benchmark mode (-c benchmark=...): the value, the cap, the cost line, node.json and outputs."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, fleet_nodes, head_instance, node_document

from stacks.benchmark import (
    PER_SIZE_S,
    TEARDOWN_S,
    Size,
    benchmark_estimate,
    boot_s,
    expected_seconds,
    schedule,
)
from stacks.config import ConfigError, FleetConfig
from stacks.instance_types import GPU_TYPES, HEAD_TYPE

DEFAULTS = json.loads((ROOT / "cdk.json").read_text())["context"]


def config(**overrides) -> FleetConfig:
    return FleetConfig.from_context({**DEFAULTS, **overrides})


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (False, None),
        ("false", None),
        (True, "synthetic"),
        ("true", "synthetic"),
        ("synthetic", "synthetic"),
        ("data", "data"),
        ("DATA", "data"),
    ],
)
def test_benchmark_values(value, mode):
    assert config(benchmark=value).benchmark == mode


@pytest.mark.parametrize("value", ["yes", "1", "", "real", 3])
def test_other_benchmark_values_name_the_allowed_ones(value):
    with pytest.raises(ConfigError) as error:
        config(benchmark=value)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(f"error: context key benchmark={value!r} is invalid; allowed: false, ")
    assert "true" in text and "synthetic" in text and "data" in text


def test_the_cap_is_one_hour_in_benchmark_mode_and_four_otherwise():
    assert config().max_hours == 4
    assert config(benchmark="true").max_hours == 1
    assert config(benchmark="data").max_hours == 1
    # An explicit cap wins in either mode.
    assert config(benchmark="true", maxHours="2").max_hours == 2
    assert config(maxHours=6).max_hours == 6


@pytest.mark.parametrize("nodes", range(1, 65))
@pytest.mark.parametrize("gpu", ["p4d.24xlarge", "g5.xlarge", "g5.12xlarge"])
def test_the_schedule_never_asks_for_more_than_the_fleet(nodes, gpu):
    per_node = GPU_TYPES[gpu].gpus
    sizes = schedule(nodes, per_node)
    assert sizes[0] == Size(1, 1)
    assert sizes[-1] == Size(nodes, nodes * per_node)
    assert all(s.nodes <= nodes and s.ranks == s.nodes * per_node for s in sizes[1:])
    assert len(set(sizes)) == len(sizes)
    assert [s.ranks for s in sizes] == sorted(s.ranks for s in sizes)


def test_the_schedule_doubles_nodes():
    assert schedule(8, 8) == [Size(1, 1), Size(1, 8), Size(2, 16), Size(4, 32), Size(8, 64)]
    assert schedule(6, 8)[-2:] == [Size(4, 32), Size(6, 48)]
    assert schedule(1, 1) == [Size(1, 1)]


def test_the_cost_line_is_expected_duration_times_the_fleet_price():
    c = config(benchmark="true", nodes=8)
    seconds = expected_seconds("synthetic", c.gpu, 8)
    assert seconds == boot_s("synthetic", c.gpu, 8) + 5 * PER_SIZE_S + TEARDOWN_S
    line = benchmark_estimate("synthetic", c.gpu, 8, c.max_hours)
    hourly = 8 * GPU_TYPES["p4d.24xlarge"].usd_per_hour + HEAD_TYPE.usd_per_hour
    assert f"~${hourly * seconds / 3600:,.2f}" in line
    assert f"capped at 1 h -> at most ${hourly:,.2f}" in line
    assert "1 GPU, 8 GPUs, 16 GPUs, 32 GPUs, 64 GPUs" in line
    # Real data adds the pull to every node's NVMe.
    assert expected_seconds("data", c.gpu, 8) > seconds


def test_synthesis_prints_the_benchmark_cost():
    """What app.py prints before it synthesizes (the CLI's own print: tests/stacks/test_app.py)."""
    import app as fleet_app

    context = {**fleet_app.default_context(), "benchmark": "true", "nodes": 2}
    lines = fleet_app.estimates(FleetConfig.from_context(context))
    [line] = [x for x in lines if x.startswith("Benchmark (")]
    assert "1 GPU, 8 GPUs, 16 GPUs" in line and "capped at 1 h" in line
    assert any("capped at 1 h -> at most $44.09" in x for x in lines)  # the TrainStack line too


def nodes_of(template) -> list[dict]:
    return list(fleet_nodes(template).values())


def test_the_benchmark_plan_reaches_node_json(synth):
    """Every node's and the head's: the head runs the schedule, the nodes its ranks."""
    template = synth(nodes=2, benchmark="data")["TrainStack"]
    for instance in [*nodes_of(template), head_instance(template)[1]]:
        plan = node_document(instance)["benchmark"]
        assert plan["mode"] == "data"
        assert plan["sizes"] == [
            {"nodes": 1, "ranks": 1},
            {"nodes": 1, "ranks": 8},
            {"nodes": 2, "ranks": 16},
        ]
        assert plan["warmup_steps"] > 0 and plan["timed_steps"] > 1


def test_the_command_line_prints_what_node_json_carries(synth):
    """`python -m stacks.benchmark` (docs/contracts.md): the rehearsal's benchmark gets its
    schedule there, so it must be the object the stacks write into node.json."""
    document = node_document(nodes_of(synth(nodes=2, benchmark="data")["TrainStack"])[0])
    command = [sys.executable, "-m", "stacks.benchmark", "--mode", "data", "--nodes", "2",
               "--gpus-per-node", str(document["gpus_per_node"])]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == document["benchmark"]


def test_a_training_run_has_no_benchmark(default):
    for instance in nodes_of(default["TrainStack"]):
        assert node_document(instance)["benchmark"] is None


def test_the_cap_schedule_and_outputs_of_a_benchmark(synth):
    template = synth(nodes=2, benchmark="true")["TrainStack"]
    deadlines = template.find_resources("Custom::RunDeadline") or {
        k: v
        for k, v in template.to_json()["Resources"].items()
        if v.get("Properties", {}).get("MaxHours") is not None
    }
    assert [d["Properties"]["MaxHours"] for d in deadlines.values()] == ["1.0"]
    outputs = template.to_json()["Outputs"]
    benchmark = outputs["Benchmark"]["Value"]
    text = json.dumps(benchmark)
    for name in ("benchmark.json", "benchmark.md", "benchmark.png"):
        assert name in text
    assert "Benchmark" not in synth()["TrainStack"].to_json()["Outputs"]


def test_bootstrap_accepts_the_benchmark_plan_of_every_node(synth, tmp_path):
    from test_node_json_contract import bootstrap_reads

    for instance in nodes_of(synth(nodes=2, benchmark="true")["TrainStack"]):
        result = bootstrap_reads(node_document(instance), "benchmark", tmp_path)
        assert result.returncode == 0, result.stderr
        assert "mode='synthetic'" in result.stdout
        assert "BenchmarkSize(nodes=2, ranks=16)" in result.stdout


def test_synthesis_refuses_another_benchmark_value_in_one_line():
    """What `npx cdk synth -c benchmark=yes` prints (the app prints the ConfigError, exits 2 and
    writes nothing: tests/stacks/test_app.py proves it once)."""
    with pytest.raises(ConfigError) as error:
        config(benchmark="yes")
    assert str(error.value).splitlines() == [
        "error: context key benchmark='yes' is invalid; allowed: false, true (or synthetic: "
        "generated images through the host-to-device copy) or data (the local TFRecords)"
    ]
