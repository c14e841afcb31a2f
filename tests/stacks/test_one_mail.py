"""One e-mail for everything (issue 50): -c notifyEmail hears of training started and the run
ended (TrainStack's topic), of every alarm that reports a failure, and of the budget when one is
set; without it, synthesis says in one line that failures mail nobody."""

import json
from pathlib import Path

import pytest

from contract.names import IDLE_ALARM_PREFIX
from stacks.config import FleetConfig

# The configuration issue 50's region and e-mail tests and test_train_stack.py's notifyEmail test
# share (one synthesis): another region, no zone, both e-mails, one node.
ANY_REGION_MAILED = {"region": "us-west-2", "notifyEmail": "ml@example.com",
                     "budgetEmail": "money@example.com", "nodes": 1}  # fmt: skip
NOTIFY = ANY_REGION_MAILED["notifyEmail"]
# The alarms that are not failures: the idle alarm invokes the run controller, which ends an
# idle fleet and says so in the run-ended mail.
NOT_FAILURES = (IDLE_ALARM_PREFIX,)


@pytest.fixture(scope="module")
def mailed(synth):
    return {name: template.to_json() for name, template in synth(**ANY_REGION_MAILED).items()}


def mailing_topics(template: dict, address: str) -> set[str]:
    """The logical ids of the template's SNS topics `address` is subscribed to by e-mail."""
    topics = set()
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::SNS::Subscription" and props.get("Endpoint") == address:
            assert props["Protocol"] == "email"
            topics.add(props["TopicArn"]["Ref"])
    return topics


def failure_alarms(template: dict) -> dict[str, dict]:
    return {
        logical_id: resource["Properties"]
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
        and not str(resource["Properties"].get("AlarmName", "")).startswith(NOT_FAILURES)
    }


def test_every_alarm_that_reports_a_failure_mails_notify_email(mailed):
    checked = []
    for name, template in mailed.items():
        topics = mailing_topics(template, NOTIFY)
        for logical_id, alarm in failure_alarms(template).items():
            actions = {a.get("Ref") for a in alarm.get("AlarmActions", [])}
            assert actions & topics, (
                f"{name} {logical_id} mails nobody: {alarm.get('AlarmActions')}"
            )
            checked.append(logical_id)
    for expected in ("TickErrorsAlarm", "ExecutionsFailedAlarm", "ExecutionsTimedOutAlarm",
                     "DeadLettersAlarm", "PreprocessStopErrorsAlarm"):  # fmt: skip
        assert any(expected in logical_id for logical_id in checked), (expected, checked)


def test_training_started_and_the_run_ended_mail_notify_email(mailed):
    """The head publishes both to TrainStack's topic (node.json notify_topic_arn)."""
    train = mailed["TrainStack"]
    [topic] = mailing_topics(train, NOTIFY)
    assert topic.startswith("Notifications")
    assert "notify_topic_arn" in json.dumps(train)


def test_the_budget_mails_notify_email_beside_budget_email(mailed):
    [budget] = [r for r in mailed["TeardownStack"]["Resources"].values()
                if r["Type"] == "AWS::Budgets::Budget"]  # fmt: skip
    for notification in budget["Properties"]["NotificationsWithSubscribers"]:
        assert {s["Address"] for s in notification["Subscribers"]} == {
            NOTIFY,
            ANY_REGION_MAILED["budgetEmail"],
        }
    # Failures mail budgetEmail too, as they did before notifyEmail heard of them.
    teardown = mailed["TeardownStack"]
    assert mailing_topics(teardown, NOTIFY) == mailing_topics(
        teardown, ANY_REGION_MAILED["budgetEmail"]
    )


def test_without_an_address_no_alarm_mails_and_synthesis_says_so(default, synth):
    from app import estimates

    for template in default.values():
        for alarm in failure_alarms(template.to_json()).values():
            assert not alarm.get("AlarmActions"), alarm
    context = json.loads((Path(__file__).parents[2] / "cdk.json").read_text())["context"]
    lines = estimates(FleetConfig.from_context(context))
    said = [line for line in lines if "notifyEmail" in line]
    assert said == [
        "no notifyEmail: failures (the run controller's errors, a failed execution, a lost "
        "trigger) mail nobody; -c notifyEmail=you@example.com"
    ]
    mailed_lines = estimates(FleetConfig.from_context(context | ANY_REGION_MAILED))
    assert not any("mail nobody" in line for line in mailed_lines)
