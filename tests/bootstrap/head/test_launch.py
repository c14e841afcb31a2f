"""The leader's horovodrun command and environment, DONE.json, failure reasons.

.venv/bin/python -m pytest tests/bootstrap/head/test_leader_launch.py
"""

import json
import os
import time
from pathlib import Path

import pytest
from bootstrap_helpers import train_doc

from bootstrap.fleet import allreduce_check
from bootstrap.head import checkpoints, failures, launch
from bootstrap.node import spot
from bootstrap.node_config import parse
from bootstrap.records import results
from bootstrap.records.phases import PHASES
from contract.runs import stamp_at
from stacks.instance_types import GPU_TYPES, GpuType


def test_gpu_fleet_uses_gloo_from_the_head_with_efa_nccl_and_horovod_settings():
    """Gloo, as the elastic training must be (launch.py, _run_elastic): it carries Horovod's
    coordination, NCCL the GPUs' collectives; the head has no GPU and runs no rank."""
    cfg = parse(train_doc())
    cmd = launch.horovodrun_command(cfg, Path("/h"), Path("/k"), 16, ["python3", "-m", "x"])
    assert cmd[:4] == ["horovodrun", "--gloo", "-np", "16"]
    assert "--network-interface" not in cmd and not any("--mpi" in c for c in cmd)
    assert cmd[cmd.index("--hostfile") + 1] == "/h"
    assert cmd[cmd.index("--ssh-identity-file") + 1] == "/k"
    assert cmd[-3:] == ["python3", "-m", "x"]
    env = launch.launcher_env(cfg, {"PATH": "/bin"})
    assert env["FI_PROVIDER"] == "efa"
    assert int(env["HOROVOD_FUSION_THRESHOLD"]) == 64 * 1024 * 1024
    assert env["NCCL_DEBUG"] == "INFO"  # what the transport check reads
    assert env["TF_GPU_THREAD_MODE"] == "gpu_private"
    assert "TF_ENABLE_ONEDNN_OPTS" not in env  # TensorFlow's own choice on a GPU node's CPUs


def node_doc_for(gpu: GpuType) -> dict:
    """The keys stacks/train/fleet.py writes for a node of this type (tests/stacks checks it does)."""
    return train_doc(
        instance_type=gpu.name,
        gpus_per_node=gpu.gpus,
        efa=gpu.efa,
        gpudirect=gpu.gpudirect,
        allreduce_floor_gbps=gpu.allreduce_floor_gbps,
    )


@pytest.mark.parametrize("name", sorted(GPU_TYPES))
def test_launch_environment_per_instance_type_comes_from_the_one_table(name):
    gpu = GPU_TYPES[name]
    env = launch.launcher_env(parse(node_doc_for(gpu)), {"PATH": "/bin"}, lambda _: False)
    # Flat NCCL allreduce for every type: no MPI_Allreduce over TCP between nodes.
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE" not in env
    # No GPUDirect setting anywhere: the plugin detects it where the hardware has it.
    assert not [key for key in env if key.startswith("NCCL_NET_GDR")]
    # The plugin picks NCCL's protocol per platform; forcing "simple" would slow p5.
    assert "NCCL_PROTO" not in env
    assert env.get("FI_PROVIDER") == ("efa" if gpu.efa else None)
    assert env.get("FI_EFA_USE_DEVICE_RDMA") == ("1" if gpu.gpudirect else None)
    floor = env.get(allreduce_check.FLOOR_ENV)
    assert floor == (f"{gpu.allreduce_floor_gbps:g}" if gpu.allreduce_floor_gbps else None)
    assert env[allreduce_check.TYPE_ENV] == name


def test_efa_without_gpudirect_gets_no_device_rdma_and_gpudirect_types_a_floor():
    """g5's EFA has no GPUDirect RDMA; p4d's has, and a bus bandwidth floor from a published
    multi-node figure."""
    env = launch.launcher_env(parse(node_doc_for(GPU_TYPES["g5.48xlarge"])), {})
    assert "FI_EFA_USE_DEVICE_RDMA" not in env and "HOROVOD_HIERARCHICAL_ALLREDUCE" not in env
    assert env["FI_PROVIDER"] == "efa"
    p4d = launch.launcher_env(parse(node_doc_for(GPU_TYPES["p4d.24xlarge"])), {})
    assert p4d["FI_EFA_USE_DEVICE_RDMA"] == "1" and float(p4d[allreduce_check.FLOOR_ENV]) > 0


