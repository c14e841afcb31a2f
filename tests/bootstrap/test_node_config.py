"""node.json validation: good documents parse, bad ones fail with one line naming the key.

.venv/bin/python -m pytest tests/bootstrap/test_node_config.py
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bootstrap_helpers import BUCKET, train_doc

from bootstrap.node_config import (
    TRAINER_ARCHS,
    TRAINER_RECIPES,
    ConfigError,
    PreprocessConfig,
    TrainConfig,
    parse,
)

PREPROCESS = {
    "role": "preprocess",
    "region": "us-east-1",
    "bucket": BUCKET,
    "log_group": "/horovod-fleet/preprocess",
    "project": "horovod-fleet",
    "signal": {"stack": "PreprocessStack", "resource": "Instance"},
    "raw_prefix": "raw/",
    "output_prefix": "tfrecords/",
    "volume_id": "vol-0123",
    "mount_point": "/data",
    "download_secret_arn": None,
    "train_shards": 1024,
    "val_shards": 128,
    "stop_when_done": True,
}


def test_preprocess_document_parses_with_instance_defaults():
    cfg = parse(PREPROCESS)
    assert isinstance(cfg, PreprocessConfig)
    assert cfg.signal.resource == "Instance"
    assert (cfg.install, cfg.log_dir, cfg.ip) == (True, "/var/log/horovod-fleet", None)


def test_train_document_parses_and_maps_trainer_flags():
    cfg = parse(train_doc(trainer={"epochs": 90, "batch_per_gpu": 256, "arch": "resnet50",
                                   "image_size": 224, "base_lr": 0.1, "synthetic": True,
                                   "eval_only": False}))  # fmt: skip
    assert isinstance(cfg, TrainConfig)
    assert not cfg.is_head and cfg.node_name == "0" and cfg.slots == 8
    assert cfg.trainer_flags() == [
        "--epochs", "90", "--batch-size", "256", "--arch", "resnet50", "--image-size", "224",
        "--base-lr", "0.1", "--synthetic",
    ]  # fmt: skip
    assert (cfg.ssh_port, cfg.instance_store) == (22, True)


def test_market_is_on_demand_unless_node_json_says_spot():
    cfg = parse(train_doc())
    assert (cfg.market, cfg.spot_notice_file) == ("on-demand", None)
    cfg = parse(train_doc(market="spot", spot_notice_file="/tmp/notice.json"))
    assert (cfg.market, cfg.spot_notice_file) == ("spot", "/tmp/notice.json")


def test_cpu_node_runs_one_rank():
    assert parse(train_doc(gpus_per_node=0)).slots == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nodes": 0}, "key 'nodes' must be >= 1, got 0"),
        ({"nodes": "2"}, "key 'nodes' must be int, got '2'"),
        ({"nodes": True}, "key 'nodes' must be int, got True"),
        ({"node_index": 2}, "key 'node_index' must be < nodes (2), got 2"),
        ({"role": "worker"}, "key 'role' must be 'preprocess' or 'train'"),
        ({"runs_prefix": "runs/other/"}, "key 'runs_prefix' must be 'runs/r1/'"),
        ({"dataset_prefix": "tfrecords"}, "key 'dataset_prefix' must look like 'name/'"),
        ({"efa": "yes"}, "key 'efa' must be bool"),
        ({"bucket": ""}, "key 'bucket' must not be empty"),
        ({"signal": {"stack": "TrainStack"}}, "missing key 'signal.resource'"),
        ({"signal": {}}, "missing key 'signal.stack'"),
        ({"signal": {"stack": "", "resource": "N"}}, "key 'signal.stack' must not be empty"),
        ({"trainer": {"epochs": 1}}, "missing key 'trainer.batch_per_gpu'"),
        ({"metrics": {"dimension": {"Run": "r1"}}}, "missing key 'metrics.namespace'"),
        ({"metrics": {"namespace": "HorovodFleet"}}, "key 'metrics.dimension'"),
        ({"rendezvous_timeout_s": -5}, "key 'rendezvous_timeout_s' must be >= 1"),
        ({"rendezvous_timeout_s": float("inf")}, "key 'rendezvous_timeout_s' must be a finite"),
        ({"poll_interval_s": float("nan")}, "key 'poll_interval_s' must be a finite number"),
        ({"poll_interval_s": float("inf")}, "key 'poll_interval_s' must be a finite number"),
        ({"poll_interval_s": 0}, "key 'poll_interval_s' must be >= 0.1, got 0"),
        ({"poll_interval_s": -1}, "key 'poll_interval_s' must be >= 0.1, got -1"),
        ({"ssh_port": 70000}, "key 'ssh_port' must be <= 65535, got 70000"),
        ({"ssh_port": 0}, "key 'ssh_port' must be >= 1, got 0"),
        ({"bucket": "Bad Bucket!"}, "key 'bucket' must be an S3 bucket name: 3-63 lowercase"),
        ({"bucket": "ab"}, "key 'bucket' must be an S3 bucket name"),
        ({"bucket": "a" * 64}, "key 'bucket' must be an S3 bucket name"),
        ({"bucket": "fleet-data-"}, "key 'bucket' must be an S3 bucket name"),
        ({"region": "mars-1"}, "key 'region' must be an AWS region like 'us-east-1', got 'mars-1'"),
        ({"region": "US-EAST-1"}, "key 'region' must be an AWS region"),
        ({"region": "us-east"}, "key 'region' must be an AWS region"),
        ({"market": "spot "}, "key 'market' must be 'on-demand' or 'spot', got 'spot '"),
        ({"market": None}, "key 'market' must be str, got None"),
    ],
)
def test_bad_values_name_the_key(change, message):
    with pytest.raises(ConfigError) as failure:
        parse(train_doc(**change))
    assert message in str(failure.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epochs": -5}, "key 'trainer.epochs' must be >= 1, got -5"),
        ({"epochs": "90"}, "key 'trainer.epochs' must be int, got '90'"),
        ({"batch_per_gpu": 0}, "key 'trainer.batch_per_gpu' must be >= 1, got 0"),
        ({"image_size": 16}, "key 'trainer.image_size' must be >= 32, got 16"),
        ({"arch": "vgg"}, "key 'trainer.arch' must be 'resnet50' or 'resnet18', got 'vgg'"),
    ],
)
def test_bad_trainer_values_name_the_nested_key(change, message):
    trainer = {"epochs": 2, "batch_per_gpu": 256, "arch": "resnet50", "image_size": 224}
    with pytest.raises(ConfigError) as failure:
        parse(train_doc(trainer={**trainer, **change}))
    assert message in str(failure.value)


@pytest.mark.parametrize(
    "change",
    [
        {"region": "us-gov-west-1"},
        {"region": "ap-southeast-2"},
        {"bucket": "abc"},
        {"bucket": "horovod-fleet.123456789012-" + "x" * 36},
        {"ssh_port": 65535},
        {"poll_interval_s": 0.1},
        {"trainer": {"epochs": 1, "batch_per_gpu": 1, "arch": "resnet18", "image_size": 32}},
    ],
)
def test_edge_values_are_accepted(change):
    parse(train_doc(**change))


def test_trainer_archs_mirror_the_trainer():
    from trainer.config import ARCHS  # only the test may import trainer/: bootstrap mirrors it

    assert TRAINER_ARCHS == ARCHS


def test_trainer_recipes_mirror_the_trainer_and_epochs_may_be_the_recipe_s(tmp_path):
    from trainer.recipes import RECIPES

    assert TRAINER_RECIPES == RECIPES
    doc = train_doc()
    doc["trainer"].update(recipe="fast", epochs=None)
    cfg = parse(doc)
    flags = cfg.trainer_flags()
    assert flags[flags.index("--recipe") + 1] == "fast" and "--epochs" not in flags
    doc["trainer"]["recipe"] = "mlperf"
    with pytest.raises(ConfigError, match=r"trainer\.recipe"):
        parse(doc)


def test_missing_key_is_named():
    doc = train_doc()
    del doc["gpus_per_node"]
    with pytest.raises(ConfigError, match="missing key 'gpus_per_node'"):
        parse(doc)


def test_cli_prints_one_value_and_one_error_line(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(train_doc(instance_store=False)))
    run = [sys.executable, "-m", "bootstrap.node_config", "--node-json", str(path)]
    assert (
        subprocess.run([*run, "instance_store"], capture_output=True, text=True).stdout == "false\n"
    )
    assert (
        subprocess.run([*run, "network_interface"], capture_output=True, text=True).stdout == "\n"
    )
    path.write_text(json.dumps(train_doc(nodes=-1)))
    bad = subprocess.run([*run, "nodes"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr == "error: node.json: key 'nodes' must be >= 1, got -1\n"
    path.write_text("{not json")
    assert "is not JSON" in subprocess.run([*run, "nodes"], capture_output=True, text=True).stderr


def test_cli_reports_a_binary_file_in_one_line(tmp_path):
    path = tmp_path / "node.json"
    path.write_bytes(b"\x1f\x8b\x08\x00 gzip, not JSON")
    run = [sys.executable, "-m", "bootstrap.node_config", "--node-json", str(path), "nodes"]
    bad = subprocess.run(run, capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr == f"error: node.json: {path} is not UTF-8 text (byte 0x8b at offset 1)\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: key"),
        (["--node-json"], "argument --node-json: expected one argument"),
        (["nodes", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_cli_usage_mistake_is_one_line(argv, message):
    bad = subprocess.run(
        [sys.executable, "-m", "bootstrap.node_config", *argv], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert bad.stderr == f"error: {message} (see --help)\n"
    assert bad.stdout == ""


def head_doc(**overrides) -> dict:
    doc = train_doc(role="head", **overrides)
    del doc["node_index"]
    return doc


def test_the_heads_document_parses_with_the_elastic_settings():
    cfg = parse(head_doc(nodes=8, min_nodes=6, reset_limit=40, elastic_timeout_s=90))
    assert cfg.is_head and cfg.node_name == "head" and cfg.node_index is None
    assert (cfg.min_nodes, cfg.reset_limit, cfg.elastic_timeout_s) == (6, 40, 90)
    defaults = parse(head_doc(nodes=3))
    assert (defaults.min_nodes, defaults.reset_limit, defaults.elastic_timeout_s) == (2, None, 120)
    assert parse(head_doc(nodes=1)).min_nodes == 1


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (train_doc(role="head"), "key 'node_index' must be absent for the head"),
        (head_doc(nodes=3, min_nodes=4), "key 'min_nodes' must be <= 3, got 4"),
        (head_doc(min_nodes=0), "key 'min_nodes' must be >= 1, got 0"),
        (head_doc(reset_limit=0), "key 'reset_limit' must be >= 1, got 0"),
        (train_doc(role="worker"), "key 'role' must be 'preprocess' or 'train' or 'head'"),
    ],
)
def test_a_bad_head_document_is_one_line_naming_the_key(doc, message):
    with pytest.raises(ConfigError) as raised:
        parse(doc)
    assert message in str(raised.value)


@pytest.mark.parametrize(("nodes", "expected"), [(1, 1), (2, 1), (3, 2), (8, 7)])
def test_min_nodes_has_one_default_on_both_sides(nodes, expected):
    """contract/fleet.py default_min_nodes, as the configuration and the node's reading of a
    node.json without min_nodes take it."""
    from contract.fleet import default_min_nodes
    from stacks.config import FleetConfig

    context = json.loads((Path(__file__).parents[2] / "cdk.json").read_text())["context"]
    assert default_min_nodes(nodes) == expected
    assert FleetConfig.from_context({**context, "nodes": str(nodes)}).min_nodes == expected
    doc = {k: v for k, v in train_doc(nodes=nodes).items() if k != "min_nodes"}
    assert parse(doc).min_nodes == expected
