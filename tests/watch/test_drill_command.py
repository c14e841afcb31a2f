"""`horovod-fleet drill` offline: the command as a user runs it (`cli.main`), its `npx cdk` and
`python -m` stubs doing to moto what the drill's deploys would (tests/watch/drill_world.py).
The happy path, a failed deploy, Ctrl-C while waiting and in the teardown, a run that never ends,
what still bills, and every bad input: one line, exit 2, nothing deployed."""

import datetime
import json
import signal
import subprocess
from pathlib import Path

import boto3
import pytest
from drill_world import BUCKET, DEADLINE, T0, World, create_stack, ctrl_c, done_of_a_drill, put
from moto import mock_aws

from watch import cli
from watch import drill as drill_command
from watch.drill import WAIT_MARGIN_S

RUN = "drill-test"
FLAGS = ["-c", "drill=true", "-c", f"run={RUN}", "-c", "region=us-east-1", "-c",
         "instanceType=g4dn.xlarge", "-c", "market=on-demand", "-c",
         "drillExperiments=node-terminated,s3-cut"]  # fmt: skip
ARGS = ["drill", "--run", RUN, "--region", "us-east-1", "--experiment", "node-terminated",
        "--experiment", "s3-cut"]  # fmt: skip


@pytest.fixture
def aws(monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        yield


@pytest.fixture
def world(aws, monkeypatch):
    """The stubs behind the command: no real `npx cdk` or Python process ever runs."""
    made = World(RUN)
    monkeypatch.setattr(drill_command, "tools_for", lambda root: made.tools())
    return made


def drill(capsys, *extra: str) -> tuple[int, str, str]:
    code = cli.main([*ARGS, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def s3_json(key: str) -> dict:
    body = boto3.client("s3", region_name="us-east-1").get_object(Bucket=BUCKET, Key=key)["Body"]
    return json.loads(body.read())


DEPLOYS = [("synth", ""), ("deploy", "TeardownStack"), ("deploy", "PreprocessStack"),
           ("deploy", "ImageStack"), ("deploy", "TrainStack")]  # fmt: skip
TEARDOWN = [("destroy", "TrainStack"), ("destroy", "PreprocessStack")]


def test_the_happy_path_prints_the_table_and_timeline_writes_drill_json_and_destroys(world, capsys):
    world.at_sleep[1] = lambda: done_of_a_drill(RUN)
    code, out, err = drill(capsys)
    assert (code, err) == (0, "")
    assert world.verbs() == DEPLOYS + TEARDOWN
    for call in world.calls:  # the same app every time, with the drill's context
        assert call[-len(FLAGS) :] == FLAGS
    assert world.calls[1][:4] == ["deploy", "TeardownStack", "--require-approval", "never"]
    assert world.calls[-1][:4] == ["destroy", "PreprocessStack", "--force", "--exclusively"]
    # The sample went where PreprocessStack's converter reads it.
    raw = boto3.client("s3", region_name="us-east-1").list_objects_v2(
        Bucket=BUCKET, Prefix="drill/raw/"
    )
    assert sorted(o["Key"] for o in raw["Contents"]) == [
        "drill/raw/ILSVRC2012_img_train.tar", "drill/raw/ILSVRC2012_img_val.tar",
        "drill/raw/ILSVRC2012_validation_ground_truth.txt",
    ]  # fmt: skip
    assert world.python_calls[0][:2] == ["-m", "trainer.preprocess.sample"]
    # The table: the head's verdict, and s3-cut judged here from the records (training again
    # 150 s after its start, 90 s after the cut's end).
    table = out[out.index("experiment ") :]
    node_row = next(line for line in table.splitlines() if line.startswith("node-terminated"))
    cut_row = next(line for line in table.splitlines() if line.startswith("s3-cut "))
    assert node_row.rstrip().endswith("| pass") and "aws:ec2:terminate-instances" in node_row
    assert cut_row.rstrip().endswith("| pass") and "training_again +150 s" in cut_row
    assert "training again +150 s" in cut_row and "within 10 min" in cut_row
    assert f"drill {RUN}: passed 2 of 2; the run ended succeeded" in out
    # Then the start-up on the real instances, against synthesis's estimates.
    assert out.index("start-up on the real instances") > out.index(f"drill {RUN}: passed")
    assert "  boot                74.5 s       90 s  node 1 (i-1, 10.0.0.6)" in out
    result = s3_json(f"runs/{RUN}/drill.json")
    assert (result["format"], result["passed"], result["of"], result["failed"]) == (
        "horovod-fleet/drill/1", 2, 2, [],
    )  # fmt: skip
    assert [r["experiment"] for r in result["rows"]] == ["node-terminated", "s3-cut"]
    assert result["rows"][1]["result"] == "pass" and result["timeline"]["phases"]["boot"]
    # Torn down, and the account read back: nothing bills by the hour.
    assert "drill: TrainStack is deleted" in out and "drill: PreprocessStack is deleted" in out
    assert "horovod-fleet leftovers: what bills every month" in out
    assert "kept deployed for the real run: DatasetStack" in out
    assert out.rstrip().splitlines()[-1].startswith("drill: nothing bills by the hour")


def test_a_failed_deploy_still_destroys_what_was_deployed_and_reports_no_run(world, capsys):
    world.fail = "TrainStack"
    code, out, _ = drill(capsys)
    assert code == 1
    assert world.verbs() == DEPLOYS + TEARDOWN
    assert "drill: FAILED: npx cdk deploy TrainStack exited 1 (its output above)" in out
    # Nothing ran: every row a FAIL, never started, and the table still kept.
    assert f"drill {RUN}: FAIL node-terminated, s3-cut (passed 0 of 2)" in out
    assert s3_json(f"runs/{RUN}/drill.json")["failed"] == ["node-terminated", "s3-cut"]


def test_a_deploy_failed_before_the_fleet_destroys_only_what_began(world, capsys):
    world.fail = "PreprocessStack"
    code, out, _ = drill(capsys)
    assert code == 1
    assert world.verbs() == [*DEPLOYS[:3], ("destroy", "PreprocessStack")]
    assert "experiment " not in out  # no fleet, no table


def test_ctrl_c_while_waiting_still_destroys(world, capsys):
    def interrupt():
        raise KeyboardInterrupt

    world.at_sleep[2] = interrupt
    code, out, _ = drill(capsys)
    assert code == 130
    assert world.verbs() == DEPLOYS + TEARDOWN
    assert "drill: interrupted (Ctrl-C): tearing down what the drill deployed" in out
    assert "drill: TrainStack is deleted" in out
    # What the head had judged by then is on the record.
    assert s3_json(f"runs/{RUN}/drill.json")["rows"][0]["result"] == "pass"


def test_a_run_that_never_finishes_stops_waiting_at_the_cap_plus_the_margin(world, capsys):
    world.sleep_step = 1800
    code, out, _ = drill(capsys)
    assert code == 1
    assert world.verbs() == DEPLOYS + TEARDOWN
    stopped = [line for line in out.splitlines() if "stopped waiting" in line]
    assert stopped == [
        f"drill: FAILED: no DONE.json of a finished run {WAIT_MARGIN_S // 60} min after the "
        f"hard cap ({DEADLINE}): stopped waiting; tearing down what the drill deployed"
    ]
    bound = T0 + 7200 + WAIT_MARGIN_S  # the hard cap's time, then the margin
    assert bound <= world.now < bound + world.sleep_step + 1


def test_the_wait_ends_when_the_run_controller_deleted_the_fleet(world, capsys):
    def controller_deletes():
        done_of_a_drill(RUN)
        s3 = boto3.client("s3", region_name="us-east-1")
        done = s3_json(f"runs/{RUN}/DONE.json")
        s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json",
                      Body=json.dumps({**done, "status": "failed", "reason": "idle"}).encode())  # fmt: skip
        boto3.client("cloudformation", region_name="us-east-1").delete_stack(StackName="TrainStack")

    world.at_sleep[1] = controller_deletes
    code, out, _ = drill(capsys)
    assert code == 1
    assert (
        "drill: FAILED: TrainStack is deleted: the run controller ended the run (failed: idle)"
        in out
    )
    assert world.sleeps == 1


def test_ctrl_c_in_the_teardown_is_answered_and_the_teardown_goes_on(world, capsys):
    world.at_sleep[1] = lambda: done_of_a_drill(RUN)
    world.on_destroy["TrainStack"] = ctrl_c
    code, out, _ = drill(capsys)
    assert code == 0
    assert world.verbs() == DEPLOYS + TEARDOWN
    assert "drill: Ctrl-C: the teardown goes on; Ctrl-C again stops it" in out
    assert "drill: PreprocessStack is deleted" in out


def test_ctrl_c_twice_in_the_teardown_stops_it_naming_what_is_left_and_how_to_finish(world, capsys):
    def twice():
        ctrl_c()
        ctrl_c()

    world.at_sleep[1] = ctrl_c  # Ctrl-C while waiting, then twice in the teardown
    world.on_destroy["TrainStack"] = twice
    code, out, _ = drill(capsys)
    assert code == 130
    assert world.verbs() == [*DEPLOYS, ("destroy", "TrainStack")]
    left = next(line for line in out.splitlines() if "teardown stopped by Ctrl-C" in line)
    assert left == ("drill: teardown stopped by Ctrl-C: still deployed: TrainStack "
                    "(CREATE_COMPLETE), PreprocessStack (CREATE_COMPLETE)")  # fmt: skip
    finish = next(line for line in out.splitlines() if "finish the teardown" in line)
    assert (
        f"with: npx cdk destroy TrainStack PreprocessStack --force --exclusively {' '.join(FLAGS)};"
        in finish
    )
    assert "STILL BILLING BY THE HOUR: TrainStack is deployed; PreprocessStack is deployed" in out


def test_an_instance_left_running_is_said_to_bill_by_the_hour(world, capsys):
    def replacement_left():
        done_of_a_drill(RUN)
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ec2.run_instances(
            ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="g4dn.xlarge",
            TagSpecifications=[{"ResourceType": "instance", "Tags": [
                {"Key": "horovod-fleet:stack", "Value": "TrainStack"},
                {"Key": "horovod-fleet:node", "Value": "2"}]}],
        )  # fmt: skip

    world.at_sleep[1] = replacement_left
    code, out, _ = drill(capsys)
    assert code == 1
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("drill: STILL BILLING BY THE HOUR: instance i-")
    assert last.endswith("(running, node 2)")


def test_keep_tears_nothing_down_and_says_so(world, capsys):
    world.at_sleep[1] = lambda: done_of_a_drill(RUN)
    code, out, _ = drill(capsys, "--keep")
    assert code == 0
    assert world.verbs() == DEPLOYS
    assert "drill: --keep: NOTHING WILL BE TORN DOWN" in out
    assert "drill: --keep: NOTHING TORN DOWN; still deployed: TeardownStack, PreprocessStack" in out
    assert "STILL BILLING BY THE HOUR: TrainStack is deployed" in out


def test_no_preprocess_converts_here_and_deploys_no_preprocess_stack(world, capsys):
    world.at_sleep[1] = lambda: done_of_a_drill(RUN)

    def python(argv, env):
        if argv[1] != "trainer.preprocess":
            return World.python(world, argv, env)
        world.python_calls.append(list(argv))
        put("drill/tfrecords/manifest.json", {})  # what the converter writes last
        return 0

    world.python = python
    code, _, _ = drill(capsys, "--no-preprocess")
    assert code == 0
    assert world.verbs() == [v for v in DEPLOYS if v[1] != "PreprocessStack"] + TEARDOWN[:1]
    assert world.calls[0][-2:] == ["-c", "drillPreprocess=false"]
    convert = world.python_calls[1]
    assert convert[:2] == ["-m", "trainer.preprocess"]
    assert convert[convert.index("--output") + 1] == f"s3://{BUCKET}/drill/tfrecords/"
    assert convert[convert.index("--train-shards") + 1 :][:3] == ["6", "--val-shards", "3"]


# --- bad input: one line, exit 2, nothing deployed -------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--experiment", "melt-gpus"],
         "error: --experiment: unknown experiment 'melt-gpus': allowed node-terminated, "
         "controller-throttled, s3-cut, spot-notice, head-terminated"),
        (["--experiment", "spot-notice"],
         "error: --experiment spot-notice plays only with --market spot; --market on-demand "
         "plays: node-terminated, controller-throttled, s3-cut, head-terminated"),
        (["--instance-type", "p4d.24xlarge"],
         "error: --instance-type p4d.24xlarge is a P-family type, far over a drill's few "
         "dollars: pass --confirm-cost to drill on it, or a G type (default g4dn.xlarge)"),
        (["--run", "Drill_1"],
         "error: --run 'Drill_1' is not a run name: 1-40 lowercase letters, digits and inner "
         "hyphens, like resnet50-1"),
        (["--market", "cheap"],
         "error: argument --market: invalid choice: 'cheap' (choose from 'on-demand', 'spot') "
         "(see horovod-fleet --help)"),
    ],
)  # fmt: skip
def test_a_bad_option_is_one_line_and_nothing_is_deployed(world, capsys, argv, line):
    try:
        code = cli.main(["drill", *argv])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", line + "\n")
    assert world.calls == []