def test_efa_nodes_find_the_aws_ofi_nccl_plugin_where_this_ami_has_it():
    """NCCL from the TensorFlow wheel loads the plugin only from LD_LIBRARY_PATH."""
    cfg = parse(train_doc())
    present = {"/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib"}
    env = launch.launcher_env(
        cfg, {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}, present.__contains__
    )
    assert (
        env["LD_LIBRARY_PATH"]
        == "/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib:/usr/local/cuda/lib64"
    )
    older = launch.launcher_env(cfg, {}, {"/opt/aws-ofi-nccl/lib"}.__contains__)
    assert older["LD_LIBRARY_PATH"] == "/opt/aws-ofi-nccl/lib"
    no_efa = launch.launcher_env(parse(train_doc(efa=False)), {}, present.__contains__)
    assert "LD_LIBRARY_PATH" not in no_efa


def test_cpu_nodes_use_gloo_without_gpu_settings_and_with_onednn():
    cfg = parse(train_doc(gpus_per_node=0, efa=False, network_interface="hf0", ssh_port=2222))
    cmd = launch.horovodrun_command(cfg, Path("/h"), Path("/k"), 2, ["t"], interface="hf0")
    assert "--gloo" in cmd and "--mpi" not in cmd
    assert cmd[cmd.index("--ssh-port") + 1] == "2222"
    assert cmd[cmd.index("--network-interface") + 1] == "hf0"
    assert launch.launcher_env(cfg, {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
        "TF_ENABLE_ONEDNN_OPTS": "1",  # CPU_ENV: TensorFlow leaves it off on AVX2-only CPUs
    }
    compared = launch.launcher_env(cfg, {"TF_ENABLE_ONEDNN_OPTS": "0"})  # the head's own kept
    assert compared["TF_ENABLE_ONEDNN_OPTS"] == "0"


def test_trainer_command_follows_the_contract():
    cfg = parse(train_doc())
    assert launch.trainer_command(cfg, Path("/data/tfrecords"), Path("/data/model")) == [
        "python3", "-m", "trainer.train", "--data-dir", "/data/tfrecords",
        "--model-dir", "/data/model", "--epochs", "2", "--batch-size", "256",
        "--arch", "resnet50", "--image-size", "224",
    ]  # fmt: skip


def test_done_document_on_success_and_failure(tmp_path):
    cfg = parse(train_doc(log_dir=str(tmp_path / "logs")))
    (tmp_path / "eval.json").write_text(json.dumps({"top1": 0.76, "top5": 0.93, "epoch": 2}))
    training = {"epochs": 2, "images_per_s": 9000.0, "duration_s": 3600.0}
    training["end_to_end_images_per_s"] = 8600.0
    (tmp_path / "train.json").write_text(json.dumps(training))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "allreduce-check.log").write_text(
        "NCCL INFO ...\n[1,0]<stdout>:allreduce check: 16 ranks on 2 nodes, 256 MiB x 10: "
        "bus bandwidth 8.40 GB/s\n"
    )
    started = time.time() - 10
    ok = results.done_document(cfg, "succeeded", None, tmp_path, started + 10, started)
    assert set(ok) == {"run", "status", "cause", "reason", "written_by", "top1", "top5",
                      "epochs", "duration_s", "images_per_s", "end_to_end_images_per_s",
                      "allreduce_busbw_gbps", "target_top1", "reached_target_at_epoch",
                      "time_to_target_s", "attempt_started_at", "finished_at", "timeline",
                      "resets", "goodput", "runtime_goodput", "goodput_s", "restarts",
                      "training_restarts", "attempt", "attempts"}  # fmt: skip
    assert (ok["attempt"], ok["attempts"]) == (
        1,
        [{"attempt": 1, "status": "succeeded", "cause": None, "reason": None}],
    )
    assert (ok["cause"], ok["written_by"], ok["restarts"]) == (None, "head", [])
    assert ok["attempt_started_at"] == stamp_at(started)
    assert (ok["top1"], ok["top5"], ok["images_per_s"], ok["duration_s"]) == (
        0.76,
        0.93,
        9000.0,
        3600.0,
    )
    assert (ok["end_to_end_images_per_s"], ok["allreduce_busbw_gbps"]) == (8600.0, 8.4)
    no_check = results.done_document(parse(train_doc(log_dir=str(tmp_path / "none"))), "failed",
                                    "x", tmp_path, started + 10, started)  # fmt: skip
    assert no_check["allreduce_busbw_gbps"] is None and no_check["end_to_end_images_per_s"] is None
    failed = results.done_document(
        cfg, "failed", "step 'x' failed", tmp_path, started + 10, started, cause="node_lost"
    )
    assert failed["status"] == "failed" and failed["reason"] == "step 'x' failed"
    assert failed["cause"] == "node_lost" and failed["attempts"][-1]["cause"] == "node_lost"
    assert failed["top1"] is None and failed["top5"] is None and failed["images_per_s"] is None


