"""The head's launch: horovodrun's command and environment, its output streamed to the log,
and a failure turned into one reason (bootstrap/head/failures.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from bootstrap import aws
from bootstrap.fleet import allreduce_check, supervision
from bootstrap.head import watchdog
from bootstrap.head.failures import classify, stall_inspector_names
from bootstrap.node_config import TrainConfig
from contract import causes

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
# A CPU fleet (the rehearsal's, gpus_per_node 0) trains on its CPUs: oneDNN's kernels for them.
# TensorFlow 2.15 on Linux turns oneDNN on by itself only where the CPU has AVX512_VNNI,
# AVX512_BF16, AVX_VNNI or AMX (DefaultOneDnnPolicy in
# https://github.com/tensorflow/tensorflow/blob/r2.15/tensorflow/core/util/port.cc); with AVX2
# alone its own Conv2DBackpropInput takes about 50 times oneDNN's at ResNet's 512-channel stage,
# and one rank trains ResNet-18 at 32 px at 28.3 img/s instead of 143.5 (docs/trainer.md, "CPU
# training"). GPU nodes keep TensorFlow's default: their convolutions run on the GPU. A value
# the head already has (TF_ENABLE_ONEDNN_OPTS=0 to compare) is kept.
CPU_ENV = {"TF_ENABLE_ONEDNN_OPTS": "1"}
# libfabric's EFA provider for aws-ofi-nccl. No NCCL_PROTO: the image's plugin sets "simple"
# itself where EFA cannot order bytes for NCCL's LL protocols and leaves them on where it can
# (https://github.com/aws/aws-ofi-nccl/pull/850, https://github.com/aws/aws-ofi-nccl/pull/280;
# forcing it was needed only up to aws-ofi-nccl 1.5). No NCCL_NET_GDR_LEVEL: the plugin detects
# GPUDirect RDMA where the type has it, and the allreduce check proves it was used.
EFA_ENV = {"FI_PROVIDER": "efa"}
# Only GPUDirect types (node.json gpudirect), whose EFA has RDMA read: on first-generation EFA
# without it this makes libfabric abort (https://github.com/ofiwg/libfabric/pull/8661).
EFA_RDMA_ENV = {"FI_EFA_USE_DEVICE_RDMA": "1"}
# What bootstrap.fleet.allreduce_check reads: the bus bandwidth below which it fails, and the type.


# How long a Gloo collective waits on a peer before it fails the attempt: node.json
# `collective_timeout_s`. Horovod reads it per rank (horovod/common/gloo/gloo_context.cc,
# GetIntEnvOrDefault(HOROVOD_GLOO_TIMEOUT_SECONDS, 30), whole seconds) for Gloo's controller and
# collectives, which horovodrun --gloo chooses (horovod/runner/gloo_run.py: HOROVOD_CONTROLLER and
# HOROVOD_CPU_OPERATIONS "gloo"): every horovodrun the head starts. On GPU nodes Gloo carries
# Horovod's coordination and the CPU tensors, NCCL the GPU collectives, whose hang (NCCL has no
# timeout) is the progress watchdog's (bootstrap/head/watchdog.py).
# https://github.com/horovod/horovod/blob/v0.28.1/horovod/common/gloo/gloo_context.cc
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
# Every STALL_CHECK_S, Horovod's rank 0 lists the ranks that have not submitted a tensor the
# others wait on ("Missing ranks:", horovod/common/stall_inspector.cc, default 60 s): a rank
# stuck in Python. Well under the watchdog's 10 minutes, so a stall it ends has that list in its
# tail. Under the MPI controller only: Horovod 0.28.1's Gloo controller never lists a rank (it
# reserves global_ranks_ without filling its size, horovod/common/gloo/gloo_controller.cc,
# GlooController::DoInitialization; seen in a two-rank run stuck for 90 s with a 3 s check).
# https://github.com/horovod/horovod/blob/v0.28.1/horovod/common/stall_inspector.cc
STALL_CHECK_ENV = "HOROVOD_STALL_CHECK_TIME_SECONDS"
STALL_CHECK_S = 60


# Where the EFA installer puts libfabric and the aws-ofi-nccl plugin (the directory moved
# between releases; the training image has /opt/amazon/ofi-nccl). NCCL loads the plugin only
# from LD_LIBRARY_PATH; without it NCCL falls back to sockets, which the allreduce check catches.
EFA_LIBRARY_DIRS = ("/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib")


def launcher_env(
    cfg: TrainConfig, base: dict[str, str], is_dir: Callable[[str], bool] = os.path.isdir
) -> dict[str, str]:
    """The environment horovodrun exports to every rank, from node.json's per-type settings and
    its collective timeout."""
    env = dict(base)
    env[GLOO_TIMEOUT_ENV] = str(cfg.collective_timeout_s)
    env[STALL_CHECK_ENV] = str(STALL_CHECK_S)
    if cfg.gpus_per_node:
        env.update(GPU_ENV)
        env[allreduce_check.TYPE_ENV] = cfg.instance_type
        if cfg.allreduce_floor_gbps:
            env[allreduce_check.FLOOR_ENV] = f"{cfg.allreduce_floor_gbps:g}"
        if cfg.efa:
            env.update(EFA_ENV)
            if cfg.gpudirect:
                env.update(EFA_RDMA_ENV)
            found = [d for d in EFA_LIBRARY_DIRS if is_dir(d)]
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [*found, base.get("LD_LIBRARY_PATH")]))
    else:
        env = {**CPU_ENV, **env}
    return env


def horovodrun_command(
    cfg: TrainConfig,
    hostfile: Path,
    key: Path,
    ranks: int,
    program: list[str],
    interface: str | None = None,
) -> list[str]:
    """horovodrun over Gloo from the head, on every node the hostfile names; ssh with the run's
    key on the nodes' port. Gloo, as the elastic training's must be (bootstrap/head/elastic.py):
    it carries Horovod's coordination, NCCL the GPUs' collectives. horovodrun exports the
    launcher's environment to every rank; each rank binds itself to the CPUs of its GPU's socket
    (trainer.train). `interface`: the nodes' interface name, which the head also has
    (elastic.alias_interface)."""
    cmd = [
        "horovodrun",
        "--gloo",
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
    if interface:
        cmd += ["--network-interface", interface]
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


class TrainingFailed(RuntimeError):
    """horovodrun's job failed: the reason for people, the cause for the run controller."""

    def __init__(self, reason: str, cause: str = causes.UNKNOWN):
        super().__init__(reason)
        self.cause = cause