def test_a_p_family_type_with_confirm_cost_is_drilled_on(world, capsys):
    world.synth_status = 2  # stop at the synthesis: what matters is what it was asked
    code, _, _ = drill(capsys, "--instance-type", "p4d.24xlarge", "--confirm-cost")
    assert code == 2
    assert world.calls[0][-4:] == ["-c", "drillExperiments=node-terminated,s3-cut", "-c",
                                   "drillConfirmCost=true"]  # fmt: skip
    assert "instanceType=p4d.24xlarge" in world.calls[0]


def test_a_configuration_synthesis_refuses_deploys_nothing(world, capsys):
    world.synth_status = 2
    code, _, err = drill(capsys)
    assert code == 2
    assert world.verbs() == [("synth", "")]
    assert err == (
        "error: synthesis refused the drill's configuration (its line above): nothing deployed\n"
    )


def test_a_deployed_train_stack_is_refused_before_anything_is_deployed(world, capsys):
    create_stack("TrainStack")
    code, _, err = drill(capsys)
    assert code == 2
    assert world.calls == []
    assert err == (
        "error: TrainStack is deployed in us-east-1 (CREATE_COMPLETE): a drill deploys and "
        "destroys its own; let that run end, or npx cdk destroy TrainStack, first\n"
    )


def test_a_converter_deployed_is_refused_unless_the_drill_converts_here(world, capsys):
    create_stack("PreprocessStack")
    code, _, err = drill(capsys)
    assert code == 2 and world.calls == []
    assert "PreprocessStack is deployed in us-east-1 (CREATE_COMPLETE)" in err
    assert err.rstrip().endswith("or pass --no-preprocess")


