"""bootstrap/head/drill.py: the head plays the drill's experiments in order through FIS (moto's
bookkeeping of StartExperiment and GetExperiment, moto >= 5.2.3), records each under
runs/<run>/drill/, judges it from the run's records, starts nothing twice, goes on where a head
before it left off, and asks the agreed stop once the last is judged."""

import json
import sys
import time

import boto3
import pytest
from bootstrap_helpers import BUCKET

from bootstrap.fleet.rendezvous import read_object
from bootstrap.head import drill as schedule
from bootstrap.node_config import ConfigError
from contract import drill
from contract.runs import parse_stamp_s, stamp_at

# moto's FIS stamps an experiment's start with the real clock: each test's clock starts there,
# at the test's own start (`real_start`). A time taken at import is minutes old when a busy
# worker reaches the test (`make test`), and the experiment then starts after the bound the test
# moves its clock to.
T0 = float(int(time.time()))
PLAN = drill.plan("on-demand")


@pytest.fixture(autouse=True)
def real_start(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "T0", float(int(time.time())))


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


@pytest.fixture
def fis(s3):
    """moto's FIS beside the test's S3, with one template per experiment of the plan."""
    client = boto3.client("fis", region_name="us-east-1")
    ids = {}
    for experiment in PLAN:
        ids[experiment.name] = client.create_experiment_template(
            clientToken=experiment.name,
            description=experiment.what,
            roleArn="arn:aws:iam::123456789012:role/fis",
            stopConditions=[{"source": "none"}],
            targets={},
            actions={
                a.name: {"actionId": a.action_id, "parameters": dict(a.parameters)}
                for a in experiment.actions
            },
        )["experimentTemplate"]["id"]
    client.template_ids = ids
    return client


def document(template_ids: dict[str, str]) -> dict:
    return {
        "start_after_epoch": drill.START_AFTER_EPOCH,
        "max_epochs": 1000,
        "experiments": [
            {"name": e.name, "template_id": template_ids[e.name], "action_ids": list(e.action_ids),
             "observe": list(e.observe), "within_s": e.within_s}
            for e in PLAN
        ],
    }  # fmt: skip


@pytest.fixture
def head(train_config, fis, s3, tmp_path):
    cfg = train_config(role="head", drill=document(fis.template_ids),
                       mount_point=str(tmp_path / "data"))  # fmt: skip
    clock, lines = Clock(), []

    def make():
        plan = schedule.plan_of(cfg.drill)
        return schedule.Schedule(cfg, plan, s3, fis, lines.append, poll_s=0, clock=clock)

    return cfg, make, clock, lines


def put(s3, cfg, name: str, doc: dict) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{cfg.runs_prefix}{name}", Body=json.dumps(doc).encode())


def record(s3, cfg, name: str) -> dict | None:
    body = read_object(s3, BUCKET, f"{cfg.runs_prefix}drill/{name}.json")
    return json.loads(body) if body else None


def training(s3, cfg, epoch: int, logged: float, attempt: int = 1, resets=()) -> None:
    progress = {"epoch": epoch, "updated_at": stamp_at(logged), "global_step": epoch * 10}
    put(s3, cfg, "status.json", {"attempt": attempt, "phase": "training", "progress": progress,
                                 "resets": list(resets)})  # fmt: skip


def experiments(fis) -> list[dict]:
    return fis.list_experiments()["experiments"]


def test_nothing_starts_before_the_first_epochs_are_done(head, s3, fis):
    cfg, make, _clock, _ = head
    training(s3, cfg, epoch=drill.START_AFTER_EPOCH, logged=T0)  # epoch 1 in progress
    assert make().tick() is False
    assert experiments(fis) == [] and record(s3, cfg, PLAN[0].name) is None


def test_the_first_experiment_starts_with_its_deterministic_token_and_is_recorded(head, s3, fis):
    cfg, make, _clock, lines = head
    training(s3, cfg, epoch=drill.START_AFTER_EPOCH + 1, logged=T0)
    assert make().tick() is False
    [started] = experiments(fis)
    first = record(s3, cfg, PLAN[0].name)
    assert first["experiment_id"] == started["id"]
    assert started["experimentTemplateId"] == fis.template_ids[PLAN[0].name]
    assert first["client_token"] == f"{cfg.run}-{PLAN[0].name}"
    assert first["attempt"] == 1 and first["action_ids"] == list(PLAN[0].action_ids)
    assert first["fis_state"] and "verdict" not in first
    assert lines[0].startswith(f"drill: started {PLAN[0].name} (aws:ec2:terminate-instances)")


def test_a_head_that_died_after_starting_starts_nothing_twice(head, s3, fis):
    """The head started the experiment and died before writing its record: the head that
    takes over asks FIS with the same token and gets the same experiment back."""
    cfg, make, _clock, _ = head
    training(s3, cfg, epoch=3, logged=T0)
    fis.start_experiment(
        clientToken=f"{cfg.run}-{PLAN[0].name}",
        experimentTemplateId=fis.template_ids[PLAN[0].name],
    )
    make().tick()
    make().tick()  # and a third head, after its record
    [only] = experiments(fis)
    assert record(s3, cfg, PLAN[0].name)["experiment_id"] == only["id"]


