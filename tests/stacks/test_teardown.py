"""TeardownStack, RunGuard and PreprocessGuard on a small app of their own (no other stacks):
the triggers, the functions and what each role may do."""

import ast
import datetime
import fnmatch
import json
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import lint

from contract.names import IDLE_EVALUATION_PERIODS, IDLE_MINUTES, REPLACEMENTS_PER_NODE
from controller.answers import deadline
from stacks.teardown.functions import ANSWERS_CODE, CONTROLLER_CODE
from stacks.teardown.preprocess_guard import PreprocessGuard
from stacks.teardown.run_controller import TICK_CONCURRENCY, TICK_EVENT_RETRIES, TICK_RATE
from stacks.teardown.run_guard import IDLE_PERIOD, RunGuard
from stacks.teardown.stack import TeardownStack
from stacks.train.node_document import RENDEZVOUS_TIMEOUT_S, STARTUP_GRACE_S

RUN = "resnet50-r1"
MAX_HOURS = 3.5
EMAIL = "ops@example.com"
CONTROLLER = Path(__file__).parents[2] / "controller"
LAMBDA_MODULES = sorted(CONTROLLER.glob("*.py"))


def acknowledge(construct, reason: str, *rule_ids: str) -> None:
    for rule_id in rule_ids:
        cdk.Validations.of(construct).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))


def fixture_instance(scope, construct_id: str) -> ec2.CfnInstance:
    """A bare instance standing in for the other engineer's nodes; only its ref matters here."""
    instance = ec2.CfnInstance(
        scope, construct_id, image_id="ami-0123456789abcdef0", instance_type="t3.micro"
    )
    acknowledge(
        instance,
        "Test fixture: the real nodes are built and checked in the CDK-app engineer's stacks.",
        "AwsSolutions-EC26",
        "AwsSolutions-EC28",
        "AwsSolutions-EC29",
    )
    return instance


FIXTURE_BUCKET = "horovod-fleet-fixture"


def build_app(
    *,
    budget_email: str | None,
    nag: bool,
    env: cdk.Environment | None = None,
    context: dict | None = None,
    dataset_prefix: str = "tfrecords/",
) -> dict[str, cdk.Stack]:
    app = cdk.App(context=context)
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    dataset = cdk.Stack(app, "DatasetStack", env=env)
    bucket = s3.Bucket(
        dataset,
        "Bucket",
        bucket_name=FIXTURE_BUCKET,
        event_bridge_enabled=True,
        enforce_ssl=True,
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
    )
    acknowledge(bucket, "Test fixture bucket.", "AwsSolutions-S1")
    acknowledge(
        dataset,
        "CDK's own EventBridge-notification handler in the fixture's dataset stack.",
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
        "AWSLambdaBasicExecutionRole]",
        "AwsSolutions-IAM5[Resource::*]",
    )
    teardown = TeardownStack(
        app,
        "TeardownStack",
        # As in app.py: stacks find the dataset bucket by name, not through an export.
        bucket=s3.Bucket.from_bucket_name(dataset, "ByName", FIXTURE_BUCKET),
        budget_email=budget_email,
        budget_limit_usd=2000,
        dataset_prefix=dataset_prefix,
        env=env,
    )
    train = cdk.Stack(app, "TrainStack", env=env)
    nodes = [fixture_instance(train, f"Node{index}") for index in range(2)]
    guard = RunGuard(
        train,
        "Guard",
        guards=teardown.guards,
        run_name=RUN,
        max_hours=MAX_HOURS,
        max_restarts=3,
        instances=nodes,
    )
    stacks = {"DatasetStack": dataset, "TeardownStack": teardown, "TrainStack": train}
    for name, snapshot in (("PreprocessStack", True), ("PreprocessNoSnapshot", False)):
        preprocess = cdk.Stack(app, name, env=env)
        az = cdk.Fn.select(0, cdk.Fn.get_azs())
        volume = ec2.CfnVolume(
            preprocess, "Data", availability_zone=az, size=1000, volume_type="sc1", encrypted=True
        )
        PreprocessGuard(
            preprocess,
            "Guard",
            guards=teardown.guards,
            instance=fixture_instance(preprocess, "Node"),
            volume=volume,
            snapshot_volume=snapshot,
        )
        stacks[name] = preprocess
    for stack in list(stacks.values())[2:]:
        stack.add_stack_dependency(teardown)
    stacks["guard"] = guard
    return stacks


@pytest.fixture(scope="module")
def app_stacks():
    return build_app(budget_email=EMAIL, nag=False)


@pytest.fixture(scope="module")
def templates(app_stacks):
    return {
        name: Template.from_stack(stack)
        for name, stack in app_stacks.items()
        if isinstance(stack, cdk.Stack)
    }