def test_a_run_that_already_ended_is_refused(world, capsys):
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    done_of_a_drill(RUN)
    code, _, err = drill(capsys)
    assert code == 2 and world.calls == []
    assert err.startswith(f"error: run {RUN} already ended (succeeded, s3://{BUCKET}/runs/")


def test_the_default_run_is_a_dated_drill_name():
    moment = datetime.datetime(2026, 12, 1, 9, 5, tzinfo=datetime.timezone.utc)
    assert drill_command.default_run(moment) == "drill-20261201-0905"


def test_the_sample_s_file_names_are_the_generator_s():
    from trainer.preprocess import sample

    assert (drill_command.TRAIN_TAR, drill_command.VAL_TAR, drill_command.VAL_LABELS) == (
        sample.TRAIN_TAR, sample.VAL_TAR, sample.VAL_LABELS,
    )  # fmt: skip


def test_outside_a_checkout_the_command_says_so(tmp_path):
    with pytest.raises(drill_command.BadInput, match="deploys from the project's checkout"):
        drill_command.Processes(tmp_path)


# --- horovod-fleet runs ------------------------------------------------------------------------


def test_runs_shows_each_drill_s_result_from_its_drill_json(world, capsys):
    world.fail = "TrainStack"  # a drill that failed: every experiment a FAIL
    drill(capsys)
    put(f"runs/{RUN}-ok/drill.json", {"format": "horovod-fleet/drill/1", "run": f"{RUN}-ok",
                                       "passed": 4, "of": 4, "failed": []})  # fmt: skip
    put("runs/resnet50-1/DONE.json", {"status": "succeeded", "top1": 0.76})
    code = cli.main(["runs", "--bucket", BUCKET])
    out, _ = capsys.readouterr()
    assert code == 0
    drills = [line for line in out.splitlines() if ": drill " in line]
    assert drills == [  # in S3's order of the runs
        f"{RUN}-ok: drill passed 4 of 4",
        f"{RUN}: drill FAIL node-terminated, s3-cut (passed 0 of 2)",
    ]


