"""An operator's hold (`horovod-fleet hold`, watch/hold.py) as the run controller's tick honours it,
against moto with the synthesized workflow: the record the command writes holds the run through
the controller's own role (its S3 calls judged by the synthesized policy, as the rehearsal's IAM
judge does, rehearsal/iam_s3.py), and the release hands it back."""

from run_controller_fleet import (
    BUCKET,
    RUN,
    ZONES,
    Ec2Answers,
    Fleet,
    backend_instance,
    read_json,
    s3,
    ticks,  # noqa: F401  (a fixture)
)

from controller import clients
from rehearsal import iam_s3
from watch.aws import Fleet as Watched
from watch.aws import RunStore
from watch.hold import hold, release

# ruff: noqa: F811  (ticks is a fixture)

OPERATOR = "arn:aws:iam::123456789012:user/ops"
# The S3 action each call of the controller needs (the ones it makes).
ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "DeleteObject": "s3:DeleteObject",
    "ListObjectsV2": "s3:ListBucket",
}


class JudgedByTheControllersRole:
    """Every S3 call of the tick and its steps (all through clients.client("s3")), judged by the
    policies the synthesized templates attach to the controller's role."""

    def __init__(self, templates) -> None:
        jsons = [t.to_json() for t in templates.values()]
        self.statements = iam_s3.role_statements(jsons, "us-east-1")["controller"]
        self.calls: list[str] = []
        self.refused: list[str] = []
        clients.client("s3").meta.events.register("provide-client-params.s3.*", self.judge)

    def judge(self, params, model, **_) -> None:
        action = ACTIONS[model.name]
        bucket = f"arn:aws:s3:::{params['Bucket']}"
        if action == "s3:ListBucket":
            where, context = bucket, {"s3:prefix": params.get("Prefix", "")}
        else:
            where, context = f"{bucket}/{params['Key']}", {}
        self.calls.append(f"{action} {where}")
        if not iam_s3.allowed(self.statements, action, where, context):
            self.refused.append(f"{action} {where}")


def up(fleet: Fleet) -> list:
    return [n["node"] for n in fleet.instances(states=("pending", "running"))]


def test_a_hold_written_by_the_command_holds_the_run_and_its_release_hands_it_back(
    ticks, monkeypatch, default
):
    judged = JudgedByTheControllersRole(default)
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(2, fleet)
    watched = Watched.connect("us-east-1")
    watched.read_train_stack()
    store = RunStore(s3(), BUCKET)
    said = hold(watched, store, None, "looking at node 1", OPERATOR)
    assert said.startswith(f"run {RUN} held: the run controller takes no action on it")
    backend_instance(fleet.nodes[1]).terminate()  # node 1 lost while held
    ticks.minutes(3, fleet)
    assert [d["phase"] for d in ticks.decisions[-3:]] == ["held"] * 3
    assert all(d["actions"] == [] for d in ticks.decisions[-3:])
    assert up(fleet) == [0, 2, "head"]
    assert f"s3:GetObject arn:aws:s3:::{BUCKET}/runs/{RUN}/hold.json" in judged.calls
    assert release(watched, store, None, OPERATOR).startswith(f"run {RUN} released")
    ticks.minutes(1, fleet)
    assert ticks.decisions[-1]["actions"] == ["replace"]
    assert sorted(up(fleet), key=str) == [0, 1, 2, "head"]
    record = read_json(f"runs/{RUN}/hold.json")
    assert (record["held"], record["held_by"], record["released_by"]) == (False, OPERATOR, OPERATOR)
    assert record["stack_id"] == fleet.stack_id
    assert judged.refused == []


def test_the_hard_cap_deletes_a_held_run(ticks, monkeypatch):
    fleet = Fleet(zones=ZONES[:1], hours=1)
    ticks.minutes(2, fleet)
    watched = Watched.connect("us-east-1")
    watched.read_train_stack()
    hold(watched, RunStore(s3(), BUCKET), None, None, OPERATOR)
    ticks.minutes(2, fleet)
    assert ticks.decisions[-1]["phase"] == "held"
    ticks.advance(hours=1)
    ticks.until_quiet()
    assert fleet.stack_status() == "DELETE_COMPLETE"