def function(template: Template, prefix: str) -> tuple[str, dict]:
    """The Lambda function whose logical ID starts with `prefix`."""
    [found] = [
        (logical_id, resource)
        for logical_id, resource in template.find_resources("AWS::Lambda::Function").items()
        if logical_id.startswith(prefix)
    ]
    return found


def render(value) -> str:
    """A CloudFormation value as readable text: tokens become ${...} placeholders."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(render(part) for part in parts)
    if isinstance(value, dict) and "Ref" in value:
        return "${" + value["Ref"] + "}"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "${" + ".".join(value["Fn::GetAtt"]) + "}"
    if isinstance(value, dict) and "Fn::ImportValue" in value:
        return "${Import:" + render(value["Fn::ImportValue"]) + "}"
    return json.dumps(value, sort_keys=True)


def statements(template: Template) -> list[dict]:
    found = []
    for policy in template.find_resources("AWS::IAM::Policy").values():
        found += policy["Properties"]["PolicyDocument"]["Statement"]
    return found


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def statements_for(templates: dict[str, Template], action: str) -> list[dict]:
    return [
        statement
        for template in templates.values()
        for statement in statements(template)
        if action in as_list(statement["Action"])
    ]


# --- hard cap --------------------------------------------------------------------------------


def test_hard_cap_deadline_derives_from_max_hours(templates):
    train = templates["TrainStack"]
    [(deadline_id, resource)] = train.find_resources("Custom::HorovodFleetDeadline").items()
    props = resource["Properties"]
    assert props["MaxHours"] == str(MAX_HOURS)
    assert props["Run"] == RUN
    assert "AnswersProvider" in render(props["ServiceToken"])
    [schedule] = train.find_resources("AWS::Scheduler::Schedule").values()
    schedule_props = schedule["Properties"]
    assert schedule_props["ScheduleExpression"] == {
        "Fn::GetAtt": [deadline_id, "ScheduleExpression"]
    }
    assert schedule_props["ScheduleExpressionTimezone"] == "UTC"
    assert schedule_props["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert json.loads(schedule_props["Target"]["Input"]) == {"trigger": "hard-cap", "run": RUN}
    assert "RunControllerTick" in render(schedule_props["Target"]["Arn"])
    # The tick reads the cap's time from this schedule while TrainStack has no outputs.
    assert schedule_props["Name"] == f"horovod-fleet-cap-{RUN}"
    # What the deploy-time answers give for exactly these properties: deploy time + MAX_HOURS.
    deployed = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)
    answer = deadline(deployed, float(props["MaxHours"]), deployed)
    assert answer["ScheduleExpression"] == "at(2026-01-01T15:30:00)"


def test_deadline_is_computed_before_any_node_launches(templates):
    train = templates["TrainStack"]
    [deadline_id] = train.find_resources("Custom::HorovodFleetDeadline")
    nodes = train.find_resources("AWS::EC2::Instance")
    assert len(nodes) == 2
    for node in nodes.values():
        assert deadline_id in node["DependsOn"]


def test_run_guard_exposes_the_cap_for_the_cost_estimate(app_stacks):
    guard = app_stacks["guard"]
    assert guard.max_hours == MAX_HOURS


def test_run_guard_rejects_a_non_positive_cap():
    app = cdk.App()
    stack = cdk.Stack(app, "TrainStack")
    tick = cdk.aws_lambda.Function.from_function_arn(
        stack, "Tick", "arn:aws:lambda:us-east-1:123456789012:function:Tick"
    )
    with pytest.raises(ValueError, match="max_hours"):
        RunGuard(
            stack, "Guard", guards=tick, run_name=RUN, max_hours=0, max_restarts=3, instances=[]
        )


def test_train_stack_tells_the_controller_its_run(templates):
    templates["TrainStack"].has_output("HorovodFleetRun", {"Value": RUN})


def test_train_stack_tells_the_run_controller_its_bounds(templates):
    train = templates["TrainStack"]
    train.has_output("HorovodFleetMaxRestarts", {"Value": "3"})
    deadline = train.find_outputs("HorovodFleetDeadline")["HorovodFleetDeadline"]["Value"]
    assert deadline["Fn::GetAtt"][1] == "Deadline"


# --- idle alarm ------------------------------------------------------------------------------


def test_idle_alarm_is_gpu_below_5_percent_for_30_minutes(templates):
    train = templates["TrainStack"]
    [alarm] = train.find_resources("AWS::CloudWatch::Alarm").values()
    props = alarm["Properties"]
    assert props["Namespace"] == "HorovodFleet"
    assert props["MetricName"] == "nvidia_smi_utilization_gpu"
    assert props["Dimensions"] == [{"Name": "Run", "Value": RUN}]
    assert props["Statistic"] == "Average"
    assert props["Threshold"] == 5
    assert props["ComparisonOperator"] == "LessThanThreshold"
    assert props["Period"] * props["EvaluationPeriods"] == 30 * 60
    assert props["DatapointsToAlarm"] == props["EvaluationPeriods"]
    assert props["TreatMissingData"] == "breaching"
    assert props["AlarmName"] == f"horovod-fleet-idle-{RUN}"
    [action] = props["AlarmActions"]
    assert "RunControllerTick" in render(action)


def test_idle_alarm_may_invoke_the_tick_from_the_train_stack(templates):
    train = templates["TrainStack"]
    [alarm_id] = train.find_resources("AWS::CloudWatch::Alarm")
    train.has_resource_properties(
        "AWS::Lambda::Permission",
        {
            "Principal": "lambda.alarms.cloudwatch.amazonaws.com",
            "Action": "lambda:InvokeFunction",
            "SourceArn": {"Fn::GetAtt": [alarm_id, "Arn"]},
        },
    )
    # TeardownStack must not reference the alarm: it deploys first.
    permissions = templates["TeardownStack"].find_resources("AWS::Lambda::Permission").values()
    assert not any("cloudwatch" in json.dumps(p["Properties"]) for p in permissions)


# --- the triggers' rules ----------------------------------------------------------------------


def rules(templates) -> dict[str, dict]:
    """TeardownStack's EventBridge rules by logical ID, with their one target."""
    found = {}
    for logical_id, rule in templates["TeardownStack"].find_resources("AWS::Events::Rule").items():
        [target] = rule["Properties"]["Targets"]
        found[logical_id] = {"pattern": rule["Properties"]["EventPattern"], "target": target}
    return found