# --- the real processes --------------------------------------------------------------------------


def test_the_sample_and_the_converter_run_as_processes_into_the_tfrecords_prefix(
    moto_endpoint, monkeypatch
):
    """--no-preprocess as the command runs it: `python -m trainer.preprocess.sample` and
    `python -m trainer.preprocess` as processes in the checkout, the converter writing into the
    drill's TFRecords prefix of a moto server (a smaller dataset than the drill's, same shape)."""
    from contract.drill import Dataset
    from watch.aws import Fleet, RunStore

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_ENDPOINT_URL": moto_endpoint}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    args = cli.build_parser().parse_args(["drill", "--no-preprocess", "--run", RUN])
    root = Path(drill_command.__file__).resolve().parents[1]
    small = Dataset(classes=2, train_per_class=3, val_images=2, train_shards=2, val_shards=1)
    made = drill_command.Drill(drill_command.Request.of(args), Fleet.connect("us-east-1"),
                               drill_command.tools_for(root), str(root), dataset=small)  # fmt: skip
    made.store = RunStore(s3, BUCKET)
    made.put_dataset()
    body = s3.get_object(Bucket=BUCKET, Key="drill/tfrecords/manifest.json")["Body"].read()
    manifest = json.loads(body)
    assert (manifest["num_classes"], manifest["splits"]) == (
        2, {"train": {"shards": 2, "records": 6}, "validation": {"shards": 1, "records": 2}},
    )  # fmt: skip
    assert {s["file"] for s in manifest["shards"]} == {
        "train-00000-of-00002", "train-00001-of-00002", "validation-00000-of-00001",
    }  # fmt: skip
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="drill/raw/")
    assert listed["KeyCount"] == 0  # converted here: nothing for PreprocessStack to read