STOP_GRACE_S = 30  # what a stopped horovodrun gets to end its ranks (and their last checkpoint)
# What a lost node leaves its peers failing of: a collective or Gloo's rendezvous timing out on
# it, a rank aborted by that (Gloo's rendezvous throws from Horovod's background thread:
# SIGABRT), a rank's ssh dropped. Named lost, the node is the cause.
WAITED_ON_THE_LOST = (causes.COLLECTIVE_TIMEOUT, causes.RANK_KILLED, causes.NODE_LOST)


def stream(
    cmd: list[str],
    env: dict[str, str],
    log_path: Path,
    keep: int = 200,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> tuple[int, str]:
    """Run cmd, copying its output line by line to log_path and stdout; returns the exit code
    and the last `keep` lines (for the failure reason and transport checks). Interrupted (the
    node's SIGTERM), it passes the SIGTERM on and gives cmd STOP_GRACE_S to end. on_start gets
    the process (the progress watchdog ends it with end_process)."""
    tail: deque[str] = deque(maxlen=keep)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def copy(lines, log) -> None:
        for line in lines:
            log.write(line)
            log.flush()
            with contextlib.suppress(OSError):  # stdout's reader may be gone in a shutdown
                sys.stdout.write(line)
                sys.stdout.flush()
            tail.append(line)

    with (
        log_path.open("a") as log,
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as proc,
    ):
        if on_start is not None:
            on_start(proc)
        try:
            copy(proc.stdout, log)
        except BaseException:
            proc.terminate()
            # Its last lines (a rank's final checkpoint, its error) still go to the log.
            rest = threading.Thread(target=copy, args=(proc.stdout, log), daemon=True)
            rest.start()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            rest.join(5)
            raise
    return proc.returncode, "".join(tail)


def end_process(proc: subprocess.Popen) -> None:
    """SIGTERM now (horovodrun passes it to its ranks), SIGKILL if still alive STOP_GRACE_S
    later: a rank hung in a collective may not answer the first."""
    proc.terminate()

    def kill_if_alive() -> None:
        if proc.poll() is None:
            proc.kill()

    killer = threading.Timer(STOP_GRACE_S, kill_if_alive)
    killer.daemon = True
    killer.start()


def run_horovodrun(
    cfg: TrainConfig,
    hostfile: Path,
    key: Path,
    ranks: int,
    program: list[str],
    env: dict[str, str],
    log_name: str,
    *,
    keep: int = 1000,
    interface: str | None = None,
    command: list[str] | None = None,
    progress: Path | None = None,
    name_hosts: bool = True,
    lost: Callable[[float], list[str]] | None = None,
    details: bool = True,
    error: type[TrainingFailed] | None = None,
    log: Callable[[str], None] = aws.log,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> str:
    """Run program on `ranks` ranks of hostfile under horovodrun (horovodrun_command), its output
    streamed to <log_dir>/log_name; returns the last `keep` lines. horovodrun dies with this
    process (supervision.guarded): no run goes on unsupervised. A non-zero exit raises
    error(reason, cause) (TrainingFailed unless given):

    - interface: horovodrun's --network-interface; command: the whole command instead of
      horovodrun_command's (the elastic training's, bootstrap/head/elastic.py);
    - progress: the progress.json a watchdog.ProgressWatchdog watches (a hung collective keeps
      the GPUs busy: only the trainer's own progress tells); a stall ends horovodrun and is
      the reason, followed by the ranks Horovod's stall inspector lists as missing;
    - on_start(process): horovodrun's process once started (what may end it early);
    - the reason is `horovodrun exited N: ` classify's, which names each rank's host when
      name_hosts, after the nodes `lost(failed_at)` names (supervision.lost_nodes), joined by
      "; "; with details, `(details in LOG_NAME)` follows. The cause is node_lost when a node
      is named, else classify's (contract/causes.py)."""
    error = error or TrainingFailed
    command = command or horovodrun_command(cfg, hostfile, key, ranks, program, interface)
    log("running: " + " ".join(command))
    running: list[subprocess.Popen] = []

    def end_stalled(reason: str) -> None:
        log(reason)
        end_process(running[0])

    def watch(proc: subprocess.Popen) -> None:
        running.append(proc)
        if stall:
            stall.start()
        if on_start:
            on_start(proc)

    stall = watchdog.ProgressWatchdog(progress, end_stalled) if progress is not None else None
    try:
        code, tail = stream(
            supervision.guarded(command),
            env,
            Path(cfg.log_dir) / log_name,
            keep,
            watch if stall or on_start else None,
        )
    finally:
        if stall:
            stall.stop()
    where = f" (details in {log_name})" if details else ""
    hostfile_text = hostfile.read_text() if code and name_hosts else ""
    if code and stall and stall.reason:
        missing = stall_inspector_names(tail, hostfile_text)
        reason = "; ".join(filter(None, [stall.reason, missing]))
        raise error(f"{reason}{where}", causes.STALLED)
    if code:
        failed_at = time.time()
        failure = classify(tail, hostfile_text)
        named = lost(failed_at) if lost else []
        said = failure.reason
        if named and failure.cause in WAITED_ON_THE_LOST:
            # The others failed waiting for the node named lost (a collective or Gloo's
            # rendezvous timed out, a rank aborted of it): the peers that waited are not blamed.
            said = "the ranks left failed waiting for it"
        reason = "; ".join([*named, f"horovodrun exited {code}: {said}"])
        raise error(f"{reason}{where}", causes.NODE_LOST if named else failure.cause)
    return tail