def s3_rule_keys(templates) -> dict[str, list]:
    """Each S3 rule's key filter, by the function it invokes."""
    keys = {}
    for rule in rules(templates).values():
        pattern = rule["pattern"]
        if pattern["source"] != ["aws.s3"]:
            continue
        assert pattern["detail-type"] == ["Object Created"]
        assert pattern["detail"]["bucket"]["name"] == [FIXTURE_BUCKET]
        keys[render(rule["target"]["Arn"])] = pattern["detail"]["object"]["key"]
    return keys


def test_done_rule_filters_runs_prefix_and_done_json_for_the_tick(templates):
    [done] = [k for target, k in s3_rule_keys(templates).items() if "Tick" in target]
    assert done == [{"wildcard": "runs/*/DONE.json"}]
    wildcard = "runs/*/DONE.json"
    assert fnmatch.fnmatchcase(f"runs/{RUN}/DONE.json", wildcard)
    for other in (f"runs/{RUN}/logs/a.log", "raw/DONE.json", f"runs/{RUN}/DONE.json.tmp"):
        assert not fnmatch.fnmatchcase(other, wildcard)


def test_manifest_rule_filters_the_manifest_for_the_preprocessing_stop(templates):
    [manifest] = [k for target, k in s3_rule_keys(templates).items() if "PreprocessStop" in target]
    assert manifest == ["tfrecords/manifest.json"]


def test_ec2s_own_events_bring_the_tick_forward(templates):
    """EC2's Spot notices and the state changes of a node stopping or going; no tag can filter
    them (their events carry none), and the tick reads none of them: it reads the fleet."""
    ec2 = {
        tuple(r["pattern"]["detail-type"]): r
        for r in rules(templates).values()
        if r["pattern"]["source"] == ["aws.ec2"]
    }
    assert set(ec2) == {
        ("EC2 Spot Instance Interruption Warning",),
        ("EC2 Instance State-change Notification",),
    }
    changes = ec2[("EC2 Instance State-change Notification",)]["pattern"]["detail"]["state"]
    assert sorted(changes) == ["shutting-down", "stopped", "stopping", "terminated"]
    for rule in ec2.values():
        assert "RunControllerTick" in render(rule["target"]["Arn"])


def test_manifest_rule_and_preprocessing_stop_follow_the_dataset_prefix():
    stacks = build_app(budget_email=None, nag=False, dataset_prefix="imagenet/v2/")
    teardown = Template.from_stack(stacks["TeardownStack"])
    keys = s3_rule_keys({"TeardownStack": teardown})
    assert ["imagenet/v2/manifest.json"] in keys.values()
    _, stop = function(teardown, "PreprocessStop")
    assert stop["Properties"]["Environment"]["Variables"]["MANIFEST_KEY"] == (
        "imagenet/v2/manifest.json"
    )


# --- the guard cannot be removed under a fleet -------------------------------------------------


