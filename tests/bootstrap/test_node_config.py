"""node.json validation: good documents parse, bad ones fail with one line naming the key.

.venv/bin/python -m pytest tests/bootstrap/test_node_config.py
"""

import json
import subprocess
import sys

import pytest
from bootstrap_helpers import train_doc

from bootstrap.node_config import ConfigError, PreprocessConfig, TrainConfig, parse

PREPROCESS = {
    "role": "preprocess",
    "region": "us-east-1",
    "bucket": "b",
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
    assert cfg.is_leader and cfg.slots == 8
    assert cfg.trainer_flags() == [
        "--epochs", "90", "--batch-size", "256", "--arch", "resnet50", "--image-size", "224",
        "--base-lr", "0.1", "--synthetic",
    ]  # fmt: skip
    assert (cfg.ssh_port, cfg.instance_store) == (22, True)


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
        ({"signal": {"stack": "TrainStack"}}, "missing key 'resource'"),
        ({"trainer": {"epochs": 1}}, "missing key 'batch_per_gpu'"),
        ({"metrics": {"namespace": "HorovodFleet"}}, "key 'metrics.dimension'"),
        ({"rendezvous_timeout_s": -5}, "key 'rendezvous_timeout_s' must be >= 1"),
    ],
)
def test_bad_values_name_the_key(change, message):
    with pytest.raises(ConfigError) as failure:
        parse(train_doc(**change))
    assert message in str(failure.value)


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