class FakeChild:
    """A CDK CLI that Ctrl-C interrupts while it runs, and that ends on SIGINT or not."""

    def __init__(self, ends_on_sigint: bool) -> None:
        self.pid, self.ends_on_sigint, self.waits = 4242, ends_on_sigint, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) == 1:
            raise KeyboardInterrupt  # the terminal's Ctrl-C, while the child runs
        if timeout is not None and not self.ends_on_sigint:
            raise subprocess.TimeoutExpired("cdk", timeout)
        return -2


@pytest.mark.parametrize("ends_on_sigint", [True, False])
def test_ctrl_c_during_a_command_stops_it_in_its_own_session_then_goes_on(
    monkeypatch, ends_on_sigint
):
    child, started, signals = FakeChild(ends_on_sigint), {}, []

    def popen(command, **kwargs):
        started.update(kwargs, command=command)
        return child

    monkeypatch.setattr(drill_command.subprocess, "Popen", popen)
    monkeypatch.setattr(drill_command.os, "killpg", lambda pid, sig: signals.append((pid, sig)))
    processes = drill_command.Processes(Path(drill_command.__file__).resolve().parents[1])
    with pytest.raises(KeyboardInterrupt):  # the drill goes on to its teardown
        processes.cdk(["deploy", "TrainStack"])
    assert started["command"] == ["npx", "--no-install", "cdk", "deploy", "TrainStack"]
    assert started["start_new_session"] is True  # the terminal's Ctrl-C reaches only this process
    assert started["env"]["PATH"].startswith(str(processes.root / "node_modules" / ".bin"))
    expected = [(4242, signal.SIGINT)] + ([] if ends_on_sigint else [(4242, signal.SIGKILL)])
    assert signals == expected
    assert child.waits[:2] == [None, drill_command.STOP_CHILD_S]
