"""-c drill=true in the templates: TrainStack's FIS experiment templates are the plan of
contract/drill.py, aimed at this run only, played by a role that may do nothing else, started by
the head alone; the CLI prints the plan and its cost; nothing of it without a drill."""

import json

import pytest
from aws_cdk import App, Environment, Stack
from aws_cdk.assertions import Template
from conftest import fleet_nodes, head_instance, node_document, replacement_template, statements
from test_app import cfn_lint
from test_config import DEFAULTS, config

from contract import drill
from stacks.composition import compose
from stacks.config import FleetConfig
from stacks.train.drill import DrillExperiments, DrillTargets

DRILL_TAG = "horovod-fleet-drill-"
RUN_TAG = {"horovod-fleet:stack": {"Ref": "AWS::StackId"}}


@pytest.fixture(scope="module")
def drill_app(synth):
    """A drill's templates, synthesized in process (as test_drill_executors.py's): the slow
    tests below prove that `npx cdk synth -c drill=true` makes them, cdk-nag and all."""
    return synth(drill="true")


@pytest.fixture(scope="module")
def train(drill_app):
    return drill_app["TrainStack"].to_json()["Resources"]


def experiment_templates(resources: dict) -> dict[str, dict]:
    """TrainStack's FIS experiment templates by experiment name (their Name tag)."""
    found = {}
    for resource in resources.values():
        if resource["Type"] == "AWS::FIS::ExperimentTemplate":
            name = resource["Properties"]["Tags"]["Name"].removeprefix(DRILL_TAG)
            found[name] = resource["Properties"]
    return found


def test_the_templates_are_the_plan_s_experiments_and_nothing_else(train):
    """Fails when an experiment of the list has no template, or a template is not in the list."""
    templates = experiment_templates(train)
    plan = drill.plan("on-demand")
    assert sorted(templates) == sorted(e.name for e in plan)
    for experiment in plan:
        actions = templates[experiment.name]["Actions"]
        assert {name: a["ActionId"] for name, a in actions.items()} == {
            a.name: a.action_id for a in experiment.actions
        }
        for action in experiment.actions:
            given = actions[action.name].get("Parameters", {})
            assert sorted(given) == sorted(key for key, _ in action.parameters)


def test_the_templates_play_at_least_five_distinct_fis_actions(train):
    ids = {
        a["ActionId"] for t in experiment_templates(train).values() for a in t["Actions"].values()
    }
    assert len(ids) >= 5, ids
    assert ids <= set(drill.ACTIONS)


def test_every_target_is_this_run_s_by_its_tags_or_an_arn_with_a_selection_mode(train):
    for name, template in experiment_templates(train).items():
        for target_name, target in template["Targets"].items():
            assert target["SelectionMode"] in ("ALL", "COUNT(1)"), (name, target_name)
            tags, arns = target.get("ResourceTags"), target.get("ResourceArns")
            assert (tags is None) != (arns is None), (name, target_name)
            if tags is not None:
                assert tags.items() >= RUN_TAG.items()
                own = {k: v for k, v in tags.items() if k not in RUN_TAG}
                assert own in ({"horovod-fleet:role": "train"}, {"horovod-fleet:node": "head"})
                assert target["SelectionMode"] == "COUNT(1)"
                assert target["Filters"] == [{"Path": "State.Name", "Values": ["running"]}]
            else:
                assert len(arns) == 1 and "*" not in json.dumps(arns), (name, arns)
        for action in template["Actions"].values():
            [(key, target_name)] = action["Targets"].items()
            kind = drill.TARGETS[target_name]
            assert (template["Targets"][target_name]["ResourceType"], key) == kind


def test_the_output_names_each_experiment_s_template_in_the_plan_s_order(drill_app):
    output = drill_app["TrainStack"].to_json()["Outputs"][drill.TEMPLATES_OUTPUT_KEY]
    parts = output["Value"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else f'"{p["Ref"]}"' for p in parts)
    text = text.replace('""', '"')
    named = json.loads(text)
    assert list(named) == [e.name for e in drill.plan("on-demand")]
    fis = {k for k, r in drill_app["TrainStack"].to_json()["Resources"].items()
           if r["Type"] == "AWS::FIS::ExperimentTemplate"}  # fmt: skip
    assert set(named.values()) == fis


