"""The node bootstrap's command line; the shell scripts exec it for everything that is logic.

    python3 -m bootstrap cloudwatch-config PATH  write the CloudWatch agent config
    python3 -m bootstrap preprocess-node       raw archives -> s3://<bucket>/tfrecords/, signal, stop
    python3 -m bootstrap train-node            health, data pull, signal, rendezvous, train, DONE.json
    python3 -m bootstrap fail STEP REASON      report a failed shell step (signal, DONE.json, stop)

All take --node-json PATH (default /etc/horovod-fleet/node.json). A bad node.json or command line
ends with one line naming the mistake and exit code 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from base64 import b64encode
from collections.abc import Callable
from pathlib import Path

from botocore.exceptions import ClientError

from bootstrap import (
    aws,
    benchmark,
    causes,
    checkpoints,
    data_pull,
    failures,
    health,
    launch,
    rendezvous,
    results,
    spot,
    supervision,
)
from bootstrap.cli import OneLineErrorParser, usage_error
from bootstrap.lines import REASON_LIMIT, one_line
from bootstrap.node_config import DEFAULT_PATH, ConfigError, PreprocessConfig, TrainConfig, load
from bootstrap.results import Attempt
from bootstrap.status import RunStatus

RAW_FILES = {
    "train": "ILSVRC2012_img_train.tar",
    "val": "ILSVRC2012_img_val.tar",
    "labels": "ILSVRC2012_validation_ground_truth.txt",
}


log = aws.log

# A SIGTERM (systemd stop, Spot interruption, instance shutdown) gives the node systemd's stop
# timeout, 90 s by default (DefaultTimeoutStopSec, systemd-system.conf(5)): horovodrun gets
# launch.STOP_GRACE_S of it to end, the uploads and DONE.json get the rest but a margin.
FLUSH_AFTER_SIGTERM_S = 75


class Interrupted(Exception):
    """The node was told to stop (SIGTERM), or a Spot notice stopped the ranks."""

    cause = causes.INTERRUPTED


class StepFailed(RuntimeError):
    """A step of the node's bootstrap ended the attempt: why, for people, and its cause
    (bootstrap/causes.py), for the run controller."""

    def __init__(self, step: str, reason: str, cause: str, status: str = "failed"):
        verb = "was interrupted" if status == "interrupted" else "failed"
        super().__init__(f"step '{step}' {verb}: {reason}")
        self.step, self.reason, self.cause, self.status = step, reason, cause, status


# Each finished step's seconds in this process, for DONE.json's timeline.
STEP_SECONDS: dict[str, float] = {}


def step(name: str, action: Callable[[], object]):
    """Run one named step with timestamped start/end lines; any error becomes StepFailed."""
    log(f"step '{name}': start")
    started = time.time()
    try:
        result = action()
    except Interrupted as exc:
        raise StepFailed(name, str(exc), causes.INTERRUPTED, "interrupted") from exc
    except Exception as exc:
        raise StepFailed(name, one_line(exc, REASON_LIMIT), causes.of(name, exc)) from exc
    took = time.time() - started
    STEP_SECONDS[name] = round(STEP_SECONDS.get(name, 0.0) + took, 1)
    log(f"step '{name}': done in {took:.1f} s")
    return result


def stop_instance_soon(cfg: PreprocessConfig) -> None:
    """Cost control: halt (the instance's shutdown behaviour is stop) a minute from now, which
    leaves the CloudWatch agent time to ship the last log lines."""
    if cfg.stop_when_done:
        log("stop_when_done: halting this instance in 1 minute")
        subprocess.run(["shutdown", "-h", "+1"], check=False)


# ---------------------------------------------------------------- preprocessing node


def download_raw(cfg: PreprocessConfig) -> dict[str, str]:
    """Fetch the archives from the URL in the Secrets Manager secret: JSON {"url": base URL,
    optional "username"/"password" for HTTP basic auth}. Finished downloads are kept."""
    secret = aws.client("secretsmanager", cfg.region).get_secret_value(
        SecretId=cfg.download_secret_arn
    )
    doc = json.loads(secret["SecretString"])
    target = Path(cfg.mount_point) / "raw"
    target.mkdir(parents=True, exist_ok=True)
    headers = {}
    if doc.get("username"):
        token = b64encode(f"{doc['username']}:{doc.get('password', '')}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    paths = {}
    for kind, name in RAW_FILES.items():
        path = target / name
        paths[kind] = str(path)
        if path.exists():
            log(f"{name} already downloaded")
            continue
        request = urllib.request.Request(f"{doc['url'].rstrip('/')}/{name}", headers=headers)
        partial = path.with_suffix(".part")
        with urllib.request.urlopen(request, timeout=60) as response, partial.open("wb") as out:
            while chunk := response.read(1 << 22):
                out.write(chunk)
        partial.replace(path)
        log(f"downloaded {name}: {path.stat().st_size} bytes")
    return paths


def preprocess_node(cfg: PreprocessConfig) -> None:
    s3 = aws.s3_client(cfg.region)
    output = f"s3://{cfg.bucket}/{cfg.output_prefix}"

    def already_done() -> bool:
        try:
            data_pull.verify_s3_dataset(s3, cfg.bucket, cfg.output_prefix)
        except (data_pull.VerificationError, ClientError) as exc:
            # No manifest yet, or a dataset that fails its check: (re)convert, resumably.
            log(f"{output} holds no verified dataset ({one_line(exc, REASON_LIMIT)}): converting")
            return False
        log(f"{output} already holds a verified dataset: skipping preprocessing")
        return True

    if not step("check for a verified dataset", already_done):
        if cfg.download_secret_arn:
            raw = step("download raw archives", lambda: download_raw(cfg))
        else:
            step(
                "wait for raw archives",
                lambda: data_pull.wait_for_objects(
                    s3, cfg.bucket, cfg.raw_prefix, list(RAW_FILES.values()),
                    cfg.raw_wait_s, max(cfg.poll_interval_s, 30), log,
                ),
            )  # fmt: skip
            raw = {k: f"s3://{cfg.bucket}/{cfg.raw_prefix}{n}" for k, n in RAW_FILES.items()}
        command = [
            "python3", "-m", "trainer.preprocess",
            "--train-tar", raw["train"], "--val-tar", raw["val"], "--val-labels", raw["labels"],
            "--output", output.rstrip("/"),
            "--train-shards", str(cfg.train_shards), "--val-shards", str(cfg.val_shards),
        ]  # fmt: skip

        def convert():
            # Finished shards are staged before upload (GBs at peak): on the data volume, not
            # the root disk.
            staging = Path(cfg.mount_point) / "staging"
            staging.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "TMPDIR": str(staging)}
            code, tail = launch.stream(command, env, Path(cfg.log_dir) / "preprocess.log")
            if code:
                raise RuntimeError(
                    f"trainer.preprocess exited {code}: {failures.failure_reason(tail)} "
                    "(details in preprocess.log)"
                )

        step("preprocess", convert)
    manifest = step(
        "verify manifest", lambda: data_pull.verify_s3_dataset(s3, cfg.bucket, cfg.output_prefix)
    )
    splits = ", ".join(f"{k} {v['records']} records" for k, v in manifest["splits"].items())
    log(f"dataset ready in {output}: {splits}")
    step("signal", lambda: log(aws.signal_cloudformation(cfg, True, "dataset ready")))
    stop_instance_soon(cfg)


# ---------------------------------------------------------------- training node


def signal_fleet_ready(cfg: TrainConfig, detail: str) -> None:
    """SUCCESS to CloudFormation: this node is healthy with its data, and the fleet passed."""
    log(aws.signal_cloudformation(cfg, True, f"healthy, data verified; fleet check: {detail}"))


def train_node(cfg: TrainConfig, attempt: Attempt) -> None:
    s3 = aws.s3_client(cfg.region)
    data_dir = Path(cfg.mount_point) / "tfrecords"
    model_dir = Path(cfg.mount_point) / "model"
    attempt.status = status = RunStatus(cfg, s3, model_dir, attempt_started=attempt.started)
    attempt.earlier = status.earlier_attempts()
    attempt.begin(cfg, model_dir)
    status.attempt_started = attempt.started
    status.phase("booting")
    step(
        "health",
        lambda: log(
            health.check_node(
                cfg, health.count_gpus(), health.efa_present(), health.life_cycle(cfg)
            )
        ),
    )
    if not cfg.benchmark or cfg.benchmark.mode == "data":  # a synthetic benchmark reads no data
        status.phase("pulling_data")
        step(
            "data pull",
            lambda: data_pull.pull_dataset(cfg.bucket, cfg.dataset_prefix, data_dir, log),
        )
    # No SUCCESS yet: CloudFormation counts a node as created only once the whole fleet has met
    # and passed the allreduce check (the leader's fleet-check.json), so a broken network
    # rolls the deployment back instead of reaching CREATE_COMPLETE.
    ip, instance_id = step("instance identity", lambda: (aws.private_ip(cfg), aws.instance_id(cfg)))
    if not cfg.is_leader:
        watch = supervision.LeaderWatch(cfg, time.time())
        step(
            "rendezvous",
            lambda: rendezvous.serve_as_member(
                s3, cfg, ip, instance_id, log,
                leader_lost=lambda now: watch.lost(supervision.read_entry(s3, cfg, 0), now),
                fleet_ready=lambda check: signal_fleet_ready(cfg, check["detail"]),
            ),
        )  # fmt: skip
        step("upload logs", lambda: results.upload_logs(s3, cfg))
        return
    hostfile = Path(cfg.state_dir) / "hostfile"

    def meet() -> list[dict]:
        # A restarted bootstrap (systemd, after this one died) first ends what it left running.
        supervision.end_leftovers(cfg, log)
        if recorded := results.clear_done(s3, cfg, attempt.started):
            raise results.RecordTaken(f"{results.describe_record(cfg, recorded)}: it stands")
        since = time.time()
        key = rendezvous.ensure_leader_key(s3, cfg)
        public_key = key.with_suffix(".pub").read_text()
        fingerprint = rendezvous.key_fingerprint(public_key)
        # The leader is a host in the hostfile too: a launcher that ssh-es to it must get in.
        rendezvous.install_authorized_key(cfg.authorized_keys_file, public_key)

        def register() -> None:
            rendezvous.register_node(s3, cfg, ip, instance_id, time.time(), fingerprint)

        register()
        attempt.heartbeat = supervision.Heartbeat(
            register, supervision.heartbeat_interval(cfg), log
        )
        attempt.heartbeat.start()
        log(f"registered as node 0 ({ip}); waiting for {cfg.nodes} node(s)")
        nodes = rendezvous.wait_for_nodes(s3, cfg, leader_key=fingerprint, since=since)
        text = rendezvous.write_hostfile(s3, cfg, nodes, hostfile)
        log("hostfile:\n" + text.rstrip())
        return nodes

    nodes = step("rendezvous", meet)
    ranks = sum(n["gpus"] or 1 for n in nodes)
    key = rendezvous.private_key_path(cfg)

    def fleet_ready(detail: str) -> None:
        rendezvous.write_fleet_check(s3, cfg, detail, time.time())
        signal_fleet_ready(cfg, detail)

    if cfg.benchmark:
        # The benchmark runs the allreduce check at every size itself, and reports it.
        step("signal", lambda: fleet_ready(f"{len(nodes)} node(s) met"))
        benchmark.lead(cfg, s3, nodes, key, data_dir, attempt.started, log, step)
        status.end("done", None)
        return
    env = launch.launcher_env(cfg, dict(os.environ))
    # What marks this run's training processes, for a restarted bootstrap to end them.
    env[supervision.JOB_ENV] = supervision.job_id(cfg)

    def lost_members(failed_at: float) -> list[str]:
        lost: list[str] = []
        attempt_to(
            "read the members' heartbeats",
            lambda: lost.extend(supervision.lost_nodes(s3, cfg, failed_at)),
        )
        return lost

    def run_horovod(
        program: list[str], log_name: str, keep: int = 1000, progress: Path | None = None
    ) -> str:
        # Each rank under bootstrap.rank, which names the signal that kills it; horovodrun is
        # guarded, and a failure names the members whose heartbeat went stale.
        ranked = ["python3", "-m", "bootstrap.rank", *program]
        return launch.run_horovodrun(
            cfg, hostfile, key, ranks, ranked, env, log_name,
            keep=keep, progress=progress, lost=lost_members, log=log,
        )  # fmt: skip

    fleet = f"{len(nodes)} node(s) met, no GPUs: no allreduce check"
    if cfg.gpus_per_node:
        check = ["python3", "-m", "bootstrap.allreduce_check"]
        status.phase("allreduce_check")
        # What the image baked for the network, in the log above any failure of the check and in
        # the reason of a wrong transport, which `horovod-fleet status` shows.
        stack = health.image_network_stack(cfg.image["manifest"])
        log(f"the image's network stack: {stack}")

        def allreduce_check() -> str:
            nccl_log = run_horovod(check, "allreduce-check.log", keep=1_000_000)
            try:
                return "NCCL transport: " + health.check_transport(nccl_log, cfg.efa, cfg.gpudirect)
            except health.HealthError as exc:
                raise health.HealthError(f"{exc} (image: {stack})") from None

        fleet = step("allreduce check", allreduce_check)
        log(fleet)
    step("signal", lambda: fleet_ready(fleet))
    store = checkpoints.ModelStore(s3, cfg, model_dir, log)
    resumes_from = step("restore checkpoints", store.restore)
    attempt.store, attempt.outputs_since = store, time.time()
    attempt.resumes_from(model_dir)
    log(
        f"restored and verified {checkpoints.model_prefix(cfg)}: the trainer resumes from "
        f"{resumes_from}"
        if resumes_from
        else f"no checkpoint in {checkpoints.model_prefix(cfg)} yet: the trainer starts run "
        f"{cfg.run} from its first step"
    )
    sync = checkpoints.CheckpointSync(store, cfg.checkpoint_sync_s, log)
    sync.start()
    status.phase("training")

    def train() -> None:
        try:
            run_horovod(
                launch.trainer_command(cfg, data_dir, model_dir),
                "train.log",
                progress=model_dir / "progress.json",
            )
        except RuntimeError as exc:
            # A Spot notice stopped the ranks (any node's): an interruption, named, not a failure.
            why = spot.interruption_reason(
                s3, cfg, model_dir, attempt.started, attempt.outputs_since
            )
            if why:
                raise Interrupted(why) from exc
            raise

    try:
        step("training", train)
    finally:
        sync.stop()
    # Results are retried until they are in S3: the hard cap bounds the wait (README).
    status.phase("uploading")
    step("upload results", lambda: store.upload(aws.UNTIL_DONE))
    doc = results.done_document(
        cfg, "succeeded", None, model_dir, time.time(), attempt.started, attempt.outputs_since,
        attempt.earlier, STEP_SECONDS, restarts=attempt.restarts,
    )  # fmt: skip
    log(f"run {cfg.run} succeeded: top-1 {doc['top1']}, top-5 {doc['top5']}")
    step("upload logs", lambda: results.upload_logs(s3, cfg, aws.UNTIL_DONE))
    status.end("done", None)
    step(
        "write DONE.json",
        lambda: results.write_done(s3.with_policy(aws.UNTIL_DONE), cfg, doc, attempt.started),
    )
    attempt.heartbeat.stop()
    log(f"wrote s3://{cfg.bucket}/{cfg.runs_prefix}DONE.json")


def attempt_to(what: str, action: Callable[[], object]) -> bool:
    """One best-effort action while reporting a failure: an error of its own (AWS unreachable, no
    credentials) is one log line, never a traceback that would hide the failure being reported."""
    try:
        action()
    except Exception as exc:
        log(f"could not {what}: {one_line(exc, REASON_LIMIT)}")
        return False
    return True


def report_failure(cfg, failure: StepFailed, attempt: Attempt | None = None) -> None:
    """Whatever failed: tell CloudFormation (rolls the fleet back while it is being created), keep
    the logs and the checkpoints this attempt may upload, and write the attempt's DONE.json
    (status failed, or interrupted after a SIGTERM) so teardown reacts: the leader does, and a
    member that found the leader lost; a preprocessing node stops. After a SIGTERM everything
    here fits in the shutdown's time. A failure that found this attempt's DONE.json already
    written by another node adds nothing to it."""
    attempt = attempt or Attempt()
    log(f"{failure.status.upper()}: {failure}")
    attempt_to(
        "signal FAILURE to CloudFormation",
        lambda: log(aws.signal_cloudformation(cfg, False, str(failure))),
    )
    if isinstance(cfg, PreprocessConfig):
        stop_instance_soon(cfg)
        return
    # The leader's checkpoints, logs and DONE.json are the run's results: retried until they
    # are in S3 (the hard cap, or a shutdown's deadline, bounds it).
    policy = aws.UNTIL_DONE if cfg.is_leader else aws.STEP_POLICY
    s3 = aws.s3_client(cfg.region, policy)
    if attempt.store is not None:
        attempt_to("upload the checkpoints", lambda: attempt.store.upload(policy))
    attempt_to("upload the logs", lambda: results.upload_logs(s3, cfg, policy))
    recorded = isinstance(failure.__cause__, results.RecordTaken)
    # status.json before DONE.json: DONE.json starts the teardown, so it is the last word.
    if attempt.status is not None and not recorded:
        attempt.status.end(failure.status, str(failure))
    found_leader_lost = isinstance(failure.__cause__, rendezvous.LeaderLost)
    if (cfg.is_leader or found_leader_lost) and not recorded:
        write_failure_record(cfg, failure, attempt)
    if attempt.heartbeat is not None:
        attempt.heartbeat.stop()


def write_failure_record(cfg: TrainConfig, failure: StepFailed, attempt: Attempt) -> None:
    if attempt.status is not None:  # a read of attempts.json that failed at the start retries
        attempt.earlier = attempt.status.earlier_attempts()
    doc = results.done_document(
        cfg, failure.status, str(failure), Path(cfg.mount_point) / "model" if cfg.is_leader
        else None, time.time(), attempt.started, attempt.outputs_since, attempt.earlier,
        STEP_SECONDS, cause=failure.cause, restarts=attempt.restarts,
        written_by="leader" if cfg.is_leader else f"member {cfg.node_index}",
    )  # fmt: skip
    results.record_failure(aws.s3_client(cfg.region, aws.UNTIL_DONE), cfg, doc, attempt.started)


def interrupt_on_sigterm() -> None:
    """SIGTERM ends the current step as Interrupted; from then on every S3 retry ends within
    the shutdown's time, and a second SIGTERM is ignored so the flush can finish."""

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        aws.shutdown_within(FLUSH_AFTER_SIGTERM_S)
        raise Interrupted("the node was stopped (SIGTERM)")

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python3 -m bootstrap", description=__doc__.split("\n")[0])
    parser.add_argument("--node-json", default=DEFAULT_PATH)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cloudwatch-config").add_argument("path")
    sub.add_parser("preprocess-node")
    sub.add_parser("train-node")
    fail = sub.add_parser("fail")
    fail.add_argument("step")
    fail.add_argument("reason")
    args = parser.parse_args(argv)
    try:
        cfg = load(args.node_json)
    except ConfigError as exc:
        return usage_error(str(exc))
    # s5cmd and the trainer's boto3 clients run as children: without a region s5cmd asks S3 for
    # the bucket's with HeadBucket, which the node's prefix-scoped role is denied.
    os.environ.setdefault("AWS_REGION", cfg.region)
    if args.command == "cloudwatch-config":
        try:
            health.write_cloudwatch_config(cfg, args.path)
        except OSError as exc:
            return usage_error(
                f"cannot write the CloudWatch agent config {args.path}: {exc.strerror}"
            )
        return 0
    attempt = Attempt()
    try:
        if args.command == "fail":
            raise StepFailed(
                args.step, args.reason, causes.STEP_CAUSES.get(args.step, causes.UNKNOWN)
            )
        if args.command == "preprocess-node" and isinstance(cfg, PreprocessConfig):
            preprocess_node(cfg)
        elif args.command == "train-node" and isinstance(cfg, TrainConfig):
            aws.log_fallback[:] = [Path(cfg.log_dir) / "bootstrap.log"]
            interrupt_on_sigterm()
            # For the node's whole run: a notice may come in any step, on any node.
            with spot.watching(cfg):
                train_node(cfg, attempt)
        else:
            return usage_error(f"node.json role '{cfg.role}' cannot run {args.command}")
    except Interrupted as exc:  # between steps
        failure = StepFailed("between steps", str(exc), causes.INTERRUPTED, "interrupted")
        report_failure(cfg, failure, attempt)
        return 1
    except StepFailed as failure:
        report_failure(cfg, failure, attempt)
        return 1
    except Exception as exc:  # a bug between steps: still reported, never a silent death
        report_failure(
            cfg, StepFailed("bootstrap", one_line(exc, REASON_LIMIT), causes.UNKNOWN), attempt
        )
        return 1
    finally:
        attempt.end()  # this bootstrap ended it: a next start is a new attempt, not a restart
    return 0


if __name__ == "__main__":
    sys.exit(main())
