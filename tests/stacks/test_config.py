"""FleetConfig.from_context: defaults, CLI strings, and one clear error per bad value."""

import json
import re

import pytest
from conftest import ROOT

from stacks.config import KEYS, ConfigError, FleetConfig
from stacks.config_values import is_zone_id
from stacks.instance_types import GPU_TYPES, fleet_estimate, quota_note

DEFAULTS = {k: v for k, v in json.loads((ROOT / "cdk.json").read_text())["context"].items()}


def config(**overrides) -> FleetConfig:
    return FleetConfig.from_context({**DEFAULTS, **overrides})


def test_every_key_has_a_default_in_cdk_json():
    assert set(KEYS) <= set(DEFAULTS)


def readme_configuration_table() -> dict[str, str]:
    """The README's table of keys: {key: its default cell}."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("| key | default | meaning |") + 2
    table = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        keys, default = line.strip("|").split("|")[:2]
        for key in re.findall(r"`(\w+)`", keys):
            table[key] = default.strip()
    return table


def test_the_readme_lists_every_key_with_cdk_json_s_default():
    """A key added to the app, or a default changed in cdk.json, fails here until the README
    says so: each key's cell starts with its default (a derived one with what the configuration
    makes of it), and a key without one says "-" or how it is settled."""
    table = readme_configuration_table()
    app_keys = {k for k in DEFAULTS if re.fullmatch(r"[a-z][A-Za-z0-9]*", k)}
    assert set(KEYS) == app_keys
    assert set(table) == app_keys, (
        f"the README lacks {sorted(app_keys - set(table))}, lists {sorted(set(table) - app_keys)}"
    )
    settled = config()
    wrong = []
    for key, cell in table.items():
        value = DEFAULTS[key]
        if value is None:
            value = getattr(settled, re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower(), None)
            if not isinstance(value, int | float) or isinstance(value, bool):
                if cell != "-" and re.match(r"[-\d.]+\b|true\b|false\b", cell):
                    wrong.append(f"{key}: README {cell!r}, cdk.json null")
                continue
        shown = (
            json.dumps(value)
            if isinstance(value, bool)
            else f"{value:g}"
            if isinstance(value, float)
            else str(value)
        )
        if cell.split(" ")[0] != shown:
            wrong.append(f"{key}: README {cell!r}, cdk.json {shown}")
    assert not wrong, "; ".join(wrong)


def test_defaults():
    c = config()
    assert (c.nodes, c.gpu.name, c.gpu.gpus, c.gpu.efa) == (8, "p4d.24xlarge", 8, True)
    assert (c.region, c.placement.az, c.max_hours, c.data_volume_gib) == (
        "us-east-1",
        "us-east-1a",
        4,
        1000,
    )
    assert c.preprocess.name == "t2.large"
    assert c.budget_email is None and c.snapshot_data_volume is False and c.placement.vpc_id is None
    assert c.runs_prefix == "runs/resnet50-1/"


def test_command_line_strings_are_parsed():
    c = config(nodes="2", maxHours="2.5", snapshotDataVolume="true", budgetEmail="a@b.io")
    assert (c.nodes, c.max_hours, c.snapshot_data_volume, c.budget_email) == (
        2,
        2.5,
        True,
        "a@b.io",
    )


def test_imported_network_needs_both_ids():
    c = config(vpcId="vpc-0123abcd", subnetId="subnet-0123abcd", az="us-east-1a")
    assert (c.placement.vpc_id, c.placement.subnet_id) == ("vpc-0123abcd", "subnet-0123abcd")
    with pytest.raises(ConfigError, match="vpcId and subnetId"):
        config(vpcId="vpc-0123abcd")


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("nodes", 0, "an integer from 1 to 64"),
        ("nodes", -1, "an integer from 1 to 64"),
        ("nodes", "abc", "an integer from 1 to 64"),
        ("nodes", 2.5, "an integer from 1 to 64"),
        ("nodes", "2.5", "an integer from 1 to 64"),
        ("nodes", 100000, "an integer from 1 to 64"),
        ("nodes", True, "an integer from 1 to 64"),
        ("instanceType", "p9.huge", "a known GPU instance type"),
        ("instanceType", "c5.large", "c5.large has no GPU"),
        ("dataVolumeGiB", 100, "an integer from 500 to 16384"),
        ("az", "us-west-2a", "a zone of region us-east-1 (us-east-1a to us-east-1f)"),
        ("az", "us-east-1g", "a zone of region us-east-1 (us-east-1a to us-east-1f)"),
        ("az", "usw2-az1", "or its zone ID (use1-az1 to use1-az6)"),
        ("targetTop1", "75.9", "a top-1 accuracy in (0, 1], like 0.759"),
        ("targetTop1", 0, "a top-1 accuracy in (0, 1], like 0.759"),
        ("targetTop1", "nan", "a top-1 accuracy in (0, 1], like 0.759"),
        ("maxHours", "nan", "a number of hours from 1 to 168"),
        ("maxHours", 0, "a number of hours from 1 to 168"),
        ("budgetEmail", "not-an-address", "an e-mail address"),
        ("snapshotDataVolume", "yes", "true or false"),
        ("run", "Bad_Name", "lowercase letters"),
        ("datasetPrefix", "/abs/", "ending in '/'"),
        ("ami", "ubuntu", "an AMI id"),
        ("ami", "ami-", "an AMI id like ami-0abc1234"),
        ("imageTestInstanceType", "t3.large", "t3.large has no GPU"),
        ("imageRevision", -1, "an integer from 0 to 100000"),
        (
            "downloadSecretArn",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:imagenet",
            "ending in the 6 random characters",
        ),
        ("preprocessInstanceType", "g5.xlarge", "a t2/t3 instance type"),
        ("arch", "vgg16", "resnet50 or resnet18"),
        ("node", 8, "did you mean nodes?"),
    ],
)
def test_bad_value_names_key_value_and_what_is_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as error:
        config(**{key: value})
    message = str(error.value)
    assert "\n" not in message
    assert f"{key}={value!r}" in message
    assert allowed in message


def test_budget_covers_the_capped_fleet_and_a_day_of_preprocessing():
    from stacks.composition import budget_limit_usd

    # (8 x 21.958 + the head's 0.17) x 4 h = 703.34; t2.large flat out for 24 h =
    # (0.0928 + 0.07) x 24 = 3.91
    assert budget_limit_usd(config()) == 708
    assert budget_limit_usd(config(nodes=1, maxHours=1)) == 27


def test_estimate_line():
    line = fleet_estimate(GPU_TYPES["p4d.24xlarge"], 8, 4)
    assert line == (
        "TrainStack: 8 x p4d.24xlarge at $21.958/h + head c6i.xlarge at $0.17/h = $175.83/h; "
        "capped at 4 h -> at most $703.34"
    )


def test_quota_note_counts_the_fleet_vcpus():
    assert "768 vCPUs" in quota_note(GPU_TYPES["p4d.24xlarge"], 8)
    assert "(L-417A185B)" in quota_note(GPU_TYPES["p4d.24xlarge"], 8)
    assert "(L-DB2E81BA)" in quota_note(GPU_TYPES["g5.xlarge"], 1)


def test_instance_table_is_consistent():
    for gpu in GPU_TYPES.values():
        assert gpu.gpus in (1, 4, 8) and gpu.vcpus >= 4 * gpu.gpus and gpu.usd_per_hour > 0
        assert gpu.name[0] in "pg"


def test_every_zone_of_a_known_region_is_accepted_and_others_by_shape():
    assert config(az="us-east-1f").placement.az == "us-east-1f"
    assert config(region="us-west-2", az="us-west-2d").placement.az == "us-west-2d"
    assert config(region="eu-north-1", az="eu-north-1c").placement.az == "eu-north-1c"
    with pytest.raises(ConfigError, match="us-west-2a to us-west-2d"):
        config(region="us-west-2", az="us-west-2e")


# The zone IDs of the regions ZONE_LETTERS knows: one per letter, named for the region
# (https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html).
@pytest.mark.parametrize(
    ("region", "az"),
    [
        ("us-east-1", "use1-az4"),
        ("us-east-1", "use1-az1"),
        ("us-east-1", "use1-az6"),
        ("us-east-2", "use2-az3"),
        ("us-west-2", "usw2-az4"),
        ("eu-north-1", "eun1-az2"),  # a region outside the tables: by shape
    ],
)
def test_a_zone_id_of_the_region_is_accepted_as_given(region, az):
    c = config(region=region, az=az)
    assert (c.region, c.placement.az) == (region, az)
    assert is_zone_id(c.placement.az)
    assert not is_zone_id("us-east-1d")


@pytest.mark.parametrize(
    ("region", "az", "allowed"),
    [
        (
            "us-west-2",
            "use1-az4",
            "a zone of region us-west-2 (us-west-2a to us-west-2d) or its zone ID "
            "(usw2-az1 to usw2-az4)",
        ),
        (
            "us-west-2",
            "usw2-az9",
            "a zone of region us-west-2 (us-west-2a to us-west-2d) or its zone ID "
            "(usw2-az1 to usw2-az4)",
        ),
        (
            "us-east-1",
            "use1-az7",
            "a zone of region us-east-1 (us-east-1a to us-east-1f) or its zone ID "
            "(use1-az1 to use1-az6)",
        ),
        (
            "us-east-1",
            "use1-az0",
            "a zone of region us-east-1 (us-east-1a to us-east-1f) or its zone ID "
            "(use1-az1 to use1-az6)",
        ),
        (
            "us-east-2",
            "use2-az4",
            "a zone of region us-east-2 (us-east-2a to us-east-2c) or its zone ID "
            "(use2-az1 to use2-az3)",
        ),
        (
            "eu-north-1",
            "use1-az2",
            "a zone of region eu-north-1, like eu-north-1a, or its zone ID "
            "(<region prefix>-az<number>, as use1-az4 is in us-east-1)",
        ),
    ],
)
def test_a_zone_id_of_another_region_is_refused_in_one_line(region, az, allowed):
    with pytest.raises(ConfigError) as error:
        config(region=region, az=az)
    assert str(error.value) == f"error: context key az={az!r} is invalid; allowed: {allowed}"


def test_the_image_builds_nccl_and_horovod_for_every_gpu_of_the_table():
    pins = (ROOT / "bootstrap/image/pins.env").read_text()
    [archs] = [line for line in pins.splitlines() if line.startswith("CUDA_ARCHITECTURES=")]
    built = {int(a) for a in archs.split("=", 1)[1].strip('"').split()}
    assert built == {gpu.compute_capability for gpu in GPU_TYPES.values()}


def test_a_target_top1_reaches_the_trainer_as_a_flag():
    assert config().trainer["target_top1"] is None
    assert config(targetTop1="0.759").trainer["target_top1"] == 0.759


def test_the_recipe_sets_the_per_gpu_batch_unless_given():
    assert config().batch_per_gpu == 256 and config().recipe == "goyal"
    fast = config(recipe="fast")
    # 8 p4d nodes x 8 GPUs x 128 = 8,192: MLPerf's quickest logged batch to 75.9% among 8k-16k.
    assert (fast.batch_per_gpu, fast.trainer["recipe"], fast.trainer["epochs"]) == (
        128,
        "fast",
        None,
    )
    assert config(recipe="fast", batchPerGpu=200).batch_per_gpu == 200
    with pytest.raises(ConfigError) as refused:
        config(recipe="mlperf")
    assert str(refused.value) == (
        "error: context key recipe='mlperf' is invalid; allowed: goyal or fast"
    )


def test_the_jit_proof_runs_only_on_h100_and_h200_types_and_only_with_the_baked_image():
    assert config().image_jit is None
    assert config(imageJitInstanceType="p5.4xlarge").image_jit.gpus == 1
    assert config(imageJitInstanceType="p5en.48xlarge").image_jit.gpu_model == "H200 141 GB"
    with pytest.raises(ConfigError) as error:
        config(imageJitInstanceType="g5.xlarge")
    assert str(error.value) == (
        "error: context key imageJitInstanceType='g5.xlarge' is invalid; allowed: empty (no JIT "
        "proof) or a type whose GPUs TensorFlow 2.15.1 JIT-compiles for (H100, H200: compute "
        "capability 9.0): p5.4xlarge, p5.48xlarge, p5en.48xlarge"
    )
    with pytest.raises(ConfigError, match="empty with ami: the JIT proof is a stage of the image"):
        config(imageJitInstanceType="p5.4xlarge", ami="ami-0abc1234")