def test_done_document_has_the_attempt_s_timeline(tmp_path, s3_reachability):
    cfg = parse(train_doc())
    training = {"epochs": 2, "duration_s": 600.0, "startup_s": 40.0, "evaluation_s": 20.0,
                "checkpoint_s": 5.0, "time_to_target_s": 500.0}  # fmt: skip
    (tmp_path / "train.json").write_text(json.dumps(training))
    steps = {"data pull": 120.4, "rendezvous": 3.1, "allreduce check": 9.8, "training": 610.2}
    started = time.time() - 700
    done = results.done_document(cfg, "succeeded", None, tmp_path, time.time(), started, None,
                                None, steps)  # fmt: skip
    own = {k: done["timeline"][k] for k in ("steps_s", "trainer_s", "s3_unreachable_s")}
    assert own == {
        "steps_s": steps,
        "trainer_s": {"startup_s": 40.0, "evaluation_s": 20.0, "checkpoint_s": 5.0,
                      "training_s": 535.0, "time_to_target_s": 500.0},
        "s3_unreachable_s": 0.0,
    }  # fmt: skip
    # No phases records: every phase is there, measured by no node; the trainer's start-up is
    # the framework's lost time (train.json of a trainer without startup.json).
    assert set(done["timeline"]["phases"]) == set(PHASES)
    assert done["timeline"]["phases"]["boot"]["s"] is None
    assert done["timeline"]["lost_s"]["framework_start"] == 40.0
    # A failure before the trainer wrote train.json: the steps alone, and the 45 s S3 did not
    # answer this node (an outage before the attempt began is not its own).
    times = iter([started - 100, started - 50, started + 100, started + 145])
    s3_reachability.clock = lambda: next(times)
    for _ in range(2):
        s3_reachability.unanswered()
        s3_reachability.answered()
    os.remove(tmp_path / "train.json")
    failed = results.done_document(cfg, "failed", "x", tmp_path, time.time(), started, None, None,
                                  {"data pull": 1.0})  # fmt: skip
    own = {k: failed["timeline"][k] for k in ("steps_s", "trainer_s", "s3_unreachable_s")}
    assert own == {
        "steps_s": {"data pull": 1.0}, "trainer_s": {}, "s3_unreachable_s": 45.0,
    }  # fmt: skip


def test_done_document_counts_the_attempts_the_run_controller_recorded(tmp_path):
    cfg = parse(train_doc())
    earlier = [
        {"attempt": 1, "status": "failed", "reason": "node 1 lost", "decision": "relaunch",
         "retryable": True},
        {"attempt": 2, "status": "interrupted", "reason": "SIGTERM", "decision": "relaunch"},
    ]  # fmt: skip
    started = time.time() - 5
    done = results.done_document(cfg, "failed", "x " * 400, tmp_path, started + 5, started, None,
                                earlier)  # fmt: skip
    assert done["attempt"] == 3
    assert [(a["attempt"], a["status"]) for a in done["attempts"]] == [
        (1, "failed"),
        (2, "interrupted"),
        (3, "failed"),
    ]
    assert set(done["attempts"][0]) == {"attempt", "status", "cause", "reason"}
    assert done["attempts"][2]["reason"] == done["reason"]  # one line, trimmed alike


