"""The leader's launch: horovodrun command and environment, log streaming, checkpoints to and from
S3, results upload and DONE.json (written last, also on failure)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from bootstrap import allreduce_check
from bootstrap.aws import run_s5cmd
from bootstrap.node_config import TrainConfig
from bootstrap.rendezvous import utc_stamp

# Horovod's GPU settings: one rank per GPU and a flat NCCL allreduce over all of them, which
# crosses nodes through the image's aws-ofi-nccl plugin on EFA. No HOROVOD_HIERARCHICAL_ALLREDUCE:
# in Horovod 0.28.1 it reduce-scatters over NCCL, then copies to host memory and runs
# MPI_Allreduce across nodes, which horovodrun pins to Open MPI's TCP path (-mca pml ob1)
# (https://github.com/horovod/horovod/blob/v0.28.1/horovod/common/ops/nccl_operations.cc,
# NCCLHierarchicalAllreduce; horovod/runner/mpi_run.py, _OMPI_FLAGS).
GPU_ENV = {
    "HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024),
    "HOROVOD_CYCLE_TIME": "1",
    "NCCL_DEBUG": "INFO",  # the allreduce check reads the network NCCL chose from this
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    "TF_CPP_MIN_LOG_LEVEL": "1",
    # Kernel launches get their own threads instead of queueing behind the input pipeline's
    # JPEG decoding on every vCPU (TensorFlow's GPU performance guide).
    "TF_GPU_THREAD_MODE": "gpu_private",
    "TF_GPU_THREAD_COUNT": "2",
    # GPU i for CUDA is GPU i for nvidia-smi: each rank binds to the socket of its GPU by index.
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
}
# libfabric's EFA provider for aws-ofi-nccl. NCCL_PROTO=simple: EFA's SRD does not deliver in
# order, which NCCL's LL and LL128 protocols assume. No NCCL_NET_GDR_LEVEL: GPUDirect RDMA is
# detected by the plugin where the type has it, and p3dn has none.
EFA_ENV = {
    "FI_PROVIDER": "efa",
    "NCCL_PROTO": "simple",
}
# Only types whose EFA has RDMA read (stacks/instance_types.py efa_rdma_read, node.json
# efa_rdma_read): on p3dn's first-generation EFA this makes libfabric abort.
EFA_RDMA_ENV = {"FI_EFA_USE_DEVICE_RDMA": "1"}
# What bootstrap.allreduce_check reads: the bus bandwidth below which it fails, and the type.
ALLREDUCE_FLOOR_ENV = allreduce_check.FLOOR_ENV
INSTANCE_TYPE_ENV = allreduce_check.TYPE_ENV


# Where the EFA installer puts libfabric and the aws-ofi-nccl plugin (the directory moved
# between releases; the training image has /opt/amazon/ofi-nccl). NCCL loads the plugin only
# from LD_LIBRARY_PATH; without it NCCL falls back to sockets, which the allreduce check catches.
EFA_LIBRARY_DIRS = ("/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib")


def launcher_env(
    cfg: TrainConfig, base: dict[str, str], is_dir: Callable[[str], bool] = os.path.isdir
) -> dict[str, str]:
    """The environment horovodrun exports to every rank, from node.json's per-type settings."""
    env = dict(base)
    if cfg.gpus_per_node:
        env.update(GPU_ENV)
        env[INSTANCE_TYPE_ENV] = cfg.instance_type
        if cfg.allreduce_floor_gbps:
            env[ALLREDUCE_FLOOR_ENV] = f"{cfg.allreduce_floor_gbps:g}"
        if cfg.efa:
            env.update(EFA_ENV)
            if cfg.efa_rdma_read:
                env.update(EFA_RDMA_ENV)
            found = [d for d in EFA_LIBRARY_DIRS if is_dir(d)]
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [*found, base.get("LD_LIBRARY_PATH")]))
    return env


def horovodrun_command(
    cfg: TrainConfig, hostfile: Path, key: Path, ranks: int, program: list[str]
) -> list[str]:
    """horovodrun over MPI (the AMI's EFA OpenMPI) on GPU nodes, over Gloo on CPU nodes; ssh with
    the run's key on the configured port. horovodrun exports the launcher's environment to
    every rank, and adds the OpenMPI flags itself (-bind-to none -map-by slot, pml ob1): MPI
    carries only Horovod's coordination, the gradients go through NCCL. Each rank binds itself
    to the CPUs of its GPU's socket (trainer.train), which mpirun cannot know."""
    cmd = [
        "horovodrun",
        "--mpi" if cfg.gpus_per_node else "--gloo",
        "-np",
        str(ranks),
        "--hostfile",
        str(hostfile),
        "--ssh-port",
        str(cfg.ssh_port),
        "--ssh-identity-file",
        str(key),
        "--start-timeout",
        str(int(min(cfg.rendezvous_timeout_s, 600))),
    ]
    if cfg.network_interface:
        cmd += ["--network-interface", cfg.network_interface]
    mpirun = shutil.which("mpirun")
    if cfg.gpus_per_node and mpirun:
        # The ssh sessions that start OpenMPI's daemons on the other nodes get a bare PATH.
        cmd += [f"--mpi-args=--prefix {Path(mpirun).resolve().parent.parent}"]
    return cmd + program


