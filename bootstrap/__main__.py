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
import subprocess
import sys
import time
import urllib.request
from base64 import b64encode
from collections.abc import Callable
from pathlib import Path

from bootstrap import aws, benchmark, data_pull, health, launch, rendezvous
from bootstrap.cli import OneLineErrorParser, usage_error
from bootstrap.node_config import DEFAULT_PATH, ConfigError, PreprocessConfig, TrainConfig, load

RAW_FILES = {
    "train": "ILSVRC2012_img_train.tar",
    "val": "ILSVRC2012_img_val.tar",
    "labels": "ILSVRC2012_validation_ground_truth.txt",
}


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} [bootstrap] {message}", flush=True)


class StepFailed(RuntimeError):
    def __init__(self, step: str, reason: str):
        super().__init__(f"step '{step}' failed: {reason}")
        self.step, self.reason = step, reason


def one_line(exc: Exception) -> str:
    """An error as one log line: s5cmd's stderr, part of some messages, spans several."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def step(name: str, action: Callable[[], object]):
    """Run one named step with timestamped start/end lines; any error becomes StepFailed."""
    log(f"step '{name}': start")
    started = time.time()
    try:
        result = action()
    except Exception as exc:
        raise StepFailed(name, one_line(exc)) from exc
    log(f"step '{name}': done in {time.time() - started:.1f} s")
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
    s3 = aws.client("s3", cfg.region)
    output = f"s3://{cfg.bucket}/{cfg.output_prefix}"
    try:
        data_pull.verify_s3_dataset(s3, cfg.bucket, cfg.output_prefix)
        log(f"{output} already holds a verified dataset: skipping preprocessing")
    except Exception:  # no manifest yet or an incomplete dataset: (re)convert, resumably
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
                    f"trainer.preprocess exited {code}: {launch.failure_reason(tail)}"
                )

        step("preprocess", convert)
    manifest = step(
        "verify manifest", lambda: data_pull.verify_s3_dataset(s3, cfg.bucket, cfg.output_prefix)
    )
    splits = ", ".join(f"{k} {v['records']} records" for k, v in manifest["splits"].items())
    log(f"dataset ready in {output}: {splits}")
    log(aws.signal_cloudformation(cfg, True, "dataset ready"))
    stop_instance_soon(cfg)


# ---------------------------------------------------------------- training node


def train_node(cfg: TrainConfig) -> None:
    s3 = aws.client("s3", cfg.region)
    data_dir = Path(cfg.mount_point) / "tfrecords"
    model_dir = Path(cfg.mount_point) / "model"
    step("health", lambda: log(health.check_node(cfg, health.count_gpus(), health.efa_present())))
    if not cfg.benchmark or cfg.benchmark.mode == "data":  # a synthetic benchmark reads no data
        step(
            "data pull",
            lambda: data_pull.pull_dataset(cfg.bucket, cfg.dataset_prefix, data_dir, log),
        )
    log(aws.signal_cloudformation(cfg, True, "healthy, data verified"))
    ip, instance_id = step("instance identity", lambda: (aws.private_ip(cfg), aws.instance_id(cfg)))
    if not cfg.is_leader:
        step(
            "rendezvous",
            lambda: rendezvous.serve_as_member(s3, cfg, ip, instance_id, log),
        )
        launch.upload_logs(cfg)
        return
    started = time.time()
    hostfile = Path(cfg.state_dir) / "hostfile"

    def meet() -> list[dict]:
        launch.clear_done(s3, cfg)
        key = rendezvous.ensure_leader_key(s3, cfg)
        # The leader is a host in the hostfile too: a launcher that ssh-es to it must get in.
        rendezvous.install_authorized_key(
            cfg.authorized_keys_file, key.with_suffix(".pub").read_text()
        )
        rendezvous.register_node(s3, cfg, ip, instance_id, time.time())
        log(f"registered as node 0 ({ip}); waiting for {cfg.nodes} node(s)")
        nodes = rendezvous.wait_for_nodes(s3, cfg)
        text = rendezvous.write_hostfile(s3, cfg, nodes, hostfile)
        log("hostfile:\n" + text.rstrip())
        return nodes

    nodes = step("rendezvous", meet)
    ranks = sum(n["gpus"] or 1 for n in nodes)
    key = rendezvous.private_key_path(cfg)
    if cfg.benchmark:
        benchmark.lead(cfg, s3, nodes, key, data_dir, started, log, step)
        return
    env = launch.launcher_env(cfg, dict(os.environ))

    def run_horovod(program: list[str], log_name: str, keep: int = 200) -> str:
        command = launch.horovodrun_command(cfg, hostfile, key, ranks, program)
        log("running: " + " ".join(command))
        code, tail = launch.stream(command, env, Path(cfg.log_dir) / log_name, keep)
        if code:
            raise RuntimeError(f"horovodrun exited {code}: {launch.failure_reason(tail)}")
        return tail

    if cfg.gpus_per_node:
        check = ["python3", "-m", "bootstrap.allreduce_check"]
        step(
            "allreduce check",
            lambda: log("NCCL transport: " + health.check_transport(
                run_horovod(check, "allreduce-check.log", keep=1_000_000), cfg.efa
            )),
        )  # fmt: skip
    restored = step("restore checkpoints", lambda: launch.restore_model_dir(s3, cfg, model_dir))
    log(f"resuming from {launch.model_prefix(cfg)}" if restored else "no checkpoint in S3: new run")
    sync = launch.CheckpointSync(cfg, model_dir, log)
    sync.start()
    try:
        step(
            "training",
            lambda: run_horovod(launch.trainer_command(cfg, data_dir, model_dir), "train.log"),
        )
    finally:
        sync.stop()
    step("upload results", lambda: launch.sync_model_dir(cfg, model_dir))
    doc = launch.done_document(cfg, "succeeded", None, model_dir, time.time(), started)
    log(f"run {cfg.run} succeeded: top-1 {doc['top1']}, top-5 {doc['top5']}")
    step("upload logs", lambda: launch.upload_logs(cfg))
    step("write DONE.json", lambda: launch.write_done(s3, cfg, doc))
    log(f"wrote s3://{cfg.bucket}/{cfg.runs_prefix}DONE.json")


def attempt(what: str, action: Callable[[], object]) -> bool:
    """One best-effort action while reporting a failure: an error of its own (AWS unreachable, no
    credentials) is one log line, never a traceback that would hide the failure being reported."""
    try:
        action()
    except Exception as exc:
        log(f"could not {what}: {one_line(exc)}")
        return False
    return True


def report_failure(cfg, failure: StepFailed) -> None:
    """Whatever failed: tell CloudFormation (rolls the fleet back while it is being created), keep
    the logs and checkpoints, and on the leader write DONE.json so teardown reacts; a
    preprocessing node stops."""
    log(f"FAILED: {failure}")
    attempt(
        "signal FAILURE to CloudFormation",
        lambda: log(aws.signal_cloudformation(cfg, False, str(failure))),
    )
    if isinstance(cfg, PreprocessConfig):
        stop_instance_soon(cfg)
        return
    model_dir = Path(cfg.mount_point) / "model"
    attempt("upload the checkpoints", lambda: launch.sync_model_dir(cfg, model_dir))
    attempt("upload the logs", lambda: launch.upload_logs(cfg))
    if cfg.is_leader:
        done = f"s3://{cfg.bucket}/{cfg.runs_prefix}DONE.json"
        doc = launch.done_document(cfg, "failed", str(failure), model_dir, time.time(), None)
        if attempt(
            f"write {done}", lambda: launch.write_done(aws.client("s3", cfg.region), cfg, doc)
        ):
            log(f"wrote {done} (status failed)")


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
    try:
        if args.command == "fail":
            raise StepFailed(args.step, args.reason)
        if args.command == "preprocess-node" and isinstance(cfg, PreprocessConfig):
            preprocess_node(cfg)
        elif args.command == "train-node" and isinstance(cfg, TrainConfig):
            train_node(cfg)
        else:
            return usage_error(f"node.json role '{cfg.role}' cannot run {args.command}")
    except StepFailed as failure:
        report_failure(cfg, failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