def test_failure_reason_prefers_the_trainer_error_line():
    tail = "Epoch 1/90\n[1]<stderr>:error: shard train-00003 record 17: label 1001 outside 1..1000\nTraceback...\n"
    assert "label 1001 outside" in failures.failure_reason(tail)
    assert failures.failure_reason("") == "no output"


def test_failure_reason_skips_horovodrun_s_own_runtime_error():
    """horovodrun ends a failed run with its RuntimeError; the trainer's line is the reason."""
    tail = (
        "[0]<stderr>:error: label 9 outside 1..4 in /data/train-00001-of-00004\n"
        "[1]<stderr>:error: label 9 outside 1..4 in /data/train-00001-of-00004\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Horovod detected that one or more processes exited with non-zero "
        "status, thus causing the job to be terminated.\n"
    )
    assert failures.failure_reason(tail).endswith(
        "error: label 9 outside 1..4 in /data/train-00001-of-00004"
    )


def test_done_document_ignores_figures_a_previous_attempt_left(tmp_path):
    """train.json restored from S3 with the checkpoints is the last attempt's, not this one's."""
    cfg = parse(train_doc())
    (tmp_path / "train.json").write_text(json.dumps({"epochs": 3, "duration_s": 3600.0}))
    os.utime(tmp_path / "train.json", (time.time() - 3600, time.time() - 3600))
    started = time.time() - 42
    failed = results.done_document(cfg, "failed", "x", tmp_path, started + 42, started)
    assert failed["epochs"] is None and failed["duration_s"] == 42.0
    # Restored with the checkpoints just now: new on disk, still the previous attempt's.
    (tmp_path / "train.json").write_text(json.dumps({"epochs": 3, "duration_s": 3600.0}))
    failed = results.done_document(cfg, "failed", "x", tmp_path, started + 42, started, time.time())
    assert failed["epochs"] is None


def test_a_rank_whose_host_is_gone_names_its_node_and_the_lost_connection():
    """Every process of node 1's host killed (the fault rehearsal's lost host): ssh ends its
    ranks with 255 and no words. Before: 'rank 1 on 10.0.1.23 exited 255; its last words:'."""
    tail = (
        "[0]<stdout>:Epoch 2/5\n[1]<stderr>:\n"
        "Process 1 exit with status code 255.\n"
        "Terminating remaining workers after failure of Process 1.\n"
    )
    assert failures.failure_reason(tail, "10.0.1.7 slots=1\n10.0.1.23 slots=1\n") == (
        "rank 1 on node 1 (10.0.1.23) exited 255 (ssh's code for a lost connection: its host "
        "is gone or unreachable)"
    )


# horovodrun 0.28.1 when node 1's host died between the rendezvous and the launch: its ssh check
# of every host (horovod/runner/launch.py) fails before any rank starts.
SSH_CHECK_FAILED = """ssh not successful for host 10.0.1.23:
ssh: connect to host 10.0.1.23 port 2222: Connection refused
Traceback (most recent call last):
  File "/usr/bin/horovodrun", line 8, in <module>
    sys.exit(run_commandline())
RuntimeError: could not connect to some hosts via ssh
"""


def test_a_node_lost_as_horovodrun_starts_is_node_lost_naming_the_node():
    """Before: cause unknown, reason 'could not connect to some hosts via ssh', no node named."""
    failure = failures.classify(SSH_CHECK_FAILED, "10.0.1.7 slots=1\n10.0.1.23 slots=1\n")
    assert failure.cause == "node_lost"
    assert failure.reason == (
        "node 1 (10.0.1.23) lost: horovodrun could not reach it over ssh as it started (ssh: "
        "connect to host 10.0.1.23 port 2222: Connection refused)"
    )


GLOO_RANK_KILLED = """[1]<stdout>:Step 40 Epoch 2 ...
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
Process 0 exit with status code 143.
Traceback (most recent call last):
  File "/usr/bin/horovodrun", line 8, in <module>
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be terminated. The first process to do so was:
Process name: 1
Exit code: 137
"""