def test_the_arn_targets_are_the_fleet_s_subnet_and_the_run_controller_s_role(train):
    templates = experiment_templates(train)
    cut = templates["s3-cut"]["Targets"][drill.FLEET_SUBNET]["ResourceArns"][0]
    assert ":subnet/" in json.dumps(cut) and "NetworkVpcFleetSubnet" in json.dumps(cut)
    role = templates["controller-throttled"]["Targets"][drill.CONTROLLER_ROLE]["ResourceArns"]
    assert "RunControllerStepsRole" in role[0]["Fn::ImportValue"]


def test_an_experiment_stops_on_the_controller_s_alarm_and_fails_without_targets(train):
    for template in experiment_templates(train).values():
        [stop] = template["StopConditions"]
        assert stop["Source"] == "aws:cloudwatch:alarm"
        assert "RunControllerTickErrorsAlarm" in stop["Value"]["Fn::ImportValue"]
        assert template["ExperimentOptions"] == {"EmptyTargetResolutionMode": "fail"}


def test_the_capacity_error_is_in_the_fleet_s_deployed_zone(train):
    action = experiment_templates(train)["head-terminated"]["Actions"]["no-capacity"]
    zone = action["Parameters"]["availabilityZoneIdentifiers"]
    assert zone == {"Fn::GetAtt": ["Zone", "Zone"]}


def fis_role_statements(resources: dict) -> list[dict]:
    [role] = [k for k, r in resources.items() if r["Type"] == "AWS::IAM::Role" and "Fis" in k]
    return [
        s
        for r in resources.values()
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role} in r["Properties"]["Roles"]
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_fis_role_has_no_wildcard_action_and_only_the_plan_s(train):
    granted = fis_role_statements(train)
    actions = {
        a for s in granted for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert not [a for a in actions if "*" in a]
    assert all(s["Effect"] == "Allow" for s in granted)
    assert {"ec2:TerminateInstances", "ec2:StopInstances", "fis:InjectApiThrottleError",
            "ec2:InjectApiError", "ec2:ReplaceNetworkAclAssociation"} <= actions  # fmt: skip
    assert "ec2:SendSpotInstanceInterruptions" not in actions  # not played on demand
    assert "ec2:StartInstances" not in actions  # the stopped node stays stopped


def test_the_fis_role_acts_on_this_run_s_instances_by_tag_and_on_the_controller_only(train):
    for statement in fis_role_statements(train):
        action = statement["Action"]
        if action in ("ec2:TerminateInstances", "ec2:StopInstances"):
            tags = statement["Condition"]["StringEquals"]
            assert tags["aws:ResourceTag/horovod-fleet:stack"] == {"Ref": "AWS::StackId"}
        if action == "ec2:InjectApiError":
            condition = statement["Condition"]
            assert condition["StringEquals"] == {"ec2:FisActionId": drill.INSUFFICIENT_CAPACITY}
            [role] = condition["ForAllValues:ArnLike"]["ec2:FisTargetArns"]
            assert "RunControllerStepsRole" in role["Fn::ImportValue"]
        if action == "fis:InjectApiThrottleError":
            condition = statement["Condition"]
            assert condition["StringEquals"] == {"fis:Service": "ec2"}
            assert condition["ForAllValues:StringEquals"]["fis:Operations"] == (
                drill.CONTROLLER_EC2_CALLS.split(",")
            )


def test_fis_assumes_its_role_only_for_this_account_s_experiments(train):
    [role] = [r for k, r in train.items() if r["Type"] == "AWS::IAM::Role" and "Fis" in k]
    [trust] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "fis.amazonaws.com"}
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert ":experiment/*" in json.dumps(trust["Condition"]["ArnLike"]["aws:SourceArn"])


def test_the_head_alone_may_start_the_drill_s_templates(drill_app, train):
    template = drill_app["TrainStack"]
    _, head = head_instance(template)
    nodes = fleet_nodes(template)
    assert (
        head["Properties"]["IamInstanceProfile"]
        != next(iter(nodes.values()))["Properties"]["IamInstanceProfile"]
    )
    started = [
        s for s in statements(template, "DrillHeadPolicy") if s["Action"] == "fis:StartExperiment"
    ]
    [start] = started
    refs = {
        part["Ref"]
        for resource in start["Resource"]
        for part in resource["Fn::Join"][1]
        if isinstance(part, dict) and "Ref" in part and part["Ref"] != "AWS::AccountId"
    }
    fis_ids = {k for k, r in train.items() if r["Type"] == "AWS::FIS::ExperimentTemplate"}
    assert refs == fis_ids
    assert any(":experiment/*" in json.dumps(r) for r in start["Resource"])
    fleet = json.dumps(statements(template, "FleetPolicy"))
    assert '"fis:' not in fleet, "the nodes' role may start no experiment"