@pytest.mark.parametrize("app_default", [None, "weak"])
def test_guards_import_the_controller_so_teardown_cannot_be_deleted_first(app_default):
    """CloudFormation refuses to delete a stack whose exports another stack imports; a weak
    Fn::GetStackOutput reference would let `cdk destroy TeardownStack` leave the fleet unguarded."""
    context = {"@aws-cdk/core:defaultCrossStackReferences": app_default} if app_default else None
    stacks = build_app(budget_email=None, nag=False, context=context)
    teardown_template = Template.from_stack(stacks["TeardownStack"])
    teardown = teardown_template.to_json()
    exports = {
        output["Export"]["Name"]: output["Value"]
        for output in teardown.get("Outputs", {}).values()
        if "Export" in output
    }
    tick_id, _ = function(teardown_template, "RunControllerTick")
    [role_id] = [
        k
        for k, r in teardown["Resources"].items()
        if r["Type"] == "AWS::IAM::Role" and k.startswith("PreprocessStopRole")
    ]
    tick = {"Fn::GetAtt": [tick_id, "Arn"]}
    for name, value in (("TrainStack", tick), ("PreprocessStack", {"Ref": role_id})):
        text = json.dumps(Template.from_stack(stacks[name]).to_json())
        assert "Fn::GetStackOutput" not in text, name
        imported = [e for e, v in exports.items() if v == value and f'"{e}"' in text]
        assert imported, f"{name} does not import {value} from TeardownStack"


def test_cdk_json_does_not_weaken_cross_stack_references():
    context = json.loads((Path(__file__).parents[2] / "cdk.json").read_text())["context"]
    assert context["@aws-cdk/core:defaultCrossStackReferences"] == "strong"


# --- no lost invocation ------------------------------------------------------------------------


def dead_letter_arn(templates) -> dict:
    [queue_id] = templates["TeardownStack"].find_resources("AWS::SQS::Queue")
    return {"Fn::GetAtt": [queue_id, "Arn"]}


def test_every_rule_brings_the_tick_forward_or_dead_letters(templates):
    """The tick's rules retry a little (a lost event costs a minute, the next tick's); the
    preprocessing stop's, which nothing repeats, retries for a day, then dead-letters."""
    arn = dead_letter_arn(templates)
    for rule in rules(templates).values():
        target = rule["target"]
        if "Tick" in render(target["Arn"]):
            assert "DeadLetterConfig" not in target
            assert target["RetryPolicy"]["MaximumRetryAttempts"] == TICK_EVENT_RETRIES
        else:
            assert target["DeadLetterConfig"] == {"Arn": arn}
            assert target["RetryPolicy"]["MaximumRetryAttempts"] == 185
            assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] == 86400


def test_the_preprocessing_stop_is_retried_then_dead_lettered(templates):
    teardown = templates["TeardownStack"]
    function_id, resource = function(teardown, "PreprocessStop")
    assert resource["Properties"]["DeadLetterConfig"] == {"TargetArn": dead_letter_arn(templates)}
    [config] = [
        c for c in teardown.find_resources("AWS::Lambda::EventInvokeConfig").values()
        if c["Properties"]["FunctionName"] == {"Ref": function_id}
    ]  # fmt: skip
    assert config["Properties"]["MaximumRetryAttempts"] == 2
    assert config["Properties"]["MaximumEventAgeInSeconds"] == 6 * 3600
    [queue] = teardown.find_resources("AWS::SQS::Queue").values()
    assert queue["Properties"]["SqsManagedSseEnabled"] is True
    assert queue["Properties"]["MessageRetentionPeriod"] == 14 * 86400


def test_the_tick_runs_every_minute_whatever_happens(templates):
    """Done when: a recurring schedule of at most a minute invokes the controller. Scheduler
    does not retry it (the next minute's does), and the tick's own failures are not retried
    either; a tick failing for minutes on end has its alarm."""
    teardown = templates["TeardownStack"]
    tick_id, tick = function(teardown, "RunControllerTick")
    assert tick["Properties"]["Handler"] == "tick.handler"
    schedules = teardown.find_resources("AWS::Scheduler::Schedule").values()
    [schedule] = [s["Properties"] for s in schedules]
    assert TICK_RATE == "rate(1 minute)" and schedule["ScheduleExpression"] == TICK_RATE
    assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert schedule["Target"]["Arn"] == {"Fn::GetAtt": [tick_id, "Arn"]}
    assert schedule["Target"]["RetryPolicy"]["MaximumRetryAttempts"] == 0
    [config] = [
        c for c in teardown.find_resources("AWS::Lambda::EventInvokeConfig").values()
        if c["Properties"]["FunctionName"] == {"Ref": tick_id}
    ]  # fmt: skip
    assert config["Properties"]["MaximumRetryAttempts"] == 0
    assert tick["Properties"]["Timeout"] <= 60


