"""Any region (issue 50): `-c region=R` without `az` deploys in the first zone of R that offers
the type, which the deploy-time zone answer finds (DescribeInstanceTypeOfferings); an `az`
outside R, and a subnet or reservation without its zone, are refused in one line."""

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_app import offline_env
from test_deploy_answers import aws, refused, zone_request  # noqa: F401 (aws: a fixture)
from test_one_mail import ANY_REGION_MAILED

from contract.names import ZONE_TYPE
from controller import answers
from stacks.config import ConfigError, FleetConfig

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = json.loads((ROOT / "cdk.json").read_text())["context"]


def config(**overrides) -> FleetConfig:
    return FleetConfig.from_context(DEFAULTS | overrides)


def test_a_region_alone_prefers_no_zone():
    assert DEFAULTS["az"] is None
    west = config(region="us-west-2")
    assert (west.region, west.placement.az_chosen) == ("us-west-2", False)
    assert (
        west.placement.az == "us-west-2a"
    )  # where synthesis needs a name; the deploy answers the zone
    assert config(region="us-west-2", az="us-west-2c").placement.az_chosen


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ({"region": "us-west-2", "az": "us-east-1a"}, "a zone of region us-west-2"),
        ({"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd"}, "the zone of subnetId"),
        ({"capacityReservationId": "cr-0123456789abcdef0"}, "the zone of capacityReservationId"),
    ],
)
def test_a_zone_outside_the_region_or_a_fixed_zone_unnamed_is_one_line(overrides, allowed):
    with pytest.raises(ConfigError) as error:
        config(**overrides)
    message = str(error.value)
    assert message.startswith("error: context key az=") and "\n" not in message
    assert f"allowed: {allowed}" in message


def zone_answers(template) -> list[dict]:
    return [r["Properties"] for r in template.find_resources(ZONE_TYPE).values()]


def test_train_and_preprocess_stacks_ask_the_deploy_for_a_zone_that_offers_the_type(synth):
    templates = synth(**ANY_REGION_MAILED)
    [train] = zone_answers(templates["TrainStack"])
    [preprocess] = zone_answers(templates["PreprocessStack"])
    assert (train["PreferredZone"], train["Fixed"]) == ("", "false")
    assert (preprocess["InstanceType"], preprocess["PreferredZone"], preprocess["Fixed"]) == (
        "t2.large", "", "false"
    )  # fmt: skip
    # No zone's name is written where the answer's goes: every subnet and volume takes it.
    # (ImageStack has no deploy-time answer: its bake subnet is in us-west-2a.)
    text = json.dumps({n: t.to_json() for n, t in templates.items() if n != "ImageStack"})
    assert not re.findall(r"us-(?:west-2|east-1)[a-f]\b", text)


def test_no_preference_answers_the_first_offering_zone_and_an_update_keeps_its_own(aws):  # noqa: F811
    created = answers.on_event(zone_request("Create", ""))
    assert created["Data"]["Zone"] == "us-east-1a"  # moto: p4d in us-east-1a to 1d
    # A stack deployed in us-east-1c (its az then) keeps its zone when the key is dropped.
    update = zone_request(
        "Update", "", PhysicalResourceId="us-east-1c",
        OldResourceProperties=zone_request("Create", "us-east-1c")["ResourceProperties"],
    )  # fmt: skip
    assert answers.on_event(update)["Data"]["Zone"] == "us-east-1c"
    # ... unless its zone no longer offers the type: then the first that does.
    gone = zone_request(
        "Update", "", PhysicalResourceId="us-east-1e",
        OldResourceProperties=zone_request("Create", "us-east-1e")["ResourceProperties"],
    )  # fmt: skip
    assert answers.on_event(gone)["Data"]["Zone"] == "us-east-1a"
    assert refused(zone_request("Create", "", instance_type="p9.mega")).startswith(
        "p9.mega is not offered in any zone of us-east-1 for this account"
    )


@pytest.mark.slow  # a whole `npx cdk synth` of another configuration, cdk-nag included: ~1.5 min
def test_cdk_synth_of_another_region_alone_exits_0(tmp_path):
    result = subprocess.run(
        ["npx", "--no-install", "cdk", "synth", "--no-notices", "--quiet", "-o", str(tmp_path),
         "-c", "region=us-west-2"],
        cwd=ROOT, env=offline_env(tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "TrainStack takes at deploy the first zone of us-west-2 that offers p4d.24xlarge" in (
        result.stderr
    )
    zone = json.loads((tmp_path / "TrainStack.template.json").read_text())
    assert '"PreferredZone": ""' in json.dumps(zone)
