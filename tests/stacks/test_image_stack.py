"""ImageStack: the training AMI baked by EC2 Image Builder in two stages (CPU build, GPU proof),
versions that follow the content of what each stage runs, and the wiring to TrainStack."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from aws_cdk.assertions import Template
from conftest import resources, statements
from synthesis import synthesize
from test_app import copy_sources, run_app

import stacks.image.training_image as image_module
from app import default_context, estimates
from stacks.config import ConfigError, FleetConfig
from stacks.image.recipe import (
    BUILD_INSTANCE_TYPE,
    PROOF_DIR,
    RECIPE,
    RECIPE_DIR,
    TRAINER_DIR,
    UBUNTU_PARENT,
    read_pins,
    semantic_version,
    tree_sha256,
)
from stacks.image.stack import IMAGE_PARAMETER
from stacks.train import run_record

COMPONENTS = [f"horovod-fleet-{step.script}" for step in RECIPE]


def of_type(template, kind: str) -> dict[str, dict]:
    return template.find_resources(kind)


def text(value) -> str:
    """A template string with each token as a placeholder (asset URLs are Fn::Sub/Join)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(text(part) for part in value["Fn::Join"][1])
    if isinstance(value, dict) and "Fn::Sub" in value:
        return value["Fn::Sub"]
    return "<token>"


def components(template) -> dict[str, dict]:
    """Component name -> its properties."""
    found = of_type(template, "AWS::ImageBuilder::Component").values()
    return {c["Properties"]["Name"]: c["Properties"] for c in found}


@pytest.fixture(scope="module")
def image(default):
    return default["ImageStack"]


def test_every_image_builder_resource_of_the_two_stage_bake(image):
    counts = {
        kind: len(of_type(image, f"AWS::ImageBuilder::{kind}"))
        for kind in (
            "Component",
            "ImageRecipe",
            "InfrastructureConfiguration",
            "DistributionConfiguration",
            "Image",
            "LifecyclePolicy",
        )
    }
    assert counts == {
        "Component": len(RECIPE) + 1,
        "ImageRecipe": 2,
        "InfrastructureConfiguration": 2,
        "DistributionConfiguration": 2,
        "Image": 2,
        "LifecyclePolicy": 1,
    }


def test_each_component_is_an_awstoe_document_with_build_validate_and_test(image):
    found = components(image)
    assert set(found) == {*COMPONENTS, "horovod-fleet-gpu-proof"}
    for name, props in found.items():
        document = yaml.safe_load(text(props["Data"]))
        assert document["name"] == name
        assert document["schemaVersion"] == 1.0
        phases = {phase["name"]: phase["steps"] for phase in document["phases"]}
        assert list(phases) == ["build", "validate", "test"], name
        build = phases["build"]
        assert [s["action"] for s in build[:3]] == ["S3Download", "ExecuteBash", "ExecuteBash"]
        for source in build[0]["inputs"]:
            assert source["source"].startswith("s3://cdk-")
        assert build[2]["timeoutSeconds"] >= 600
        for phase in phases.values():
            for step in phase:
                assert step["action"] in {"S3Download", "ExecuteBash", "Reboot"}
        assert props["Platform"] == "Linux"