def test_one_tick_runs_at_a_time_and_a_throttled_one_waits_a_minute_in_lambdas_queue(templates):
    """Issue 47: two ticks at once could each judge one loss before either's launch shows. The
    tick reserves a concurrency of one; every invoker calls it asynchronously, so one throttled
    meanwhile goes back to Lambda's queue, kept a minute (MaximumEventAgeInSeconds), by when the
    next minute's tick has run; its own failures are not retried. No other function reserves
    any (each reservation takes from the account's pool, of which Lambda keeps 100)."""
    teardown = templates["TeardownStack"]
    tick_id, tick = function(teardown, "RunControllerTick")
    assert TICK_CONCURRENCY == 1
    assert tick["Properties"]["ReservedConcurrentExecutions"] == 1
    [config] = [
        c["Properties"] for c in teardown.find_resources("AWS::Lambda::EventInvokeConfig").values()
        if c["Properties"]["FunctionName"] == {"Ref": tick_id}
    ]  # fmt: skip
    assert (config["MaximumRetryAttempts"], config["MaximumEventAgeInSeconds"]) == (0, 60)
    reserving = [
        logical_id
        for template in templates.values()
        for logical_id, resource in template.find_resources("AWS::Lambda::Function").items()
        if "ReservedConcurrentExecutions" in resource["Properties"]
    ]
    assert reserving == [tick_id]
    # checkov's "no reserved concurrency" is acknowledged on every function but the tick.
    skipped = json.dumps(tick.get("Metadata", {}))
    assert "CKV_AWS_115" not in skipped and "CKV_AWS_116" in skipped


def test_hard_cap_schedule_retries_then_dead_letters(templates):
    [schedule] = templates["TrainStack"].find_resources("AWS::Scheduler::Schedule").values()
    target = schedule["Properties"]["Target"]
    assert "DeadLetters" in render(target["DeadLetterConfig"]["Arn"])
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 185, "MaximumEventAgeInSeconds": 86400}


def test_the_hard_caps_role_may_send_to_the_dead_letter_queue(templates):
    """Scheduler delivers dead letters with the schedule's own role."""
    sends = [
        statement
        for policy in templates["TrainStack"].find_resources("AWS::IAM::Policy").values()
        if any("HardCapRole" in ref["Ref"] for ref in policy["Properties"]["Roles"])
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if "sqs:SendMessage" in as_list(statement["Action"])
    ]
    assert sends and all("DeadLetters" in render(s["Resource"]) for s in sends)


def test_the_tick_knows_the_idle_timing_and_its_state_machine(templates):
    _, tick = function(templates["TeardownStack"], "RunControllerTick")
    variables = tick["Properties"]["Environment"]["Variables"]
    assert variables["IDLE_MINUTES"] == str(IDLE_MINUTES)
    assert variables["REPLACEMENTS_PER_NODE"] == str(REPLACEMENTS_PER_NODE)
    assert render(variables["STATE_MACHINE_ARN"]).endswith(
        ":stateMachine:horovod-fleet-run-controller"
    )


def test_idle_timing_matches_the_alarm_and_the_rendezvous():
    assert IDLE_PERIOD.to_seconds() * IDLE_EVALUATION_PERIODS == IDLE_MINUTES * 60
    # Nodes get the whole rendezvous timeout; a stuck fleet goes within 45 minutes after it.
    assert RENDEZVOUS_TIMEOUT_S <= STARTUP_GRACE_S <= RENDEZVOUS_TIMEOUT_S + 45 * 60


FAILURE_METRICS = [
    "ApproximateNumberOfMessagesVisible",  # a trigger lost after its retries
    "Errors",  # the preprocessing stop
    "Errors",  # the tick
    "ExecutionsFailed",  # the run controller failed, after StopBilling
    "ExecutionsTimedOut",
]