def test_dead_rank_is_named_by_rank_host_and_signal():
    """Gloo's summary (horovod 0.28.1 gloo_run.py) with the hostfile's rank placement."""
    hostfile = "10.0.1.5 slots=1\n10.0.1.23 slots=1\n"
    assert failures.failure_reason(GLOO_RANK_KILLED, hostfile) == (
        "rank 1 on node 1 (10.0.1.23) killed by SIGKILL (out of memory?)"
    )


def test_ranks_map_to_hosts_slot_by_slot():
    hostfile = "10.0.1.5 slots=8\n10.0.1.23 slots=8\n"
    tail = "Process name: [[4242,1],9]\n  Exit code:    139\n"
    assert failures.failure_reason(tail, hostfile) == (
        "rank 9 on node 1 (10.0.1.23) killed by SIGSEGV (a crash in native code)"
    )


def test_mpirun_signal_report_names_rank_node_and_signal():
    tail = "mpirun noticed that process rank 3 with PID 77 on node ip-10-0-1-9 exited on signal 9 (Killed).\n"
    assert (
        failures.failure_reason(tail) == "rank 3 on ip-10-0-1-9 killed by SIGKILL (out of memory?)"
    )


def test_rank_that_exits_with_a_code_keeps_its_last_words():
    tail = "[2]<stderr>:Traceback\n[2]<stderr>:ZeroDivisionError: division by zero\nProcess name: 2\nExit code: 1\n"
    assert failures.failure_reason(tail, "h slots=4\n") == (
        "rank 2 on node 0 (h) exited 1; its last words: ZeroDivisionError: division by zero"
    )


def test_a_rank_killed_behind_ssh_is_named_by_its_wrapper():
    """Over ssh horovodrun sees 255 for a killed remote rank; bootstrap.fleet.rank's line names the
    signal. Ranks ended by horovodrun's own SIGTERM afterwards do not take the blame."""
    tail = (
        "[1]<stderr>:horovod-fleet rank exit: rank 1 killed by SIGKILL\n"
        "Process 1 exit with status code 255.\n"
        "[0]<stderr>:horovod-fleet rank exit: rank 0 killed by SIGTERM\n"
        "Process 0 exit with status code 143.\n"
        "Process name: 1\nExit code: 255\n"
    )
    assert failures.failure_reason(tail, "10.0.1.5 slots=1\n10.0.1.23 slots=1\n") == (
        "rank 1 on node 1 (10.0.1.23) killed by SIGKILL (out of memory?)"
    )


def test_rank_wrapper_names_the_signal_and_passes_the_code_on(capfd):
    from bootstrap.fleet import rank

    assert rank.main(["bash", "-c", "exit 3"]) == 3
    assert rank.main(["bash", "-c", "kill -KILL $$"]) == 137
    assert "horovod-fleet rank exit: rank ? killed by SIGKILL" in capfd.readouterr().err


# ---------------------------------------------------------------- known causes before ranks

HOSTS = "10.0.1.5 slots=1\n10.0.1.23 slots=1\n"
HOROVOD_SHUT_DOWN = (
    "[1]<stderr>:tensorflow.python.framework.errors_impl.FailedPreconditionError: Horovod has "
    "been shut down. This was caused by an exception on one of the ranks\n"
    "Process name: 1\nExit code: 1\n"
)