def test_recipe_steps_run_in_order_with_a_reboot_after_the_upgrade(image):
    found = components(image)
    for step in RECIPE:
        document = yaml.safe_load(text(found[f"horovod-fleet-{step.script}"]["Data"]))
        phases = {phase["name"]: phase["steps"] for phase in document["phases"]}
        run = phases["build"][2]["inputs"]["commands"]
        assert run == [f"bash /opt/horovod-fleet/src/bootstrap/image/{step.script}.sh run"]
        assert phases["validate"][0]["inputs"]["commands"][0].endswith(f"{step.script}.sh validate")
        assert phases["test"][0]["inputs"]["commands"][0].endswith(f"{step.script}.sh validate")
        assert (phases["build"][-1]["action"] == "Reboot") == step.reboot_after
    [base] = [
        r["Properties"]
        for r in of_type(image, "AWS::ImageBuilder::ImageRecipe").values()
        if r["Properties"]["Name"] == "horovod-fleet-training-base"
    ]
    ids = [c["ComponentArn"]["Fn::GetAtt"][0] for c in base["Components"]]
    names = [image.to_json()["Resources"][i]["Properties"]["Name"] for i in ids]
    assert names == COMPONENTS
    assert base["ParentImage"] == UBUNTU_PARENT
    [root] = base["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True


def test_the_proof_stage_starts_from_the_base_image_on_the_gpu_type(image):
    recipes = {
        r["Properties"]["Name"]: r["Properties"]
        for r in of_type(image, "AWS::ImageBuilder::ImageRecipe").values()
    }
    [base_image_id] = [
        logical_id
        for logical_id, r in of_type(image, "AWS::ImageBuilder::Image").items()
        if "Base" in logical_id
    ]
    proven = recipes["horovod-fleet-training"]
    assert proven["ParentImage"] == {"Fn::GetAtt": [base_image_id, "ImageId"]}
    [proof] = proven["Components"]
    document = yaml.safe_load(text(components(image)["horovod-fleet-gpu-proof"]["Data"]))
    phases = {phase["name"]: phase["steps"] for phase in document["phases"]}
    assert phases["build"][2]["inputs"]["commands"] == [
        "bash /opt/horovod-fleet/src/bootstrap/image_proof/gpu_proof.sh run 1 g5.xlarge no-efa"
    ]
    assert phases["test"][0]["inputs"]["commands"][0].endswith("gpu_proof.sh tag")
    targets = [source["destination"] for source in phases["build"][0]["inputs"]]
    assert targets == ["/tmp/image_proof.zip", "/tmp/trainer.zip"]
    assert proof


def infrastructure_types(template) -> dict[str, list[str]]:
    return {
        r["Properties"]["Name"]: r["Properties"]["InstanceTypes"]
        for r in of_type(template, "AWS::ImageBuilder::InfrastructureConfiguration").values()
    }


def test_build_on_cpu_prove_on_the_gpu_test_type(image, synth):
    assert infrastructure_types(image) == {
        "horovod-fleet-training-base": [BUILD_INSTANCE_TYPE],
        "horovod-fleet-training": ["g5.xlarge"],
    }
    other = synth(imageTestInstanceType="g5.12xlarge")["ImageStack"]
    assert infrastructure_types(other)["horovod-fleet-training"] == ["g5.12xlarge"]
    proof = yaml.safe_load(text(components(other)["horovod-fleet-gpu-proof"]["Data"]))
    assert proof["phases"][0]["steps"][2]["inputs"]["commands"][0].endswith(
        "gpu_proof.sh run 4 g5.12xlarge efa"
    )
    p4d = synth(imageTestInstanceType="p4d.24xlarge")["ImageStack"]
    proof = yaml.safe_load(text(components(p4d)["horovod-fleet-gpu-proof"]["Data"]))
    assert proof["phases"][0]["steps"][2]["inputs"]["commands"][0].endswith(
        "gpu_proof.sh run 8 p4d.24xlarge efa"
    )
    for retired in ("p3.2xlarge", "p3.8xlarge", "p3dn.24xlarge"):
        with pytest.raises(ConfigError, match=f"{retired}.*AWS retired P3"):
            synth(imageTestInstanceType=retired)


def test_instances_terminate_on_failure_use_imdsv2_and_no_ingress(image):
    for config in of_type(image, "AWS::ImageBuilder::InfrastructureConfiguration").values():
        props = config["Properties"]
        assert props["TerminateInstanceOnFailure"] is True
        assert props["InstanceMetadataOptions"]["HttpTokens"] == "required"
        assert props["SubnetId"] and props["SecurityGroupIds"]
    for group in of_type(image, "AWS::EC2::SecurityGroup").values():
        assert "SecurityGroupIngress" not in group["Properties"]


def test_images_are_tested_kept_for_the_lifecycle_and_fail_the_deploy(image):
    for logical_id, resource in of_type(image, "AWS::ImageBuilder::Image").items():
        props = resource["Properties"]
        assert props["ImageTestsConfiguration"]["ImageTestsEnabled"] is True, logical_id
        assert props["EnhancedImageMetadataEnabled"] is False
        assert resource["DeletionPolicy"] == resource["UpdateReplacePolicy"] == "Retain"
        [log_group] = [d for d in resource["DependsOn"] if "Logs" in d]
        name = image.to_json()["Resources"][log_group]["Properties"]["LogGroupName"]
        assert name.startswith("/aws/imagebuilder/horovod-fleet-training")


def test_build_role_has_image_builder_ssm_and_only_its_assets(image):
    [role] = [
        r["Properties"]
        for logical_id, r in of_type(image, "AWS::IAM::Role").items()
        if "BakeRole" in logical_id
    ]
    managed = sorted(json.dumps(arn) for arn in role["ManagedPolicyArns"])
    assert len(managed) == 2
    assert any("EC2InstanceProfileForImageBuilder" in arn for arn in managed)
    assert any("AmazonSSMManagedInstanceCore" in arn for arn in managed)
    found = statements(image, "TrainingImageBakePolicy")
    by_action = {json.dumps(s["Action"]): s for s in found}
    assert set(by_action) == {'"s3:GetObject"', '"ec2:CreateTags"'}
    objects = resources(by_action['"s3:GetObject"'])
    assert len(objects) == 3 and all(o.endswith(".zip") for o in objects), objects
    tags = by_action['"ec2:CreateTags"']
    assert tags["Condition"] == {"StringEquals": {"aws:ResourceTag/Project": "horovod-fleet"}}
    [image_arn] = resources(tags)
    assert image_arn.endswith(":image/*")


def test_the_ami_id_goes_to_an_ssm_parameter_and_an_output(image):
    [parameter] = of_type(image, "AWS::SSM::Parameter").values()
    props = parameter["Properties"]
    assert props["Name"] == IMAGE_PARAMETER
    assert props["DataType"] == "aws:ec2:image"
    [proven] = [i for i in of_type(image, "AWS::ImageBuilder::Image") if "Proven" in i]
    assert props["Value"] == {"Fn::GetAtt": [proven, "ImageId"]}


def test_lifecycle_keeps_the_newest_two_of_both_images_with_their_snapshots(image):
    [policy] = of_type(image, "AWS::ImageBuilder::LifecyclePolicy").values()
    props = policy["Properties"]
    [detail] = props["PolicyDetails"]
    assert detail["Filter"] == {"Type": "COUNT", "Value": 2}
    assert detail["Action"] == {
        "Type": "DELETE",
        "IncludeResources": {"Amis": True, "Snapshots": True},
    }
    assert props["ResourceType"] == "AMI_IMAGE"
    assert sorted(r["Name"] for r in props["ResourceSelection"]["Recipes"]) == [
        "horovod-fleet-training",
        "horovod-fleet-training-base",
    ]


def ami_tag_sets(image) -> list[dict]:
    """The tags of the recipes (on the AMI from the build stage on) and of the distributions."""
    found = [
        r["Properties"]["AmiTags"]
        for r in of_type(image, "AWS::ImageBuilder::ImageRecipe").values()
    ]
    for distribution in of_type(image, "AWS::ImageBuilder::DistributionConfiguration").values():
        [target] = distribution["Properties"]["Distributions"]
        found.append(target["AmiDistributionConfiguration"]["AmiTags"])
    return found


def test_ami_tags_carry_the_pins_and_the_recipe_hash(image):
    tag_sets = ami_tag_sets(image)
    assert len(tag_sets) == 4
    for tags in tag_sets:
        assert tags["Project"] == "horovod-fleet"
        assert tags["horovod-fleet:recipe-sha256"] == tree_sha256(RECIPE_DIR)
        assert tags["horovod-fleet:nvidia-driver"] == "580-server"
        assert (tags["horovod-fleet:tensorflow"], tags["horovod-fleet:horovod"]) == (
            "2.15.1",
            "0.28.1",
        )


def versions(template) -> dict[str, str]:
    found = {name: props["Version"] for name, props in components(template).items()}
    for recipe in of_type(template, "AWS::ImageBuilder::ImageRecipe").values():
        found[recipe["Properties"]["Name"]] = recipe["Properties"]["Version"]
    return found


def test_versions_follow_the_content_hash(image):
    found = versions(image)
    base = semantic_version(tree_sha256(RECIPE_DIR))
    assert {found[name] for name in COMPONENTS} == {base}
    assert found["horovod-fleet-training-base"] == base
    assert found["horovod-fleet-gpu-proof"] == found["horovod-fleet-training"] != base


def test_image_revision_bakes_again_from_unchanged_files(image, synth):
    before, after = versions(image), versions(synth(imageRevision=1)["ImageStack"])
    assert all(after[name] != before[name] for name in before), (before, after)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Copies of the three directories the bake runs, for editing."""
    root = tmp_path_factory.mktemp("sources")
    for directory in (RECIPE_DIR, PROOF_DIR, TRAINER_DIR):
        shutil.copytree(
            directory, root / directory.name, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def synth_with(monkeypatch, tmp_path: Path, sources: Path, **edits: str) -> dict[str, str]:
    """Versions of an ImageStack built from copies of the sources, with `edits` (directory name
    -> text appended to a file in it) applied first."""
    for name, directory in (
        ("image", RECIPE_DIR),
        ("image_proof", PROOF_DIR),
        ("trainer", TRAINER_DIR),
    ):
        copy = tmp_path / name
        shutil.copytree(sources / directory.name, copy)
        monkeypatch.setattr(
            image_module,
            {"image": "RECIPE_DIR", "image_proof": "PROOF_DIR", "trainer": "TRAINER_DIR"}[name],
            copy,
        )
        if name in edits:
            target = (
                copy
                / {
                    "image": "02-nvidia-driver.sh",
                    "image_proof": "proof.py",
                    "trainer": "model.py",
                }[name]
            )
            target.write_text(target.read_text() + edits[name])
    return versions(Template.from_json(synthesize(tmp_path / "out", {})["ImageStack"]))


@pytest.mark.parametrize(
    ("edit", "base_changes", "proof_changes"),
    [
        ({}, False, False),
        ({"image": "\n# a recipe change\n"}, True, True),
        ({"image_proof": "\n# a proof change\n"}, False, True),
        ({"trainer": "\n# a trainer change\n"}, False, True),
    ],
)
def test_a_new_version_exactly_when_what_a_stage_runs_changes(
    monkeypatch, tmp_path, sources, default, edit, base_changes, proof_changes
):
    before = versions(default["ImageStack"])
    after = synth_with(monkeypatch, tmp_path, sources, **edit)
    for name in [*COMPONENTS, "horovod-fleet-training-base"]:
        assert (after[name] != before[name]) == base_changes, name
    for name in ("horovod-fleet-gpu-proof", "horovod-fleet-training"):
        assert (after[name] != before[name]) == proof_changes, name


@pytest.mark.slow
def test_a_bootstrap_change_outside_the_recipe_rebakes_nothing(tmp_path, default):
    # The node scripts reach nodes as their own asset at boot; the image must not follow them.
    source = copy_sources(tmp_path / "source")
    node_script = source / "bootstrap" / "train_node.sh"
    node_script.write_text(node_script.read_text() + "# a node change\n")
    outdir = tmp_path / "out"
    outdir.mkdir()
    result = run_app(outdir, cwd=source)
    assert result.returncode == 0, result.stderr
    changed = Template.from_json(json.loads((outdir / "ImageStack.template.json").read_text()))
    assert versions(changed) == versions(default["ImageStack"])
    trains = [
        json.loads((outdir / "TrainStack.template.json").read_text()),
        default["TrainStack"].to_json(),
    ]
    user_data = [
        sorted(
            json.dumps(r["Properties"]["UserData"])
            for r in t["Resources"].values()
            if r["Type"] == "AWS::EC2::Instance"
        )
        for t in trains
    ]
    assert user_data[0] != user_data[1], "the node change must reach the nodes' code asset"


def test_the_base_is_canonicals_ubuntu_24_04_on_gp3_the_pins_release():
    assert UBUNTU_PARENT == (
        "ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
    )
    assert f"/server/{read_pins()['UBUNTU_RELEASE']}/" in UBUNTU_PARENT


# ------------------------------------------------------------------ the optional JIT proof stage

JIT_NAME = "horovod-fleet-training-jit"


@pytest.fixture(scope="module")
def jit(synth):
    return synth(imageJitInstanceType="p5.4xlarge")


def test_without_the_jit_key_the_bake_has_two_stages(image):
    assert "horovod-fleet-gpu-jit-cache" not in components(image)
    assert set(infrastructure_types(image)) == {
        "horovod-fleet-training-base",
        "horovod-fleet-training",
    }


def test_the_jit_proof_is_a_third_stage_on_the_proven_image_on_its_type(jit):
    image = jit["ImageStack"]
    resources = image.to_json()["Resources"]
    assert infrastructure_types(image)[JIT_NAME] == ["p5.4xlarge"]
    recipes = {
        r["Properties"]["Name"]: r["Properties"]
        for r in of_type(image, "AWS::ImageBuilder::ImageRecipe").values()
    }
    [proven] = [i for i in of_type(image, "AWS::ImageBuilder::Image") if "Proven" in i]
    [jit_image] = [i for i in of_type(image, "AWS::ImageBuilder::Image") if "Jit" in i]
    assert recipes[JIT_NAME]["ParentImage"] == {"Fn::GetAtt": [proven, "ImageId"]}
    [component] = recipes[JIT_NAME]["Components"]
    name = resources[component["ComponentArn"]["Fn::GetAtt"][0]]["Properties"]["Name"]
    assert name == "horovod-fleet-gpu-jit-cache"
    document = yaml.safe_load(text(components(image)[name]["Data"]))
    phases = {phase["name"]: phase["steps"] for phase in document["phases"]}
    assert phases["build"][2]["inputs"]["commands"] == [
        "bash /opt/horovod-fleet/src/bootstrap/image_proof/gpu_proof.sh jit 1 p5.4xlarge"
    ]
    assert phases["validate"][0]["inputs"]["commands"][0].endswith("gpu_proof.sh jit-validate")
    assert phases["test"][0]["inputs"]["commands"][0].endswith("gpu_proof.sh tag")
    # The fleet's AMI is the third stage's; the lifecycle keeps its newest two as well.
    [parameter] = of_type(image, "AWS::SSM::Parameter").values()
    assert parameter["Properties"]["Value"] == {"Fn::GetAtt": [jit_image, "ImageId"]}
    [policy] = of_type(image, "AWS::ImageBuilder::LifecyclePolicy").values()
    selected = policy["Properties"]["ResourceSelection"]["Recipes"]
    assert sorted(r["Name"] for r in selected) == sorted(
        ["horovod-fleet-training", "horovod-fleet-training-base", JIT_NAME]
    )


def test_the_jit_key_adds_only_its_stage(default, jit):
    # Without the key the templates are the two-stage bake's; with it, ImageStack gains the
    # stage's six resources, its SSM parameter, output and lifecycle name the third image, and
    # TrainStack reads that image: nothing else of any stack changes.
    for name in ("DatasetStack", "TeardownStack", "PreprocessStack"):
        assert jit[name].to_json() == default[name].to_json(), name
    before = default["ImageStack"].to_json()["Resources"]
    after = jit["ImageStack"].to_json()["Resources"]
    added = sorted(set(after) - set(before))
    assert len(added) == 6 and all(logical_id.startswith("TrainingImage") for logical_id in added)
    assert all("Jit" in logical_id or "jit" in logical_id for logical_id in added), added
    changed = sorted(k for k in before if before[k] != after[k])
    assert [c.rstrip("0123456789ABCDEF") for c in changed] == [
        "AmiParameter",
        "TrainingImageLifecycle",
    ]
    # TrainStack's image check expects the JIT stage's image, which ImageStack's ImageVersion
    # output names (stacks/train/image_check.py).
    proven = default["ImageStack"].to_json()["Outputs"]["ImageVersion"]["Value"]
    jitted = jit["ImageStack"].to_json()["Outputs"]["ImageVersion"]["Value"]
    assert jitted.startswith(f"{JIT_NAME}/") and proven != jitted
    train = json.loads(json.dumps(jit["TrainStack"].to_json()).replace(jitted, proven))
    # ... and its run record holds every context value, this key's too (run_record.py).
    [record] = [r for r in train["Resources"].values() if r["Type"] == run_record.RUN_RECORD_TYPE]
    context = json.loads(record["Properties"]["Context"])
    assert context.pop("imageJitInstanceType") == "p5.4xlarge"
    record["Properties"]["Context"] = run_record.text(context | {"imageJitInstanceType": None})
    assert train == default["TrainStack"].to_json()


def test_synthesis_prints_the_jit_proofs_cost_only_with_the_key():
    config = FleetConfig.from_context(default_context() | {"imageJitInstanceType": "p5.4xlarge"})
    lines = estimates(config)
    [line] = [line for line in lines if "JIT proof" in line]
    assert line == (
        "ImageStack JIT proof (-c imageJitInstanceType=p5.4xlarge): each bake adds about 1.5 h "
        "and ~$8.60 (1.25 h p5.4xlarge, 1 x H100 80 GB, at $6.88/h: a cold and two warm starts "
        "of ResNet-50; an estimate)"
    )
    assert not [
        line
        for line in estimates(FleetConfig.from_context(default_context()))
        if "JIT proof" in line
    ]