def test_each_next_experiment_starts_once_the_one_before_is_judged(head, s3, fis):
    cfg, make, clock, lines = head
    training(s3, cfg, epoch=3, logged=T0)
    first = make()
    first.tick()
    started = parse_stamp_s(record(s3, cfg, PLAN[0].name)["started_at"])
    clock.now = started + 30
    lost = {"at": stamp_at(started + 10), "lost": [{"node": "2", "instance_id": "i-2"}],
            "added": [], "steps_redone": 2}  # fmt: skip
    joined = {"at": stamp_at(started + 25), "lost": [], "steps_redone": 0,
              "added": [{"node": "2", "instance_id": "i-new"}]}  # fmt: skip
    training(s3, cfg, epoch=5, logged=started + 28, resets=[lost, joined])
    put(
        s3,
        cfg,
        "controller.json",
        {
            "replacements": [
                {
                    "node": "2",
                    "instance_id": "i-new",
                    "replaces": "i-2",
                    "at": stamp_at(started + 15),
                }
            ]
        },
    )
    first.tick()
    judged = record(s3, cfg, PLAN[0].name)
    assert judged["verdict"] == "pass", judged
    assert len(experiments(fis)) == 1  # judged at this poll; the next starts at the next
    first.tick()
    assert record(s3, cfg, PLAN[1].name)["experiment_id"]
    assert len(experiments(fis)) == 2
    assert f"drill: {PLAN[0].name}: pass (every observation seen)" in lines


def test_an_experiment_past_its_bound_fails_and_the_drill_goes_on(head, s3, fis):
    cfg, make, clock, _lines = head
    training(s3, cfg, epoch=3, logged=T0)
    player = make()
    player.tick()
    clock.now = T0 + PLAN[0].within_s + 60
    player.tick()
    assert record(s3, cfg, PLAN[0].name)["verdict"] == "FAIL"
    player.tick()
    assert record(s3, cfg, PLAN[1].name)["started_at"]


def test_a_template_fis_does_not_know_is_that_experiment_s_fail(head, s3, fis, train_config):
    cfg, _, clock, lines = head
    doc = document({**fis.template_ids, PLAN[0].name: "EXT1a2b3c4d5e6f7"})
    player = schedule.Schedule(cfg, schedule.plan_of(doc), s3, fis, lines.append, 0, clock)
    training(s3, cfg, epoch=3, logged=T0)
    player.tick()
    refused = record(s3, cfg, PLAN[0].name)
    assert refused["verdict"] == "FAIL" and refused["why"].startswith("FIS refused to start it")
    assert experiments(fis) == []


def test_the_stop_is_asked_once_every_experiment_is_judged(head, s3, fis):
    cfg, make, _clock, _lines = head
    for experiment in PLAN:
        put(s3, cfg, f"drill/{experiment.name}.json",
            {"experiment": experiment.name, "started_at": stamp_at(T0), "verdict": "pass"})  # fmt: skip
    assert make().tick() is True
    stop = json.loads(
        s3.get_object(Bucket=BUCKET, Key=f"{cfg.runs_prefix}stop.json")["Body"].read()
    )
    assert stop["format"] == "horovod-fleet/stop/1" and stop["at"] == "epoch_end"
    assert stop["asked_at"] == stamp_at(T0) and stop["by"] == "drill"


def test_a_node_mirrors_the_stop_where_its_ranks_look_and_drops_a_stale_one(
    train_config, s3, tmp_path
):
    cfg = train_config(drill={"experiments": []}, mount_point=str(tmp_path / "data"))
    path = schedule.stop_file(cfg)
    path.parent.mkdir(parents=True)
    path.write_text("{}")  # an earlier run's, on a disk kept in place
    assert schedule.mirror_stop(s3, cfg) is False and not path.exists()
    put(s3, cfg, "stop.json", {"at": "epoch_end"})
    assert schedule.mirror_stop(s3, cfg) is True
    assert json.loads(path.read_text()) == {"at": "epoch_end"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "melt"}, "key 'drill.experiments[0].name' unknown experiment 'melt': allowed"),
        ({"observe": ["reset"]}, "key 'drill.experiments[0].observe' must be ['reset', "),
        ({"template_id": ""}, "key 'drill.experiments[0].template_id' must name"),
    ],
)
def test_a_plan_this_code_cannot_play_is_one_line_naming_the_key(change, message):
    doc = document({e.name: "EXT1" for e in PLAN})
    doc["experiments"][0].update(change)
    with pytest.raises(ConfigError, match="^node.json: " + message.replace("[", r"\[")):
        schedule.plan_of(doc)


def test_the_schedule_runs_in_its_own_thread_until_the_stop_is_asked(head, s3, fis):
    cfg, make, _, _ = head
    for experiment in PLAN:
        put(s3, cfg, f"drill/{experiment.name}.json",
            {"experiment": experiment.name, "started_at": stamp_at(T0), "verdict": "pass"})  # fmt: skip
    player = make()
    player.start()
    player.join(timeout=30)
    assert not player.is_alive()
    assert read_object(s3, BUCKET, f"{cfg.runs_prefix}stop.json")