def test_a_training_node_carries_the_role_tag_and_the_head_does_not(drill_app):
    template = drill_app["TrainStack"]
    for node in fleet_nodes(template).values():
        assert {"Key": "horovod-fleet:role", "Value": "train"} in node["Properties"]["Tags"]
    _, head = head_instance(template)
    assert "horovod-fleet:role" not in json.dumps(head["Properties"]["Tags"])
    _, replacement = replacement_template(template)
    specs = replacement["Properties"]["LaunchTemplateData"]["TagSpecifications"]
    [instance] = [s for s in specs if s["ResourceType"] == "instance"]
    assert {"Key": "horovod-fleet:role", "Value": "train"} in instance["Tags"]


def test_the_head_s_node_json_carries_the_plan_in_order(drill_app):
    _, head = head_instance(drill_app["TrainStack"])
    document = node_document(head)
    plan = document["drill"]
    experiments = drill.plan("on-demand")
    assert plan["start_after_epoch"] == drill.START_AFTER_EPOCH
    assert plan["max_epochs"] == document["trainer"]["epochs"]
    assert [e["name"] for e in plan["experiments"]] == [e.name for e in experiments]
    for given, experiment in zip(plan["experiments"], experiments, strict=True):
        assert given["action_ids"] == list(experiment.action_ids)
        assert given["observe"] == list(experiment.observe)
        assert given["within_s"] == experiment.within_s
        assert given["template_id"] == "<token>"  # a Ref of its template, resolved at deploy
    assert document["instance_type"] == "g4dn.xlarge" and document["nodes"] == 3
    assert document["min_nodes"] == 2 and document["dataset_prefix"] == "drill/tfrecords/"


def test_the_drill_s_fleet_is_not_a_p_family_type(train):
    types = {
        r["Properties"]["InstanceType"] for r in train.values() if r["Type"] == "AWS::EC2::Instance"
    }
    assert not [t for t in types if t.startswith("p")], types


def test_the_drill_converts_its_own_dataset_under_its_own_prefixes(drill_app):
    [preprocess] = [
        r
        for r in drill_app["PreprocessStack"].to_json()["Resources"].values()
        if r["Type"] == "AWS::EC2::Instance"
    ]
    document = node_document(preprocess)
    data = drill.DATASET
    assert (document["raw_prefix"], document["output_prefix"]) == (
        data.raw_prefix,
        data.tfrecords_prefix,
    )
    assert (document["train_shards"], document["val_shards"]) == (
        data.train_shards,
        data.val_shards,
    )
    check = drill_app["TrainStack"].find_resources("Custom::HorovodFleetDataset")
    [dataset] = check.values()
    assert dataset["Properties"]["Key"] == f"{data.tfrecords_prefix}manifest.json"


def test_without_a_drill_nothing_of_it_is_synthesized(default):
    train = default["TrainStack"].to_json()
    text = json.dumps(train)
    assert "AWS::FIS::" not in text and "horovod-fleet:role" not in text and '"fis:' not in text
    _, head = head_instance(default["TrainStack"])
    assert "drill" not in node_document(head)
    teardown = json.dumps(default["TeardownStack"].to_json().get("Outputs", {}))
    assert "TickErrorsAlarm" not in teardown and "StepsRole" not in teardown


