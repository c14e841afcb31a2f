"""The node.json every instance's user-data writes is one bootstrap/ accepts, key for key.

stacks/ and bootstrap/ never import each other, so this is where their contract is checked:
bootstrap's own validator runs as a process on each synthesized document.
"""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, fleet_nodes, node_document, replacement_template

# Deploy-time tokens (bucket name, volume id, logical ids) become plausible literals.
TOKEN_VALUES = {"volume_id": "vol-0123456789abcdef0"}


def bootstrap_reads(document: dict, key: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "node.json"
    literal = {k: TOKEN_VALUES.get(k, v) for k, v in document.items()}
    path.write_text(json.dumps(literal).replace("<token>", "x"))
    return subprocess.run(
        [sys.executable, "-m", "bootstrap.node_config", "--node-json", str(path), key],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def instances(template) -> list[dict]:
    return list(template.find_resources("AWS::EC2::Instance").values())


def nodes(template) -> list[dict]:
    return list(fleet_nodes(template).values())


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("nodes", "3"),
        ("gpus_per_node", "8"),
        ("efa", "true"),
        # p4d's per-type network settings from stacks/instance_types.py reach the node.
        ("gpudirect", "true"),
        ("allreduce_floor_gbps", "15.0"),
    ],
)
def test_every_train_node_document_is_valid_for_bootstrap(synth, tmp_path, key, expected):
    # The default type (stacks/instance_types.py DEFAULT_FLEET_TYPE), named: test_train_stack.py's
    # P4D, one synthesis for both files.
    nodes = instances(synth(instanceType="p4d.24xlarge", nodes=3)["TrainStack"])
    assert len(nodes) == 4  # and the head, whose node.json has no index (below)
    indexes = set()
    for node in nodes:
        document = node_document(node)
        result = bootstrap_reads(document, key, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == expected
        indexes.add(bootstrap_reads(document, "node_index", tmp_path).stdout.strip())
    assert indexes == {"0", "1", "2", ""}


def test_the_replacement_template_document_is_valid_for_bootstrap_without_an_index(
    default, tmp_path
):
    """A replacement node's node.json names no index (it reads its launch assignment) and no
    signal: bootstrap accepts it as it is."""
    _, template = replacement_template(default["TrainStack"])
    data = template["Properties"]["LaunchTemplateData"]
    document = node_document({"Properties": {"UserData": data["UserData"]}})
    assert "node_index" not in document
    for key, expected in (("node_index", ""), ("signal", ""), ("nodes", "8")):
        result = bootstrap_reads(document, key, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == expected


def test_preprocess_node_document_is_valid_for_bootstrap(default, tmp_path):
    [instance] = instances(default["PreprocessStack"])
    result = bootstrap_reads(node_document(instance), "output_prefix", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "tfrecords/"


def test_bootstrap_rejects_a_document_missing_a_key(default, tmp_path):
    """Proves the check above can fail: the same document without `nodes` is refused."""
    [node, *_] = nodes(default["TrainStack"])
    document = node_document(node)
    del document["nodes"]
    result = bootstrap_reads(document, "nodes", tmp_path)
    assert result.returncode == 2
    assert "nodes" in result.stderr and "Traceback" not in result.stderr