def test_a_full_disk_names_enospc_the_path_and_the_filesystem_of_a_lone_process():
    """Before: 'rank 1 on 10.0.1.23 exited 1; its last words: ... Horovod has been shut down'.
    Without a hostfile the process ran on this host (the preprocessing node): its disk is
    described."""
    tail = (
        "[0]<stdout>:Epoch 3/10\n"
        "[0]<stderr>:tensorflow.python.framework.errors_impl.ResourceExhaustedError: "
        "/data/model/checkpoints/ckpt-40_temp/part-00000-of-00001.data-00000-of-00001.tempstate1"
        "; No space left on device [Op:SaveV2]\n" + HOROVOD_SHUT_DOWN
    )
    looked = []

    def filesystem(path):
        looked.append(path)
        return "filesystem /dev/md0 (xfs) mounted on /data: 12 KiB free of 7.0 TiB"

    reason = failures.failure_reason(tail, "", filesystem)
    assert reason == (
        "no space left on device (ENOSPC) writing /data/model/checkpoints/ckpt-40_temp/"
        "part-00000-of-00001.data-00000-of-00001.tempstate1 on rank 0; "
        "filesystem /dev/md0 (xfs) mounted on /data: 12 KiB free of 7.0 TiB"
    )
    assert looked == [
        "/data/model/checkpoints/ckpt-40_temp/part-00000-of-00001.data-00000-of-00001.tempstate1"
    ]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_fleet_rank_s_full_disk_is_never_described_by_the_head_s_filesystem(rank):
    """The fault rehearsal found the head naming its own disk for rank 0's full one: no rank of
    a fleet runs on the head."""
    tail = f"[{rank}]<stderr>:OSError: [Errno 28] No space left on device: '/data/model/x.json'\n"
    reason = failures.failure_reason(tail, HOSTS, lambda path: "the head's disk")
    host = ["10.0.1.5", "10.0.1.23"][rank]
    assert reason == (
        f"no space left on device (ENOSPC) writing /data/model/x.json on rank {rank} ({host})"
    )


def test_the_filesystem_of_a_path_is_read_from_this_node_s_mount_table(tmp_path):
    described = failures.describe_filesystem(str(tmp_path / "not" / "yet" / "there"))
    assert described.startswith("filesystem ") and " mounted on /" in described
    assert " free of " in described


def test_a_checksum_mismatch_is_called_a_corrupt_checkpoint_not_a_flag_mismatch():
    tail = (
        "[0]<stderr>:error: checkpoint /data/model/checkpoints/ckpt-40 does not fit this "
        "model/flags: Checksum does not match: stored 2155375837 vs. calculated on the "
        "restored bytes 4069357345\n" + HOROVOD_SHUT_DOWN
    )
    reason = failures.failure_reason(tail, HOSTS)
    assert reason.startswith("corrupt checkpoint (checksum does not match) on rank 0 (10.0.1.5): ")
    assert "ckpt-40" in reason


def test_a_collective_timeout_is_named_before_the_rank_that_died_of_it():
    """Rank 1 timed out and died of it; rank 0, which reported no timeout, is the one named."""
    tail = (
        "[1]<stderr>:[/tmp/pip/gloo/transport/tcp/pair.cc:574] Read timeout [10.0.1.5]:4242\n"
        + HOROVOD_SHUT_DOWN
    )
    assert failures.failure_reason(tail, HOSTS) == (
        "collective timeout: rank 0 on node 0 (10.0.1.5) stopped answering rank 1 on node 1 "
        "(10.0.1.23), which timed out: Read timeout [10.0.1.5]:4242"
    )


def test_the_model_dir_is_synced_as_soon_as_a_checkpoint_is_written(tmp_path, monkeypatch):
    """Before: only every checkpoint_sync_s (60 s), so a killed bootstrap lost up to a minute
    of checkpoints; now a new checkpoints/checkpoint is uploaded within CheckpointSync.WATCH_S."""
    monkeypatch.setattr(checkpoints.CheckpointSync, "WATCH_S", 0.05)
    uploads, lines = [], []

    class Store:
        model_dir = tmp_path
        cfg = parse(train_doc())

        def upload(self):
            uploads.append(time.monotonic())

    sync = checkpoints.CheckpointSync(Store(), 3600, lines.append)
    sync.start()
    time.sleep(0.3)
    assert uploads == []  # nothing written, and the interval is an hour
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    deadline = time.time() + 5
    while not lines and time.time() < deadline:
        time.sleep(0.05)
    sync.stop()
    assert len(uploads) == 1
    assert lines == [
        "checkpoint ckpt-7 is in s3://fleet-data/runs/r1/model/checkpoints/ (a restarted or "
        "rerun attempt resumes from it)"
    ]


