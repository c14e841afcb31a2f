"""Each node's start-up record: the launch from EC2 (or the rehearsal's stamp), the boot from the
kernel's start, the shell's steps from lib.sh's file, the trainer's start-up from startup.json,
and what a restart in place keeps.

.venv/bin/python -m pytest tests/bootstrap/node/test_phases.py
"""

import json
import os
import subprocess
import time
from pathlib import Path

import boto3
from bootstrap_helpers import BUCKET

from bootstrap import aws
from bootstrap.records import phases
from contract.runs import parse_stamp_s, stamp_at

REPO = Path(__file__).resolve().parents[3]
T0 = 1_800_000_000.0


def record_of(s3, node="0"):
    return json.loads(
        s3.get_object(Bucket=BUCKET, Key=f"runs/r1/phases/{node}.json")["Body"].read()
    )


def test_lib_sh_writes_each_finished_step_with_its_times(tmp_path):
    """What train_node.sh's steps leave for the Python bootstrap: one tab-separated line per
    finished step, appended, in epoch seconds; none before the file is named."""
    tsv = tmp_path / "state" / "shell-steps.tsv"
    script = tmp_path / "steps.sh"
    script.write_text(
        f"set -euo pipefail\nsource {REPO}/bootstrap/lib.sh\n"
        'step "read node.json"\nrecord_step_times "$1"\nsleep 0.2\n'
        'step "training image"\nstep "instance store"\nstep "train node"\n'
    )
    before = time.time()
    for _ in range(2):  # a second boot appends
        subprocess.run(["bash", str(script), str(tsv)], check=True, capture_output=True)
    lines = [line.split("\t") for line in tsv.read_text().splitlines()]
    assert [line[0] for line in lines] == ["read node.json", "training image", "instance store"] * 2
    start, end = float(lines[0][1]), float(lines[0][2])
    assert before <= start and end - start >= 0.2
    steps = phases.read_shell_steps(tsv, since=float(lines[3][1]))
    assert steps["read node.json"] == (float(lines[3][1]), float(lines[3][2]))  # the newest boot's


def test_the_kernel_start_is_now_less_the_uptime(tmp_path):
    uptime = tmp_path / "uptime"
    uptime.write_text("350.25 1200.00\n")
    assert phases.kernel_started_at(T0, uptime) == T0 - 350.25
    assert phases.kernel_started_at(T0, tmp_path / "none") is None


def write_steps(cfg, steps):
    path = Path(cfg.state_dir) / phases.SHELL_STEPS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name}\t{a}\t{b}\n" for name, a, b in steps))


def test_a_node_records_launch_boot_and_the_shell_steps(s3, train_config):
    cfg = train_config(node_index=2, nodes=3)
    write_steps(cfg, [
        ("read node.json", T0 - 500, T0 - 499),  # an earlier boot's: left out
        ("read node.json", T0 + 60, T0 + 61), ("training image", T0 + 61, T0 + 63),
        ("instance store", T0 + 63, T0 + 80), ("gpu fabric", T0 + 80, T0 + 85),
    ])  # fmt: skip
    record = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 1, "i-0abc", "10.0.0.7")
    record.begin(launched=T0 - 20, kernel_started=T0, now=T0 + 90)
    record.health(T0 + 90, T0 + 100)
    record.measure("data_pull", T0 + 100, T0 + 131.4, bytes=150_000_000_000, mb_per_s=4777.0)
    doc = record_of(s3, "2")
    assert (doc["format"], doc["node"], doc["attempt"]) == ("horovod-fleet/phases/1", "2", 1)
    assert (doc["instance_id"], doc["ip"], doc["launched_at"]) == ("i-0abc", "10.0.0.7",
                                                                   stamp_at(T0 - 20))  # fmt: skip
    got = {code: phase["s"] for code, phase in doc["phases"].items()}
    assert got == {"launch": 20.0, "boot": 60.0, "image_check": 2.0, "instance_store": 17.0,
                   "health": 15.0, "data_pull": 31.4}  # fmt: skip
    # health: the fabric step and the Python checks, not the agent's start between them
    assert doc["phases"]["health"]["start"] == stamp_at(T0 + 80)
    assert doc["phases"]["data_pull"]["mb_per_s"] == 4777.0


