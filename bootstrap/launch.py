"""The leader's launch: horovodrun command and environment, log streaming, checkpoints to and from
S3, results upload and DONE.json (written last, also on failure)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from bootstrap import allreduce_check, aws, checkpoints, supervision, watchdog
from bootstrap.node_config import TrainConfig
from bootstrap.rank import MARK as RANK_MARK
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
# libfabric's EFA provider for aws-ofi-nccl. No NCCL_PROTO: the image's plugin sets "simple"
# itself where EFA cannot order bytes for NCCL's LL protocols and leaves them on where it can
# (https://github.com/aws/aws-ofi-nccl/pull/850, https://github.com/aws/aws-ofi-nccl/pull/280;
# forcing it was needed only up to aws-ofi-nccl 1.5). No NCCL_NET_GDR_LEVEL: the plugin detects
# GPUDirect RDMA where the type has it, and the allreduce check proves it was used.
EFA_ENV = {"FI_PROVIDER": "efa"}
# Only GPUDirect types (node.json gpudirect), whose EFA has RDMA read: on first-generation EFA
# without it this makes libfabric abort (https://github.com/ofiwg/libfabric/pull/8661).
EFA_RDMA_ENV = {"FI_EFA_USE_DEVICE_RDMA": "1"}
# What bootstrap.allreduce_check reads: the bus bandwidth below which it fails, and the type.


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
        env[allreduce_check.TYPE_ENV] = cfg.instance_type
        if cfg.allreduce_floor_gbps:
            env[allreduce_check.FLOOR_ENV] = f"{cfg.allreduce_floor_gbps:g}"
        if cfg.efa:
            env.update(EFA_ENV)
            if cfg.gpudirect:
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


STOP_GRACE_S = 30  # what a stopped horovodrun gets to end its ranks (and their last checkpoint)


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
    one_host: bool = False,
    progress: Path | None = None,
    name_hosts: bool = True,
    lost: Callable[[float], list[str]] | None = None,
    details: bool = True,
    error: Callable[[str], Exception] = RuntimeError,
    log: Callable[[str], None] = aws.log,
) -> str:
    """Run program on `ranks` ranks of hostfile under horovodrun (horovodrun_command), its output
    streamed to <log_dir>/log_name; returns the last `keep` lines. horovodrun dies with this
    process (supervision.guarded): no run goes on unsupervised. A non-zero exit raises
    error(reason):

    - one_host: a one-host job, which horovodrun runs on 127.0.0.1: no --network-interface, which
      the rehearsal's node interface would make horovodrun refuse;
    - progress: the progress.json a watchdog.ProgressWatchdog watches (a hung collective keeps
      the GPUs busy: only the trainer's own progress tells); a stall ends horovodrun and is
      the reason;
    - the reason is `horovodrun exited N: ` failure_reason's, which names each rank's host when
      name_hosts, after the nodes `lost(failed_at)` names (supervision.lost_nodes), joined by
      "; "; with details, `(details in LOG_NAME)` follows."""
    command = horovodrun_command(cfg, hostfile, key, ranks, program)
    if one_host and "--network-interface" in command:
        at = command.index("--network-interface")
        del command[at : at + 2]
    log("running: " + " ".join(command))
    running: list[subprocess.Popen] = []

    def end_stalled(reason: str) -> None:
        log(reason)
        end_process(running[0])

    def watch(proc: subprocess.Popen) -> None:
        running.append(proc)
        stall.start()

    stall = watchdog.ProgressWatchdog(progress, end_stalled) if progress is not None else None
    try:
        code, tail = stream(
            supervision.guarded(command),
            env,
            Path(cfg.log_dir) / log_name,
            keep,
            watch if stall else None,
        )
    finally:
        if stall:
            stall.stop()
    where = f" (details in {log_name})" if details else ""
    if code and stall and stall.reason:
        raise error(f"{stall.reason}{where}")
    if code:
        failed_at = time.time()
        reason = failure_reason(tail, hostfile.read_text() if name_hosts else "")
        named = lost(failed_at) if lost else []
        cause = "; ".join([*named, f"horovodrun exited {code}: {reason}"])
        raise error(f"{cause}{where}")
    return tail


def model_prefix(cfg: TrainConfig) -> str:
    return f"s3://{cfg.bucket}/{cfg.runs_prefix}model/"


class RefusedFreshStart(RuntimeError):
    """S3 holds the run's checkpoints, and this attempt could not put them where the trainer
    resumes from: training now would start the run over."""


CHECKPOINT_STATE = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.MULTILINE)


def check_resumable(cfg: TrainConfig, model_dir: Path, remote: dict[str, int]) -> None:
    """The trainer resumes from checkpoints/checkpoint's newest entry: if S3 holds a checkpoint,
    that entry and its index must be here, or the trainer would start over."""
    indexes = [k for k in remote if k.startswith("checkpoints/") and k.endswith(".index")]
    if not indexes:
        return
    state = model_dir / "checkpoints" / "checkpoint"
    found = CHECKPOINT_STATE.search(state.read_text()) if state.is_file() else None
    newest = Path(found.group(1)).name if found else None
    if newest is None or not (model_dir / "checkpoints" / f"{newest}.index").is_file():
        why = f"{newest}.index is not here" if newest else "checkpoints/checkpoint names none"
        raise RefusedFreshStart(
            f"S3 holds {len(indexes)} checkpoint(s) of run {cfg.run} in {model_prefix(cfg)}"
            f"checkpoints/ but this node cannot resume from them ({why}): refusing to start "
            f"run {cfg.run} over; to start a new run, deploy with another -c run=NAME"
        )


class ModelStore:
    """The run's model dir on this node and in S3 (runs/<run>/model/).

    Uploads are refused until this attempt has restored what S3 held (or seen that it held
    nothing): an attempt that never saw the run's checkpoints never overwrites them. Each upload
    copies only the files that changed since the last verified one."""

    def __init__(self, s3, cfg: TrainConfig, model_dir: Path, log=aws.log):
        self.s3, self.cfg, self.model_dir, self.log = s3, cfg, model_dir, log
        self.prefix = f"{cfg.runs_prefix}model/"
        self.restored = False
        self.uploaded: dict[str, tuple[int, int]] = {}

    def local_files(self) -> dict[str, tuple[int, int]]:
        if not self.model_dir.is_dir():
            return {}
        found = {}
        for path in self.model_dir.rglob("*"):
            # TensorFlow writes a checkpoint under <name>_temp/ and renames it when complete
            # (tensorflow/python/checkpoint/functional_saver.py, TF 2.15.1).
            if any("_temp" in part for part in path.relative_to(self.model_dir).parts):
                continue
            with contextlib.suppress(OSError):  # the trainer may delete an old checkpoint
                if path.is_file():
                    stat = path.stat()
                    found[str(path.relative_to(self.model_dir))] = (stat.st_size, stat.st_mtime_ns)
        return found

    def restore(self) -> bool:
        """Bring the run's model dir back from S3, verified, so the trainer resumes from its last
        checkpoint; returns whether S3 held anything. An S3 that cannot be listed, a copy that
        does not arrive, or checkpoints the trainer could not resume from stop the step."""
        self.model_dir.mkdir(parents=True, exist_ok=True)
        listed = aws.list_sizes(self.s3, self.cfg.bucket, self.prefix)
        # The sha256 sidecars are read from S3, not copied into the trainer's model dir.
        sidecars = {n for n in listed if checkpoints.is_sidecar(n)}
        remote = {n: size for n, size in listed.items() if n not in sidecars}
        for name in remote:  # S3 is the truth: a stale local file of the same size is not
            (self.model_dir / name).unlink(missing_ok=True)
        aws.download(
            self.cfg.bucket, self.prefix, remote, self.model_dir,
            f"restoring {model_prefix(self.cfg)}", note=self.log,
        )  # fmt: skip

        def recorded(name: str) -> str | None:
            if name + checkpoints.SIDECAR not in sidecars:
                return None
            key = f"{self.prefix}{name}{checkpoints.SIDECAR}"
            body = self.s3.get_object(Bucket=self.cfg.bucket, Key=key)["Body"].read()
            return body.decode().split()[0] if body.strip() else ""

        checkpoints.choose_intact(
            self.model_dir, remote, recorded, f"{model_prefix(self.cfg)}checkpoints/",
            self.cfg.run, self.log,
        )  # fmt: skip
        check_resumable(self.cfg, self.model_dir, remote)
        self.uploaded = {k: v for k, v in self.local_files().items() if k in remote}
        self.restored = True
        return bool(remote)

    def upload(self, policy: aws.RetryPolicy | None = None) -> int:
        """Copy what changed to S3, verified; returns how many files went up."""
        if not self.restored:
            self.log(
                f"not uploading {self.model_dir}: this attempt did not restore "
                f"{model_prefix(self.cfg)}, so it must not overwrite it"
            )
            return 0
        current = self.local_files()
        changed = [n for n, stamp in current.items() if self.uploaded.get(n) != stamp]
        s3 = self.s3.with_policy(policy) if policy else self.s3
        checkpoints.record_digests(
            lambda key, body: s3.put_object(
                Bucket=self.cfg.bucket, Key=f"{self.prefix}{key}", Body=body
            ),
            self.model_dir,
            changed,
        )
        aws.upload(
            self.s3, self.cfg.bucket, self.prefix, self.model_dir, changed,
            f"uploading {self.model_dir} to {model_prefix(self.cfg)}", policy, self.log,
        )  # fmt: skip
        self.uploaded.update({n: current[n] for n in changed})
        return len(changed)


class CheckpointSync(threading.Thread):
    """Copies the model dir to S3 while training runs, as soon as the trainer has written a
    checkpoint (TensorFlow's CheckpointManager rewrites checkpoints/checkpoint once the
    checkpoint's files are in place; looked at every WATCH_S) and at least every interval_s:
    the instance store does not survive a stop, and a restarted bootstrap resumes from S3."""

    WATCH_S = 2.0

    def __init__(self, store: ModelStore, interval_s: float, log):
        super().__init__(daemon=True)
        self.store, self.interval_s, self.log = store, interval_s, log
        self.stopped = threading.Event()

    def state_stamp(self) -> tuple[int, int] | None:
        try:
            stat = (self.store.model_dir / checkpoints.STATE).stat()
        except OSError:
            return None
        return stat.st_size, stat.st_mtime_ns

    def run(self) -> None:
        seen, synced_at = self.state_stamp(), time.monotonic()
        while not self.stopped.wait(min(self.WATCH_S, self.interval_s)):
            stamp = self.state_stamp()
            if stamp == seen and time.monotonic() - synced_at < self.interval_s:
                continue
            # Read before the upload: the trainer may name a newer one while it runs.
            newest = checkpoints.newest_named(self.store.model_dir)
            try:
                self.store.upload()
            except Exception as exc:  # the next round or the final upload retries
                self.log(f"checkpoint sync to S3 failed, retrying later: {aws.one_line(exc)}")
                continue
            synced_at = time.monotonic()
            if stamp != seen and newest:
                self.log(
                    f"checkpoint {newest} is in {model_prefix(self.store.cfg)}checkpoints/ "
                    "(a restarted or rerun attempt resumes from it)"
                )
            seen = stamp

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def upload_logs(s3, cfg: TrainConfig, policy: aws.RetryPolicy | None = None) -> None:
    logs = Path(cfg.log_dir)
    names = [p.name for p in logs.glob("*.log")] if logs.is_dir() else []
    aws.upload(
        s3, cfg.bucket, f"{cfg.runs_prefix}logs/node-{cfg.node_index}/", logs, names,
        f"uploading {logs}", policy,
    )  # fmt: skip


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def this_attempts(path: Path, started: float) -> dict:
    """A trainer output written by this attempt ({} for one a previous attempt left, restored
    from S3 with the checkpoints)."""
    try:
        if path.stat().st_mtime < started:
            return {}
    except OSError:
        return {}
    return read_json(path)


def done_document(
    cfg: TrainConfig,
    status: str,
    reason: str | None,
    model_dir: Path | None,
    now: float,
    started: float,
    outputs_since: float | None = None,
    earlier: list[dict] | None = None,
    steps: dict[str, float] | None = None,
) -> dict:
    """DONE.json per docs/contracts.md, every figure from this attempt: the trainer's when it
    wrote train.json / eval.json after outputs_since (when the restore was done: a restored file
    is new on disk but the previous attempt's), else the leader's wall time and no epochs.
    `earlier` is the run controller's record of the attempts before this one (attempts.json),
    `steps` the seconds of each bootstrap step this attempt finished (its timeline)."""
    succeeded = status == "succeeded"
    earlier = earlier or []
    own = {
        "attempt": len(earlier) + 1,
        "status": status,
        "reason": trim_reason(reason) if reason else None,
    }
    since = outputs_since or started
    evaluation = this_attempts(model_dir / "eval.json", since) if model_dir and succeeded else {}
    training = this_attempts(model_dir / "train.json", since) if model_dir else {}
    return {
        "run": cfg.run,
        "status": status,
        "reason": trim_reason(reason) if reason else None,
        "top1": evaluation.get("top1"),
        "top5": evaluation.get("top5"),
        "epochs": training.get("epochs", cfg.trainer.get("epochs") if succeeded else None),
        "duration_s": training.get("duration_s") or round(now - started, 1),
        "images_per_s": training.get("images_per_s") if succeeded else None,
        "end_to_end_images_per_s": training.get("end_to_end_images_per_s") if succeeded else None,
        "allreduce_busbw_gbps": allreduce_busbw_gbps(Path(cfg.log_dir) / "allreduce-check.log"),
        "target_top1": training.get("target_top1"),
        "reached_target_at_epoch": training.get("reached_target_at_epoch"),
        "time_to_target_s": training.get("time_to_target_s"),
        "finished_at": utc_stamp(now),
        "timeline": timeline(steps or {}, training),
        "attempt": own["attempt"],
        "attempts": [
            *({k: entry.get(k) for k in ("attempt", "status", "reason")} for entry in earlier),
            own,
        ],
    }


def timeline(steps: dict[str, float], training: dict) -> dict:
    """Where the attempt's time went: the bootstrap's steps (data pull, rendezvous, allreduce
    check, training, uploads, ...) and, from this attempt's train.json, the trainer's start-up
    (TensorFlow, the input pipeline, the first step's compilation), evaluation, checkpoints, the
    training steps themselves, and the time to the target."""
    trainer = {}
    if training.get("duration_s") is not None:
        parts = {k: training.get(k) or 0.0 for k in ("startup_s", "evaluation_s", "checkpoint_s")}
        trainer = {**parts, "training_s": round(training["duration_s"] - sum(parts.values()), 1)}
        trainer["time_to_target_s"] = training.get("time_to_target_s")
    return {"steps_s": dict(steps), "trainer_s": trainer}


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


REASON_LIMIT = 500


def trim_reason(text: str, limit: int = REASON_LIMIT) -> str:
    """One line of at most `limit` characters, cut at a word: the start (the first error line)
    is what says what happened."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 4]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + " ..."


TRAINER_ERROR = re.compile(r"(?<![A-Za-z])error: ")
# horovodrun's own summary of the first rank to fail (Gloo: "Process name: <rank>"; OpenMPI:
# "Process name: [[job,1],<rank>]"), per horovod 0.28.1 horovod/runner/gloo_run.py.
FIRST_FAILED_RANK = re.compile(
    r"Process name:\s*(?:\[\[\d+,\d+\],)?(\d+)\]?\s*Exit code:\s*(-?\d+)"
)
RANK_EXIT = re.compile(r"Process (\d+) exit with status code (-?\d+)")
MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
# bootstrap.rank's line for a rank a signal killed (over ssh, horovodrun itself only sees 255).
RANK_SIGNAL = re.compile(re.escape(RANK_MARK) + r" rank (\d+) killed by (SIG[A-Z0-9]+)")
SIGNAL_HINTS = {"SIGKILL": " (out of memory?)", "SIGSEGV": " (a crash in native code)"}


def rank_hosts(hostfile: str) -> list[str]:
    """The host of each rank: horovodrun gives ranks host by host, in hostfile order."""
    return [host for _, host in rank_nodes(hostfile)]


def rank_nodes(hostfile: str) -> list[tuple[int, str]]:
    """The node index and host of each rank: the hostfile lists the nodes in index order
    (rendezvous.write_hostfile), and horovodrun gives ranks host by host in that order."""
    nodes = []
    lines = [line for line in hostfile.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        host, _, slots = line.partition(" slots=")
        nodes += [(index, host.strip())] * int(slots or 1)
    return nodes


def describe_exit(code: int) -> str:
    """'killed by SIGKILL' for a signal (a shell's 128+N, or Python's -N), else 'exited N'."""
    number = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        name = signal.Signals(number).name if number else None
    except ValueError:
        name = None
    return f"killed by {name}{SIGNAL_HINTS.get(name, '')}" if name else f"exited {code}"


# Causes that a rank's own failure line names better than which rank died of it; the first
# line that matches is the cause (what follows are its consequences on the other ranks).
ENOSPC = re.compile(r"No space left on device|ENOSPC|\[Errno 28\]")
ENOSPC_PATHS = (
    re.compile(r"\[Errno 28\] No space left on device: '([^']+)'"),  # Python's OSError
    re.compile(r"(/[^\s;'\"]+?)[;:]?\s+No space left on device"),  # TensorFlow's file errors
)
# TensorFlow's tensor_bundle reader on a damaged checkpoint file.
CORRUPT = re.compile(r"[Cc]hecksum does not match|DataLossError")
# Gloo's transport timeouts as Horovod 0.28.1's library spells them (gloo/transport/tcp), and
# NCCL's.
COLLECTIVE_TIMEOUT = re.compile(
    r"Timed out waiting|(?:Read|Write|Connect) timeout|Application timeout caused pair closure"
    r"|NCCL.*(?:timeout|timed out)"
)
RANK_PREFIX = re.compile(r"^(?:\S*)?\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")


def size_text(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def describe_filesystem(path: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """'filesystem SOURCE (TYPE) mounted on DIR: FREE free of TOTAL' for the filesystem that
    holds path on this node (None: no part of path is here)."""
    target = Path(path)
    while not target.exists() and target != target.parent:
        target = target.parent
    if not target.exists():
        return None
    resolved = str(target.resolve())
    best = None
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        mount_point = fields.split()[4].replace("\\040", " ")
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= len(best[0])):
            fstype, source = [*rest.split(), "?", "?"][:2]
            best = (mount_point, fstype, source)
    if best is None:
        return None
    stat = os.statvfs(resolved)
    free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    return (
        f"filesystem {best[2]} ({best[1]}) mounted on {best[0]}: {size_text(free)} free of "
        f"{size_text(total)}"
    )


def rank_of(line: str) -> int | None:
    found = RANK_PREFIX.match(line)
    return int(found.group(1)) if found else None


def known_cause(
    lines: list[str], hosts: list[str], filesystem: Callable[[str], str | None]
) -> str | None:
    """A reason naming a known cause (full disk, corrupt checkpoint, collective timeout) and
    the rank that hit it first, or None."""

    def where(line: str) -> str:
        rank = rank_of(line)
        if rank is None:
            return ""
        return f" on rank {rank}" + (f" ({hosts[rank]})" if rank < len(hosts) else "")

    def words(line: str) -> str:
        return RANK_PREFIX.sub("", line).strip()

    for line in lines:
        if ENOSPC.search(line):
            path = next((m.group(1) for p in ENOSPC_PATHS if (m := p.search(line))), None)
            if path is None:
                return trim_reason(f"no space left on device (ENOSPC){where(line)}: {words(line)}")
            # Only a rank on this node (the leader, the hostfile's first host) wrote where this
            # node can look.
            rank = rank_of(line)
            local = not hosts or rank is None or (rank < len(hosts) and hosts[rank] == hosts[0])
            disk = filesystem(path) if local else None
            return trim_reason(
                f"no space left on device (ENOSPC) writing {path}{where(line)}"
                + (f"; {disk}" if disk else "")
            )
    for line in lines:
        if CORRUPT.search(line):
            return trim_reason(
                f"corrupt checkpoint (checksum does not match){where(line)}: {words(line)}"
            )
    for line in lines:
        if COLLECTIVE_TIMEOUT.search(line):
            return trim_reason(f"collective timeout{where(line)}: {words(line)}")
    return None


def failure_reason(
    tail: str, hostfile: str = "", filesystem: Callable[[str], str | None] = describe_filesystem
) -> str:
    """The most telling line of a failed run: a known cause (full disk, corrupt checkpoint,
    collective timeout) where the rank that hit it first says so, else the trainer's
    `error: ...` line, else which rank died where and how, else the last line. Tracebacks stay
    in the log file."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if cause := known_cause(lines, rank_hosts(hostfile), filesystem):
        return cause
    # The trainer's lowercase `error:` (after horovodrun's `[1]<stderr>:` prefix), not the
    # `RuntimeError: Horovod detected that one or more processes exited` horovodrun adds last.
    errors = [line for line in lines if TRAINER_ERROR.search(line)]
    if errors:
        return trim_reason(errors[-1])
    nodes = rank_nodes(hostfile)
    if found := MPI_SIGNAL.search(tail):
        rank, node = int(found.group(1)), found.group(2)
        return describe_rank(rank, f" on {node}", 128 + int(found.group(3)), lines)
    killed = {int(rank): name for rank, name in RANK_SIGNAL.findall(tail)}
    first = FIRST_FAILED_RANK.search(tail) or RANK_EXIT.search(tail)
    if first or killed:
        rank = int(first.group(1)) if first else next(iter(killed))
        code = int(first.group(2)) if first else 1
        if rank in killed:
            code = 128 + signal.Signals[killed[rank]].value
        where = f" on node {nodes[rank][0]} ({nodes[rank][1]})" if rank < len(nodes) else ""
        return describe_rank(rank, where, code, lines)
    return trim_reason((lines or ["no output"])[-1])


# ssh exits 255 when the connection fails or drops (ssh(1), EXIT STATUS): a remote rank whose
# host died or went off the network, as no rank's own exit says 255.
SSH_LOST = 255


def describe_rank(rank: int, where: str, code: int, lines: list[str]) -> str:
    """A rank that exited on its own gets its last stderr line; a killed one has none worth it."""
    how = describe_exit(code)
    if code == SSH_LOST:
        how += " (ssh's code for a lost connection: its host is gone or unreachable)"
    said = [
        line.split(":", 1)[1].strip() for line in lines if line.startswith(f"[{rank}]<stderr>:")
    ]
    said = [words for words in said if words]
    last = f"; its last words: {said[-1]}" if said else ""
    return trim_reason(f"rank {rank}{where} {how}{'' if how.startswith('killed') else last}")