def test_run_horovodrun_composes_training_s_reason_lost_members_first(train_config, monkeypatch):
    cfg = train_config()
    hostfile = Path(cfg.state_dir) / "hostfile"
    hostfile.parent.mkdir(parents=True, exist_ok=True)
    hostfile.write_text("10.0.1.5 slots=1\n10.0.1.23 slots=1\n")
    seen = {}

    def horovodrun(command, env, log_path, keep, on_start=None):
        seen.update(command=command, log_path=log_path, keep=keep)
        return 1, "[1]<stderr>:error: bad flag\n"

    monkeypatch.setattr(launch, "stream", horovodrun)
    with pytest.raises(RuntimeError) as failed:
        launch.run_horovodrun(
            cfg, hostfile, Path("/k"), 2, ["t"], {}, "train.log",
            lost=lambda failed_at: ["node 1 (i-1, 10.0.1.23) lost"], log=lambda line: None,
        )  # fmt: skip
    assert type(failed.value) is launch.TrainingFailed
    assert str(failed.value) == (
        "node 1 (i-1, 10.0.1.23) lost; horovodrun exited 1: [1]<stderr>:error: bad flag "
        "(details in train.log)"
    )
    assert failed.value.cause == "node_lost"  # a node named lost is the cause, not the flag
    assert seen["command"][:3] == ["python3", "-m", "bootstrap.fleet.supervision"]  # guarded
    assert seen["log_path"] == Path(cfg.log_dir) / "train.log" and seen["keep"] == 1000


def test_run_horovodrun_as_the_benchmark_runs_it(train_config, monkeypatch, tmp_path):
    class Refused(launch.TrainingFailed):
        pass

    cfg = train_config(network_interface="eth9")
    seen = {}

    def horovodrun(command, env, log_path, keep, on_start=None):
        seen.update(command=command, keep=keep)
        return 2, "last words\n"

    monkeypatch.setattr(launch, "stream", horovodrun)
    with pytest.raises(Refused) as failed:
        launch.run_horovodrun(
            cfg, tmp_path / "absent-hostfile", Path("/k"), 1, ["b"], {}, "allreduce-check.log",
            keep=5, interface="eth9", name_hosts=False, details=False, error=Refused,
            log=lambda line: None,
        )  # fmt: skip
    assert str(failed.value) == "horovodrun exited 2: last words"
    assert failed.value.cause == "unknown"
    horovodrun_at = seen["command"].index("horovodrun")  # under the supervision guard
    assert seen["command"][:3] == ["python3", "-m", "bootstrap.fleet.supervision"]
    at = seen["command"].index("--network-interface")
    assert at > horovodrun_at and seen["command"][at + 1] == "eth9"
    assert seen["keep"] == 5


def interruption_record(s3, index: int, noticed_at: str) -> None:
    doc = {"index": index, "instance_id": f"i-{index}", "ip": f"10.0.1.{index}",
           "action": "terminate", "time": "2026-11-25T14:02:00Z", "noticed_at": noticed_at}  # fmt: skip
    s3.put_object(Bucket="fleet-data", Key=f"runs/r1/interruptions/{index}.json",
                  Body=json.dumps(doc).encode())  # fmt: skip


def test_a_spot_interruption_of_this_attempt_names_the_node_and_the_step(
    train_config, s3, tmp_path
):
    cfg = train_config()
    started = time.time() - 60
    assert spot.interruption_reason(s3, cfg, tmp_path, started, started) is None
    (tmp_path / "interrupted.json").write_text(
        json.dumps({"reason": "SIGTERM", "checkpoint": "ckpt-1234", "step": 1234})
    )
    # The trainer stopped, but no notice: not a Spot interruption.
    assert spot.interruption_reason(s3, cfg, tmp_path, started, started) is None
    interruption_record(s3, 2, stamp_at(started - 3600))  # an earlier attempt's
    interruption_record(s3, 1, stamp_at(started + 5))
    assert spot.interruption_reason(s3, cfg, tmp_path, started, started) == (
        "Spot interruption of node 1 (i-1, 10.0.1.1), terminate at 2026-11-25T14:02:00Z: every "
        "rank stopped at step 1234 and its checkpoint was saved"
    )
    # An interrupted.json restored from S3 with the checkpoints is the previous attempt's.
    assert spot.interruption_reason(s3, cfg, tmp_path, started, time.time() + 5) is None