def deployed(template: dict) -> dict:
    """The template without resource metadata and the CDK's own CDKMetadata resource."""
    resources = {
        logical_id: {key: value for key, value in resource.items() if key != "Metadata"}
        for logical_id, resource in template["Resources"].items()
        if logical_id != "CDKMetadata"
    }
    conditions = {k: v for k, v in template.get("Conditions", {}).items()
                  if k != "CDKMetadataAvailable"}  # fmt: skip
    return {**template, "Resources": resources, "Conditions": conditions}


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_cdk_synth_of_a_drill_prints_its_plan_and_a_cost_within_the_budget(drill_cli, drill_app):
    result, outdir, templates = drill_cli
    assert result.returncode == 0, result.stdout + result.stderr
    # The templates the default tier's tests read are the CLI's, but for the metadata the CLI
    # (construct paths, asset paths, its CDKMetadata resource) and app.py's aspects (checkov's
    # reasons, stacks/nag.py) add.
    assert {name: deployed(t.to_json()) for name, t in templates.items()} == {
        name: deployed(t.to_json()) for name, t in drill_app.items()
    }
    printed = result.stderr
    assert "AwsSolutions" not in printed + result.stdout
    for experiment in drill.plan("on-demand"):
        assert f". {experiment.name} [{', '.join(experiment.action_ids)}," in printed
    [estimate] = [line for line in printed.splitlines() if line.startswith("Drill estimate:")]
    usd = float(estimate.split("cost ~$")[1].split(" ")[0])
    assert 0 < usd <= 3.0, estimate
    assert "'Running On-Demand G and VT instances' (L-DB2E81BA)" in printed
    assert "aws service-quotas get-service-quota" in printed
    assert len(list(outdir.glob("*.template.json"))) == 5


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_cfn_lint_finds_no_errors_in_the_drill_s_templates(drill_cli):
    _, outdir, _ = drill_cli
    findings = cfn_lint(sorted(outdir.glob("*.template.json")))
    assert not [f for f in findings if f["Level"] == "Error"], findings


def drill_templates(**overrides) -> dict:
    """DrillExperiments alone in a stack, for the configuration `overrides` make."""
    stack = Stack(App(), "TrainStack", env=Environment(region="us-east-1"))
    targets = DrillTargets(
        fleet_tag=stack.stack_id, vpc_id="vpc-0123abcd", subnet_id="subnet-0123abcd",
        zone="us-east-1a", controller_role_arn="arn:aws:iam::123456789012:role/controller",
        stop_alarm_arn="arn:aws:cloudwatch:us-east-1:123456789012:alarm:ticks",
    )  # fmt: skip
    plan = config(drill="true", **overrides).drill
    DrillExperiments(stack, "Drill", plan=plan, targets=targets)
    return Template.from_stack(stack).to_json()["Resources"]


def test_a_spot_drill_sends_the_notice_to_one_of_its_spot_nodes():
    resources = drill_templates(market="spot")
    notice = experiment_templates(resources)["spot-notice"]
    target = notice["Targets"][drill.SPOT_NODE]
    assert target["ResourceType"] == "aws:ec2:spot-instance"
    assert target["ResourceTags"] == {**RUN_TAG, "horovod-fleet:role": "train"}
    assert target["SelectionMode"] == "COUNT(1)"
    [spot] = [s for s in fis_role_statements(resources)
              if s["Action"] == "ec2:SendSpotInstanceInterruptions"]  # fmt: skip
    assert spot["Condition"]["StringEquals"]["aws:ResourceTag/horovod-fleet:role"] == "train"


def test_fis_may_do_nothing_for_an_experiment_the_drill_does_not_play():
    resources = drill_templates(drillExperiments="s3-cut")
    assert sorted(experiment_templates(resources)) == ["s3-cut"]
    granted = json.dumps(fis_role_statements(resources))
    assert "ec2:ReplaceNetworkAclAssociation" in granted
    for action in ("Terminate", "Stop", "InjectApi", "Spot"):
        assert action not in granted, action


def test_a_drill_converted_off_aws_has_no_preprocess_stack():
    app = App(context={**DEFAULTS, "drill": "true", "drillPreprocess": "false"})
    stacks = compose(app, FleetConfig.from_context(app.node.get_all_context()))
    assert stacks.preprocess is None
    assert "PreprocessStack" not in [c.node.id for c in app.node.children]


def test_the_head_launched_again_has_the_drill_s_head_role(drill_app):
    """issue 47's head template: the head the controller launches again may start the drill's
    experiments too (the last one judged is the head's own loss)."""
    template = drill_app["TrainStack"]
    _, head = head_instance(template)
    [again] = [
        r for k, r in template.find_resources("AWS::EC2::LaunchTemplate").items()
        if k.startswith("HeadReplacement")
    ]  # fmt: skip
    profile = again["Properties"]["LaunchTemplateData"]["IamInstanceProfile"]["Arn"]
    assert profile == {"Fn::GetAtt": [head["Properties"]["IamInstanceProfile"]["Ref"], "Arn"]}
    assert "drill" in node_document_of_template(again)


def node_document_of_template(template: dict) -> dict:
    return node_document(
        {"Properties": {"UserData": template["Properties"]["LaunchTemplateData"]["UserData"]}}
    )