def trainer_command(cfg: TrainConfig, data_dir: Path, model_dir: Path) -> list[str]:
    return [
        "python3",
        "-m",
        "trainer.train",
        "--data-dir",
        str(data_dir),
        "--model-dir",
        str(model_dir),
        *cfg.trainer_flags(),
    ]


def stream(cmd: list[str], env: dict[str, str], log_path: Path, keep: int = 200) -> tuple[int, str]:
    """Run cmd, copying its output line by line to log_path and stdout; returns the exit code
    and the last `keep` lines (for the failure reason and transport checks)."""
    tail: deque[str] = deque(maxlen=keep)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        log_path.open("a") as log,
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as proc,
    ):
        for line in proc.stdout:
            log.write(line)
            log.flush()
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line)
    return proc.returncode, "".join(tail)


def model_prefix(cfg: TrainConfig) -> str:
    return f"s3://{cfg.bucket}/{cfg.runs_prefix}model/"


def restore_model_dir(s3, cfg: TrainConfig, model_dir: Path) -> bool:
    """Bring the run's model dir back from S3 so the trainer resumes from its last checkpoint."""
    model_dir.mkdir(parents=True, exist_ok=True)
    listing = s3.list_objects_v2(Bucket=cfg.bucket, Prefix=f"{cfg.runs_prefix}model/", MaxKeys=1)
    if not listing.get("KeyCount"):
        return False
    run_s5cmd("sync", f"{model_prefix(cfg)}*", f"{model_dir}/")
    return True


def sync_model_dir(cfg: TrainConfig, model_dir: Path) -> None:
    if model_dir.is_dir() and any(model_dir.iterdir()):
        run_s5cmd("sync", f"{model_dir}/", model_prefix(cfg))


class CheckpointSync(threading.Thread):
    """Copies the model dir to S3 every checkpoint_sync_s while training runs: the instance
    store does not survive a stop, so S3 holds what a rerun resumes from."""

    def __init__(self, cfg: TrainConfig, model_dir: Path, log):
        super().__init__(daemon=True)
        self.cfg, self.model_dir, self.log = cfg, model_dir, log
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.cfg.checkpoint_sync_s):
            try:
                sync_model_dir(self.cfg, self.model_dir)
            except RuntimeError as exc:  # the next round or the final sync retries
                self.log(f"checkpoint sync to S3 failed, retrying later: {exc}")

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def upload_logs(cfg: TrainConfig) -> None:
    logs = Path(cfg.log_dir)
    if logs.is_dir() and any(logs.glob("*.log")):
        run_s5cmd(
            "cp",
            f"{logs}/*.log",
            f"s3://{cfg.bucket}/{cfg.runs_prefix}logs/node-{cfg.node_index}/",
        )


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def done_document(
    cfg: TrainConfig,
    status: str,
    reason: str | None,
    model_dir: Path | None,
    now: float,
    started: float | None,
) -> dict:
    """DONE.json per docs/contracts.md; duration_s is the trainer's, else the leader's wall time."""
    succeeded = status == "succeeded"
    evaluation = read_json(model_dir / "eval.json") if model_dir and succeeded else {}
    training = read_json(model_dir / "train.json") if model_dir else {}
    return {
        "run": cfg.run,
        "status": status,
        "reason": reason,
        "top1": evaluation.get("top1"),
        "top5": evaluation.get("top5"),
        "epochs": training.get("epochs", cfg.trainer.get("epochs")),
        "duration_s": training.get("duration_s") or (round(now - started, 1) if started else None),
        "images_per_s": training.get("images_per_s") if succeeded else None,
        "end_to_end_images_per_s": training.get("end_to_end_images_per_s") if succeeded else None,
        "allreduce_busbw_gbps": allreduce_busbw_gbps(Path(cfg.log_dir) / "allreduce-check.log"),
        "finished_at": utc_stamp(now),
    }


def allreduce_busbw_gbps(check_log: Path) -> float | None:
    """The bus bandwidth the pre-training allreduce check measured (None: it did not run)."""
    try:
        summary = allreduce_check.parse_summary(check_log.read_text(errors="replace"))
    except OSError:
        return None
    return summary["busbw_gbps"] if summary else None


def write_done(s3, cfg: TrainConfig, doc: dict) -> None:
    s3.put_object(
        Bucket=cfg.bucket,
        Key=f"{cfg.runs_prefix}DONE.json",
        Body=json.dumps(doc, indent=2).encode(),
        ContentType="application/json",
    )


def clear_done(s3, cfg: TrainConfig) -> None:
    """A rerun starts by removing the previous attempt's DONE.json, so nothing reacts to it."""
    s3.delete_object(Bucket=cfg.bucket, Key=f"{cfg.runs_prefix}DONE.json")


TRAINER_ERROR = re.compile(r"(?<![A-Za-z])error: ")


def failure_reason(tail: str) -> str:
    """The most telling line of a failed run: the trainer's `error: ...` line if any."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    # The trainer's lowercase `error:` (after horovodrun's `[1]<stderr>:` prefix), not the
    # `RuntimeError: Horovod detected that one or more processes exited` horovodrun adds last.
    errors = [line for line in lines if TRAINER_ERROR.search(line)]
    return (errors or lines or ["no output"])[-1][-400:]