def test_a_kernel_older_than_the_launch_is_the_rehearsal_s_host(s3, train_config):
    """The rehearsal's nodes are processes: the machine booted days ago, so the node's boot
    runs from its process's start (node.json launched_at), and its launch takes no time."""
    cfg = train_config(launched_at=stamp_at(T0))
    write_steps(cfg, [("read node.json", T0 + 0.5, T0 + 1)])
    record = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 1, "i-0", "127.0.0.1")
    record.begin(phases.launched_at(cfg, "i-0"), kernel_started=T0 - 86400 * 3, now=T0 + 2)
    assert record.phases["launch"]["s"] == 0.0 and record.phases["boot"]["s"] == 0.5


def test_ec2_says_when_the_instance_was_launched(s3, train_config):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    aws.client.cache_clear()
    instance = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]
    lines = []
    try:
        launched = phases.launched_at(train_config(), instance["InstanceId"], lines.append)
        assert launched == instance["LaunchTime"].timestamp() and lines == []
        assert phases.launched_at(train_config(), "i-00000000000000000", lines.append) is None
    finally:
        aws.client.cache_clear()
    assert lines and "no 'launch' phase" in lines[0]  # one line, no launch phase, no failure


def test_a_restart_in_place_keeps_launch_and_boot_and_measures_the_rest_again(s3, train_config):
    cfg = train_config()
    write_steps(cfg, [("read node.json", T0 + 30, T0 + 31), ("training image", T0 + 31, T0 + 32)])
    first = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 1, "i-0", "10.0.0.5")
    first.begin(T0 - 10, T0, T0 + 40)
    first.measure("rendezvous", T0 + 50, T0 + 52)
    # systemd started the bootstrap again 10 minutes later: the kernel did not restart.
    again = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 1, "i-0", "10.0.0.5")
    write_steps(cfg, [("read node.json", T0 + 600, T0 + 601)])
    again.begin(T0 - 10, T0, T0 + 602)
    assert again.phases["boot"]["s"] == 30.0 and "rendezvous" not in again.phases
    # A new attempt starts a new record.
    fresh = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 2, "i-0", "10.0.0.5")
    assert fresh.phases == {}


def test_the_trainer_s_start_up_is_copied_once_this_attempt_writes_it(s3, train_config, tmp_path):
    cfg = train_config()
    record = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 1, "i-0", "10.0.0.5")
    model = tmp_path / "model"
    model.mkdir()
    startup = {"started_at": stamp_at(T0), "framework_start_s": 95.0, "first_step_s": 41.5,
               "first_step_at": stamp_at(T0 + 140)}  # fmt: skip
    (model / phases.STARTUP).write_text(json.dumps(startup))
    os.utime(model / phases.STARTUP, (T0, T0))
    follower = phases.TrainerFollower(record, model / phases.STARTUP, since=T0 + 1)
    follower.poll()
    assert not follower.copied  # an earlier attempt's file
    os.utime(model / phases.STARTUP, (T0 + 200, T0 + 200))
    follower.poll()
    doc = record_of(s3)
    assert doc["phases"]["framework_start"] == {"start": stamp_at(T0), "end": stamp_at(T0 + 95),
                                                "s": 95.0}  # fmt: skip
    assert doc["phases"]["first_step"]["end"] == stamp_at(T0 + 140)
    assert parse_stamp_s(doc["phases"]["first_step"]["start"]) == T0 + 98  # whole seconds


def test_a_record_s3_did_not_take_is_written_with_the_next(s3, train_config):
    cfg = train_config()
    lines = []
    record = phases.PhaseRecord(cfg, aws.RetryingS3(s3), 1, "i-0", "10.0.0.5", lines.append)
    s3.delete_bucket(Bucket=BUCKET)
    record.measure("rendezvous", T0, T0 + 1)
    record.measure("allreduce_check", T0 + 1, T0 + 9)
    assert record.unsaved and len(lines) == 1  # one line, however many writes fail
    s3.create_bucket(Bucket=BUCKET)
    record.save()
    assert not record.unsaved and set(record_of(s3)["phases"]) == {"rendezvous", "allreduce_check"}


def test_the_fleet_s_records_are_this_attempt_s(s3, train_config):
    for node, attempt in ((0, 2), (1, 2), (2, 1)):
        cfg = train_config(node_index=node, nodes=3)
        phases.PhaseRecord(cfg, aws.RetryingS3(s3), attempt, f"i-{node}", "10.0.0.1").save()
    found = phases.read_records(aws.RetryingS3(s3), train_config(nodes=3), 2)
    assert sorted(r["node"] for r in found) == ["0", "1"]
