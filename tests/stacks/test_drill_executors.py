"""The drill's two executors play one list: the FIS experiment templates `npx cdk synth -c
drill=true` makes (TrainStack) and the rehearsal's drill (`python -m rehearsal --drill`, its own
templates in moto's FIS and its own model of each action) hold the same experiments, each with
the same FIS action ids, parameters and targets, every action one the rehearsal plays; and the
head's node.json names them in the same order with the same codes. Either side changed alone
fails here."""

import dataclasses

import pytest
from conftest import head_instance, node_document

from contract import drill
from rehearsal import drill as rehearsal_drill
from rehearsal.drill_actions import Players, Unplayable

DRILL_TAG = "horovod-fleet-drill-"
ZONE = "{zone}"  # the fleet's zone: a deploy-time answer in TrainStack, moto's in the rehearsal


@pytest.fixture(scope="module")
def synthesized(synth) -> dict[str, dict]:
    # In process: the CLI's own synthesis of a drill is held by the slow tier (test_drill_stack).
    resources = synth(drill="true")["TrainStack"].to_json()["Resources"]
    found = {}
    for resource in resources.values():
        if resource["Type"] == "AWS::FIS::ExperimentTemplate":
            properties = resource["Properties"]
            found[properties["Tags"]["Name"].removeprefix(DRILL_TAG)] = properties
    return found


def value(parameter) -> str:
    """A parameter as FIS gets it; a token resolved at deploy (the zone) as `{zone}`."""
    return parameter if isinstance(parameter, str) else ZONE


def from_stack(properties: dict) -> dict[str, tuple]:
    """{action name: (action id, target kind, its resource type, parameters)} of a synthesized
    template."""
    targets = properties["Targets"]
    return {
        name: (
            action["ActionId"],
            *action["Targets"].values(),
            targets[next(iter(action["Targets"].values()))]["ResourceType"],
            {k: value(v) for k, v in (action.get("Parameters") or {}).items()},
        )
        for name, action in properties["Actions"].items()
    }


def from_rehearsal(experiment: drill.Experiment) -> dict[str, tuple]:
    """The same of the template the rehearsal makes in moto's FIS and its executor plays."""
    template = rehearsal_drill.fis_template(experiment, ZONE)
    return {
        name: (
            action["actionId"],
            *action["targets"].values(),
            template["targets"][next(iter(action["targets"].values()))]["resourceType"],
            dict(action["parameters"]),
        )
        for name, action in template["actions"].items()
    }


def test_the_same_experiments_are_in_the_templates_and_in_the_rehearsal_s_drill(synthesized):
    assert sorted(synthesized) == sorted(e.name for e in drill.plan("on-demand"))


@pytest.mark.parametrize("experiment", drill.plan("on-demand"), ids=lambda e: e.name)
def test_each_experiment_s_actions_and_parameters_are_the_same_in_both(synthesized, experiment):
    assert from_stack(synthesized[experiment.name]) == from_rehearsal(experiment)


def test_one_side_changed_alone_is_seen(synthesized):
    """The comparison can fail: the rehearsal's template of an experiment whose parameter moved
    (the S3 cut 2 minutes instead of 1), or that lost an action, is not TrainStack's."""
    cut = next(e for e in drill.EXPERIMENTS if e.name == "s3-cut")
    longer = dataclasses.replace(cut.actions[0], parameters=(("scope", "s3"), ("duration", "PT2M")))
    assert from_stack(synthesized["s3-cut"]) == from_rehearsal(cut)
    assert from_stack(synthesized["s3-cut"]) != from_rehearsal(
        dataclasses.replace(cut, actions=(longer,))
    )
    throttled = next(e for e in drill.EXPERIMENTS if e.name == "controller-throttled")
    assert from_stack(synthesized[throttled.name]) != from_rehearsal(
        dataclasses.replace(throttled, actions=throttled.actions[:1])
    )


def test_the_rehearsal_plays_the_drill_with_train_stack_s_heartbeat_timeout():
    """The two executors time a silent node alike, and an S3 cut of the list is ridden out by
    both: a node's heartbeat, every poll interval and retried with up to the retry policy's
    longest backoff, is fresh again before the timeout (the rehearsal's elastic 20 s was not)."""
    from bootstrap.aws import RetryPolicy
    from stacks.train.node_document import HEARTBEAT_TIMEOUT_S

    timeout = rehearsal_drill.OVERRIDES["heartbeat_timeout_s"]
    assert timeout == HEARTBEAT_TIMEOUT_S
    aws_poll_s = 10  # node.json poll_interval_s's default (bootstrap/node_config.py)
    for experiment in drill.EXPERIMENTS:
        for action in experiment.actions:
            if action.action_id == drill.DISRUPT_CONNECTIVITY:
                cut_s = action.minutes * 60
                assert aws_poll_s + cut_s + RetryPolicy(None).max_delay_s < timeout


@pytest.mark.parametrize("experiment", drill.EXPERIMENTS, ids=lambda e: e.name)
def test_the_rehearsal_plays_every_action_of_the_list(experiment):
    players = Players(rehearsal=None, zone="us-east-1a")
    for action in experiment.actions:
        players.check(action)  # raises Unplayable


def test_an_action_the_rehearsal_has_no_model_of_fails_loudly():
    players = Players(rehearsal=None, zone="us-east-1a")
    melt = drill.FisAction("melt", "aws:ec2:melt-instances", drill.NODE)
    with pytest.raises(Unplayable, match="cannot play aws:ec2:melt-instances"):
        players.check(melt)
    cut = drill.FisAction("cut", drill.DISRUPT_CONNECTIVITY, drill.FLEET_SUBNET,
                          (("scope", "dynamodb"), ("duration", "PT1M")))  # fmt: skip
    with pytest.raises(Unplayable, match="cuts only scope s3"):
        players.check(cut)


@pytest.mark.slow  # the app as `npx cdk synth` makes it: make check's work too
def test_the_head_s_node_json_names_the_same_plan_as_the_rehearsal_s(drill_cli):
    _, _, templates = drill_cli
    _, head = head_instance(templates["TrainStack"])
    synthesized = node_document(head)["drill"]
    experiments = drill.plan("on-demand")
    rehearsed = rehearsal_drill.document(experiments, {e.name: "<token>" for e in experiments})
    assert synthesized["start_after_epoch"] == rehearsed["start_after_epoch"]
    assert synthesized["experiments"] == rehearsed["experiments"]