def test_failure_alarms_email_the_budget_address(templates):
    teardown = templates["TeardownStack"]
    alarms = [a["Properties"] for a in teardown.find_resources("AWS::CloudWatch::Alarm").values()]
    assert sorted(a["MetricName"] for a in alarms) == FAILURE_METRICS
    [topic_id] = teardown.find_resources("AWS::SNS::Topic")
    for props in alarms:
        assert props["Threshold"] == 1
        assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert props["AlarmActions"] == [{"Ref": topic_id}]
    teardown.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": EMAIL}
    )
    [policy] = teardown.find_resources("AWS::SNS::TopicPolicy").values()
    principals = [s.get("Principal") for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    assert {"Service": "cloudwatch.amazonaws.com"} in principals


def test_failure_alarms_exist_without_an_email():
    teardown = Template.from_stack(build_app(budget_email=None, nag=False)["TeardownStack"])
    teardown.resource_count_is("AWS::CloudWatch::Alarm", len(FAILURE_METRICS))
    teardown.resource_count_is("AWS::SNS::Topic", 0)


# --- IAM scope -------------------------------------------------------------------------------


def role_statements(template: Template, role_prefix: str) -> list[dict]:
    """Every statement of the policies attached to the role whose logical ID starts with it."""
    [role_id] = [k for k in template.find_resources("AWS::IAM::Role") if k.startswith(role_prefix)]
    return [
        statement
        for policy in template.find_resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_only_the_controllers_steps_delete_a_stack_and_only_train_stack(templates):
    [statement] = statements_for(templates, "cloudformation:DeleteStack")
    assert statement in role_statements(templates["TeardownStack"], "RunControllerStepsRole")
    assert "cloudformation:DescribeStackEvents" in statement["Action"]
    assert "cloudformation:DescribeStackResources" in statement["Action"]  # before a relaunch
    [resource] = as_list(statement["Resource"])
    assert render(resource) == (
        "arn:${AWS::Partition}:cloudformation:${AWS::Region}:${AWS::AccountId}:stack/TrainStack/*"
    )


def test_the_preprocessing_stop_stops_only_the_registered_instance(templates):
    stops = statements_for(templates, "ec2:StopInstances")
    # The run controller's, on TrainStack's tagged instances (tested below), and one per
    # preprocessing stack in this app.
    stops = [s for s in stops if "ec2:TerminateInstances" not in s["Action"]]
    assert len(stops) == 2
    for statement in stops:
        [resource] = as_list(statement["Resource"])
        assert render(resource).endswith(":instance/${Node}")
    preprocess = templates["PreprocessStack"]
    [policy] = [p for k, p in preprocess.find_resources("AWS::IAM::Policy").items()
                if k.startswith("GuardStopPolicy")]  # fmt: skip
    assert policy["Properties"]["Roles"][0]["Fn::ImportValue"]
    [parameter] = preprocess.find_resources("AWS::SSM::Parameter").values()
    assert parameter["Properties"]["Name"] == "/horovod-fleet/preprocess"
    value = render(parameter["Properties"]["Value"])
    assert json.loads(value.replace("${Node}", "i-x").replace("${Data}", "vol-x")) == {
        "instance_id": "i-x",
        "volume_id": "vol-x",
        "snapshot_volume": True,
    }


INSTANCES = "arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:instance/*"
TRAIN_STACKS = (
    "arn:${AWS::Partition}:cloudformation:${AWS::Region}:${AWS::AccountId}:stack/TrainStack/*"
)
LAUNCH_TEMPLATES = "arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:launch-template/*"
TRAIN_STACK_TAGGED = {
    "aws:ResourceTag/aws:cloudformation:stack-name": "TrainStack",
    "aws:ResourceTag/Project": "horovod-fleet",
}


def test_instances_are_rebooted_stopped_started_and_terminated_only_when_tagged_as_train_stacks(
    templates,
):
    """CloudFormation's own tag (no one can set an aws: tag), or the fleet's tag holding
    TrainStack's id, which the launch templates put on the instances they launch; the cleanup
    only terminates, and only the latter."""
    found = statements_for(templates, "ec2:TerminateInstances")
    steps = role_statements(templates["TeardownStack"], "RunControllerStepsRole")
    cleanup = role_statements(templates["TeardownStack"], "RunControllerCleanupRole")
    assert len(found) == 3 and all(s in steps + cleanup for s in found)
    for statement in found:
        assert [render(r) for r in as_list(statement["Resource"])] == [INSTANCES]
        if statement in steps:
            assert sorted(statement["Action"]) == [
                "ec2:RebootInstances",
                "ec2:StartInstances",
                "ec2:StopInstances",
                "ec2:TerminateInstances",
            ]
        else:
            assert statement["Action"] == "ec2:TerminateInstances"
    conditions = [s["Condition"] for s in found]
    assert {"StringEquals": TRAIN_STACK_TAGGED} in conditions
    fleet = [c for c in conditions if "StringLike" in c]
    assert len(fleet) == 2
    for condition in fleet:
        assert condition["StringEquals"] == {"aws:ResourceTag/Project": "horovod-fleet"}
        [(key, value)] = condition["StringLike"].items()
        assert key == "aws:ResourceTag/horovod-fleet:stack" and render(value) == TRAIN_STACKS


def test_instances_are_launched_only_from_train_stacks_templates_into_its_network(templates):
    """AWS's "only a specific launch template" policy: every resource from the template
    (IsLaunchTemplateResource) but what a launch in another zone names itself, the subnet,
    security group and placement group TrainStack made and the interfaces in them, and a Deny
    for any template not tagged as TrainStack's."""
    runs = statements_for(templates, "ec2:RunInstances")
    allows = [s for s in runs if s["Effect"] == "Allow"]
    [deny] = [s for s in runs if s["Effect"] == "Deny"]
    assert len(allows) == 3
    for allow in allows:
        assert render(allow["Condition"]["ArnLike"]["ec2:LaunchTemplate"]) == LAUNCH_TEMPLATES
    [whole] = [a for a in allows if "Bool" in a["Condition"]]
    assert whole["Condition"]["Bool"] == {"ec2:IsLaunchTemplateResource": "true"}
    [network] = [a for a in allows if "StringEquals" in a["Condition"]]
    assert network["Condition"]["StringEquals"] == TRAIN_STACK_TAGGED
    assert sorted(render(r).rsplit(":", 1)[1] for r in network["Resource"]) == [
        "placement-group/*",
        "security-group/*",
        "subnet/*",
    ]
    [interfaces] = [a for a in allows if a not in (whole, network)]
    assert render(interfaces["Resource"]).endswith(":network-interface/*")
    assert [render(r) for r in as_list(deny["Resource"])] == [LAUNCH_TEMPLATES]
    [(key, value)] = deny["Condition"]["StringNotLike"].items()
    assert key == "aws:ResourceTag/horovod-fleet:stack" and render(value) == TRAIN_STACKS
    [tagging] = [
        s
        for s in statements_for(templates, "ec2:CreateTags")
        if s["Condition"] == {"StringEquals": {"ec2:CreateAction": "RunInstances"}}
    ]
    assert sorted(render(r).rsplit(":", 1)[1] for r in tagging["Resource"]) == [
        "instance/*",
        "network-interface/*",
        "volume/*",
    ]
    [passing] = [
        s
        for s in statements_for(templates, "iam:PassRole")
        if "iam:PassedToService" in json.dumps(s.get("Condition", {}))
    ]
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    assert [render(r) for r in as_list(passing["Resource"])] == [
        "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/TrainStack-*"
    ]


def test_the_controller_tells_a_launched_node_its_index_and_nothing_else(templates):
    """After the one launch: each instance's assignment under runs/<run>/launches/ in S3, and
    the node index tag, only on the fleet's instances and only that key."""
    puts = [r for s in statements_for(templates, "s3:PutObject") for r in as_list(s["Resource"])]
    assert any(render(r).endswith("/runs/*/launches/*") for r in puts)
    # ... and reads them back (a lost node of an elastic fleet is replaced once per number).
    gets = [r for s in statements_for(templates, "s3:GetObject") for r in as_list(s["Resource"])]
    assert any(render(r).endswith("/runs/*/launches/*") for r in gets)
    [tagging] = [
        s
        for s in statements_for(templates, "ec2:CreateTags")
        if "ForAllValues:StringEquals" in s["Condition"]
    ]
    assert tagging["Condition"]["ForAllValues:StringEquals"] == {
        "aws:TagKeys": ["horovod-fleet:node"]
    }
    assert tagging["Condition"]["StringEquals"] == {"aws:ResourceTag/Project": "horovod-fleet"}
    [(key, value)] = tagging["Condition"]["StringLike"].items()
    assert key == "aws:ResourceTag/horovod-fleet:stack" and render(value) == TRAIN_STACKS
    assert render(tagging["Resource"]).endswith(":instance/*")


def test_the_controller_reads_an_operators_hold_and_never_writes_it(templates):
    """`horovod-fleet hold` writes runs/<run>/hold.json with the operator's own credentials;
    the controller's role may read it, and neither write nor delete it."""
    steps = role_statements(templates["TeardownStack"], "RunControllerStepsRole")
    gets = [
        r for s in steps if "s3:GetObject" in as_list(s["Action"]) for r in as_list(s["Resource"])
    ]
    assert any(render(r).endswith("/runs/*/hold.json") for r in gets)
    for action in ("s3:PutObject", "s3:DeleteObject"):
        written = [
            render(r) for s in statements_for(templates, action) for r in as_list(s["Resource"])
        ]
        assert not any("hold.json" in r for r in written), written


def test_only_the_controller_starts_or_stops_its_executions(templates):
    teardown = templates["TeardownStack"]
    for action in ("states:StartExecution", "states:StopExecution", "states:ListExecutions"):
        for statement in statements_for(templates, action):
            resources = [render(r) for r in as_list(statement["Resource"])]
            assert all(":horovod-fleet-run-controller" in r for r in resources), statement
    stops = statements_for({"t": teardown}, "states:StopExecution")
    assert stops and all(s in role_statements(teardown, "RunControllerStepsRole") for s in stops)


def test_the_zone_check_may_name_the_zone_of_a_zone_id(templates):
    # answer_zone calls DescribeAvailabilityZones for -c az=use1-az4 (stacks/config.py).
    [describe] = statements_for(templates, "ec2:DescribeAvailabilityZones")
    assert "ec2:DescribeInstanceTypeOfferings" in describe["Action"]


def test_snapshot_rights_only_when_configured(templates):
    [snapshot] = statements_for({"p": templates["PreprocessStack"]}, "ec2:CreateSnapshot")
    assert any(render(r).endswith(":volume/${Data}") for r in snapshot["Resource"])
    assert statements_for({"p": templates["PreprocessNoSnapshot"]}, "ec2:CreateSnapshot") == []
    [tagging] = statements_for({"p": templates["PreprocessStack"]}, "ec2:CreateTags")
    assert tagging["Condition"] == {"StringEquals": {"ec2:CreateAction": "CreateSnapshot"}}


def test_no_destructive_action_on_a_wildcard_resource(templates):
    destructive = ("Delete", "Stop", "Terminate", "CreateSnapshot", "PassRole", "Put", "Create")
    for name, template in templates.items():
        for statement in statements(template):
            actions = as_list(statement["Action"])
            if any(word in action for action in actions for word in destructive):
                assert "*" not in as_list(statement["Resource"]), (name, statement)
            assert not any(action.endswith("*") for action in actions), (name, statement)


# --- budget, tags, code ----------------------------------------------------------------------


def test_budget_alerts_the_email(templates):
    [budget] = templates["TeardownStack"].find_resources("AWS::Budgets::Budget").values()
    props = budget["Properties"]
    assert props["Budget"]["BudgetLimit"] == {"Amount": 2000, "Unit": "USD"}
    subscribers = [n["Subscribers"] for n in props["NotificationsWithSubscribers"]]
    assert subscribers and all(
        s == [{"Address": EMAIL, "SubscriptionType": "EMAIL"}] for s in subscribers
    )


def test_no_budget_without_an_email():
    stacks = build_app(budget_email=None, nag=False)
    Template.from_stack(stacks["TeardownStack"]).resource_count_is("AWS::Budgets::Budget", 0)


@pytest.mark.parametrize("stack", ["TeardownStack", "TrainStack", "PreprocessStack"])
def test_every_taggable_resource_carries_the_project(templates, stack):
    tagged = 0
    for logical_id, resource in templates[stack].to_json()["Resources"].items():
        tags = resource.get("Properties", {}).get("Tags")
        if stack != "TeardownStack" and ("Node" in logical_id or "Data" in logical_id):
            continue  # the fixture's own instances and volume
        if tags is None:
            continue
        tagged += 1
        pairs = tags if isinstance(tags, dict) else {t["Key"]: t["Value"] for t in tags}
        assert pairs.get("Project") == "horovod-fleet", logical_id
        if stack == "TrainStack":
            assert pairs.get("horovod-fleet:run") == RUN, logical_id
    assert tagged >= 1


def test_teardown_stack_depends_on_nothing_it_guards(app_stacks):
    teardown = app_stacks["TeardownStack"]
    assert {s.stack_name for s in teardown.dependencies} <= {"DatasetStack"}


@pytest.mark.parametrize("module", LAMBDA_MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_function_code_imports_only_boto3_the_standard_library_its_package_and_contract(module):
    """What the Lambda runtime has, the package (never a module of it by bare name, as a Lambda
    asset's top-level modules once were) and contract/, which the assets carry beside it."""
    tree = ast.parse(module.read_text())
    modules = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    roots = {module.split(".")[0] for module in modules}
    assert roots - set(sys.stdlib_module_names) <= {"boto3", "botocore", "contract", "controller"}
    assert not roots & {path.stem for path in LAMBDA_MODULES}


def test_every_python_function_runs_a_handler_its_asset_has(templates):
    """Each handler `<module>.<function>` names an entry of its asset, and the package's module
    of that name defines the function (tests/stacks/test_code_assets.py imports each from the
    asset itself)."""
    functions = templates["TeardownStack"].find_resources("AWS::Lambda::Function").values()
    python = [f["Properties"] for f in functions if f["Properties"]["Runtime"].startswith("python")]
    assert len(python) == 11  # 7 steps, the tick, the cleanup, the answers, the stop
    for props in python:
        module, name = props["Handler"].split(".")
        code = ANSWERS_CODE if module == "answers" else CONTROLLER_CODE
        assert module in code.entries, props["Handler"]
        assert f"def {name}(" in (CONTROLLER / f"{module}.py").read_text(), props["Handler"]
        assert props["Runtime"] == "python3.14"


# --- validators ------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [None, cdk.Environment(region="eu-west-1")])
def test_cdk_nag_has_no_unacknowledged_findings(env):
    # With a concrete region the ARNs (and so the finding ids) render differently.
    stacks = build_app(budget_email=EMAIL, nag=True, env=env)
    # Validation plugins run at synthesis and raise with the findings listed.
    cdk.App.of(stacks["TeardownStack"]).synth()


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_cfn_lint_finds_no_errors(templates):
    for name, template in templates.items():
        matches = lint(json.dumps(template.to_json()), regions=["us-east-1"])
        errors = [str(m) for m in matches if m.rule.id.startswith("E")]
        assert errors == [], name
