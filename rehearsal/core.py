"""The rehearsal's core: its constants, `say`, `StepFailed` and the `Rehearsal` class (the local
S3, the sample dataset, the preprocessing and training nodes, the run controller's part, the
results). rehearsal/__main__.py is its command line; rehearsal/benchmark.py and
rehearsal/faults.py build on this module, never on the command line (`python -m rehearsal` runs
__main__.py as the module `__main__`: importing it again would make a second copy).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import boto3

from rehearsal import iam_s3, snapshots
from rehearsal.hosts import NODE_INTERFACE, SSH_PORT, Fleet, namespaces_available

REPO = Path(__file__).resolve().parent.parent
BUCKET = "horovod-fleet-rehearsal"
RUN = "rehearsal"
REGION = "us-east-1"
RAW_FILES = (
    "ILSVRC2012_img_train.tar",
    "ILSVRC2012_img_val.tar",
    "ILSVRC2012_validation_ground_truth.txt",
)


def matches(pattern: str | re.Pattern, line: str) -> bool:
    """A watch's trigger: a substring of the line, or a regular expression found in it."""
    return bool(pattern.search(line)) if isinstance(pattern, re.Pattern) else pattern in line


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [rehearsal] {message}", flush=True)


class StepFailed(RuntimeError):
    pass


REPORT_GRACE_S = 60  # after one node fails, how long the others get to report theirs
# The node unit's Restart=on-abnormal (bootstrap/lib.sh): a bootstrap killed by any signal but
# these is started again after RestartSec, at most StartLimitBurst times.
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}
RESTART_SEC = 5
# The run controller's program (the reaper's Lambda asset), run against the local S3 endpoint.
CONTROLLER = REPO / "stacks" / "teardown" / "reaper" / "controller.py"
RESTART_LIMIT = 5


class Rehearsal:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.workdir = args.workdir.resolve()
        self.processes: list[subprocess.Popen] = []
        self.fleet: Fleet | None = None
        self.endpoint = ""
        self.step = "start"
        self.node_processes: list[subprocess.Popen] = []
        self.copiers: list[threading.Thread] = []
        # (node name, text or pattern, action): the first line of that node containing text
        # runs action (the fault rehearsal injects its faults this way).
        self.watches: list[tuple[str, str | re.Pattern, Callable[[], None]]] = []
        self.output: dict[str, list[str]] = {}
        # node name -> (command, env) that systemd's restart of its bootstrap runs, and how
        # often it did.
        self.services: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.restarts: dict[str, int] = {}
        self.node_groups: list[int] = []  # every node process group, restarted ones included
        self.entries: list[dict] = []  # the run controller's decisions of the current row
        self.iam: iam_s3.IamS3Proxy | None = None  # the local S3's IAM judge
        self.market = "on-demand"  # the market of the newest attempt's node.json
        self.replacements: dict[int, int] = {}  # node index -> times EC2 launched it anew

    # ------------------------------------------------------------ processes

    def env(self, role: str = "rehearsal") -> dict[str, str]:
        """A process's environment; `role` is the deployed role whose IAM policies the local S3
        judges its requests by (rehearsal/iam_s3.py): node, preprocessor, reaper, or none."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_ACCESS_KEY_ID=role,
            AWS_SECRET_ACCESS_KEY="rehearsal",
            AWS_DEFAULT_REGION=REGION,
            AWS_REGION=REGION,
            PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
            PYTHONPATH=str(REPO),
            PYTHONUNBUFFERED="1",
            TF_CPP_MIN_LOG_LEVEL="2",
            NO_PROXY="*",
        )
        return env

    def start(
        self, name: str, cmd: list[str], env: dict[str, str], log: Path | None = None
    ) -> subprocess.Popen:
        """Start a process in its own session (so cleanup can end its whole group) and copy
        its output to ours, each line prefixed with its name, or only to `log`."""
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=log.open("w") if log else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.processes.append(proc)
        if log:
            return proc

        lines = self.output.setdefault(name, [])

        def copy() -> None:
            for line in proc.stdout:
                sys.stdout.write(f"[{name}] {line}")
                sys.stdout.flush()
                lines.append(line)
                for watch in [w for w in self.watches if w[0] == name and matches(w[1], line)]:
                    self.watches.remove(watch)
                    watch[2]()

        copier = threading.Thread(target=copy, daemon=True)
        copier.start()
        self.copiers.append(copier)
        return proc

    def wait(self, procs: dict[str, subprocess.Popen], timeout_s: float) -> dict[str, int]:
        """Wait for every process; returns their exit codes, or raises StepFailed naming the
        ones that failed. A failure gives the others REPORT_GRACE_S to finish theirs (the
        leader writes DONE.json after a member fails), so the node that failed first is the
        one blamed, not the one that noticed."""
        deadline = time.time() + timeout_s
        shown_epoch = 0
        while time.time() < deadline:
            shown_epoch = self.show_status_after_each_epoch(shown_epoch)
            codes = {name: p.poll() for name, p in procs.items()}
            # Judged on the same exit codes: a bootstrap killed while the status screen ran
            # is systemd's to restart, not a failure.
            if any(self.restartable(name, code) for name, code in codes.items()):
                self.restart_killed(procs)
                continue
            if any(c not in (None, 0) for c in codes.values()):
                grace = time.time() + REPORT_GRACE_S
                while time.time() < grace and any(p.poll() is None for p in procs.values()):
                    time.sleep(0.5)
                codes = {name: p.poll() for name, p in procs.items()}
                failed = [f"{n} exited {c}" for n, c in codes.items() if c not in (None, 0)]
                raise StepFailed(", ".join(failed) + " (the log is above)")
            if all(c == 0 for c in codes.values()):
                if shown_epoch:  # a training run: its last screen
                    self.show_status()
                return codes
            time.sleep(0.5)
        raise StepFailed(f"{', '.join(procs)} still running after {timeout_s:.0f} s")

    def show_status_after_each_epoch(self, shown_epoch: int) -> int:
        """Print `horovod-fleet status` each time the leader's status.json is in a new epoch
        (the previous one is over); returns the newest epoch shown."""
        try:
            body = self.s3.get_object(Bucket=BUCKET, Key=f"runs/{RUN}/status.json")["Body"]
            status = json.loads(body.read())
        except Exception:  # not written yet (or half-way through a rewrite): next time
            return shown_epoch
        if status.get("phase") not in ("training", "evaluating"):  # or the last run's
            return shown_epoch
        epoch = (status.get("progress") or {}).get("epoch") or 0
        if epoch > shown_epoch:
            self.show_status()
        return max(epoch, shown_epoch)

    def show_status(self) -> None:
        """The real command against the local endpoint, as a user would run it."""
        watch = [sys.executable, "-m", "watch.cli", "status", "--run", RUN, "--bucket", BUCKET]
        result = subprocess.run(watch, env=self.env(), capture_output=True, text=True, timeout=60)
        print(result.stdout + result.stderr, end="", flush=True)

    def restartable(self, name: str, code: int | None) -> bool:
        """A node bootstrap killed by a signal that its unit's Restart=on-abnormal restarts."""
        if code is None or code >= 0 or name not in self.services:
            return False
        if signal.Signals(-code) in CLEAN_SIGNALS:
            return False
        return self.restarts.get(name, 0) < RESTART_LIMIT

    def restart_killed(self, procs: dict[str, subprocess.Popen]) -> None:
        """Play systemd's part for the simulated nodes: a node bootstrap killed by a signal
        (Restart=on-abnormal) is started again after RESTART_SEC, in place in procs."""
        for name, proc in list(procs.items()):
            code = proc.poll()
            if not self.restartable(name, code):
                continue
            self.restarts[name] = self.restarts.get(name, 0) + 1
            say(
                f"{name}'s bootstrap was killed by {signal.Signals(-code).name}: restarting it "
                f"in {RESTART_SEC} s, as its unit's Restart=on-abnormal does"
            )
            time.sleep(RESTART_SEC)
            command, env = self.services[name]
            procs[name] = self.start(name, command, env)
            self.node_processes = list(procs.values())
            self.node_groups.append(procs[name].pid)

    def close(self) -> None:
        """End every process, then let their output drain: nothing prints after the verdict."""
        for proc in self.processes:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
        if self.iam:
            self.iam.stop()
            self.iam = None
        if self.fleet:
            self.fleet.close()
        for copier in self.copiers:
            copier.join(timeout=10)

    # ------------------------------------------------------------ steps

    def plan_steps(self) -> list:
        steps = [
            ("local S3 endpoint", self.start_s3),
            ("sample dataset", self.make_sample),
            ("preprocessing node", self.preprocess),
            ("training nodes", lambda: self.train(self.args.epochs)),
            ("results", lambda: self.report(self.args.epochs)),
        ]
        if self.args.rerun_epochs:
            steps += [
                ("reboot: training nodes again", lambda: self.train(self.args.rerun_epochs)),
                ("results after the rerun", lambda: self.report(self.args.rerun_epochs)),
            ]
        return steps

    def run(self) -> int:
        started = time.time()
        steps = self.plan_steps()
        failure = None
        try:
            for self.step, action in steps:
                say(f"--- {self.step}")
                action()
            self.check_no_refusals()
        except (StepFailed, RuntimeError, OSError) as exc:
            failure = f"FAILED at step '{self.step}': {exc}{self.leader_said()}{self.refused()}"
            self.keep_s3()
        finally:
            # Whatever ended the steps (Ctrl-C, an error nobody foresaw): no namespace, bridge
            # or process outlives the rehearsal, and the verdict is the last line.
            self.close()
        if failure:
            say(failure)
            return 1
        say(f"rehearsal succeeded in {time.time() - started:.0f} s; files in {self.workdir}")
        return 0

    def refused(self) -> str:
        """The IAM refusals so far, for a verdict: on AWS each would be an AccessDenied."""
        refusals = self.iam.refusals if self.iam else []
        if not refusals:
            return ""
        shown = "; ".join(dict.fromkeys(refusals))
        return f"; {len(refusals)} request(s) refused by IAM: {shown[:1500]}"

    def check_no_refusals(self) -> None:
        """A run that got past a refusal still made a request its role may not make: on AWS
        that request fails, so the rehearsal does too."""
        if self.iam and self.iam.refusals:
            self.step = "IAM"
            raise StepFailed("the deployed roles' policies refuse what the nodes asked")

    def done_json(self) -> dict | None:
        try:
            body = self.s3.get_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json")["Body"]
            return json.loads(body.read())
        except Exception:  # no endpoint yet, no DONE.json: nothing to show
            return None

    def leader_said(self) -> str:
        """On a failure, what the run's own DONE.json says (printed, and named in the verdict:
        the leader knows which step failed, wherever the rehearsal noticed it)."""
        done = self.done_json() if self.step.startswith(("training", "reboot")) else None
        if done is None:
            return ""
        say("DONE.json:")
        print(json.dumps(done, indent=2), flush=True)
        return f"; DONE.json: status {done['status']}, reason: {done['reason']}"

    def keep_s3(self) -> list[str]:
        """Copy what the run wrote to <workdir>/s3/: the local S3 endpoint goes away with us."""
        if not hasattr(self, "s3"):
            return []
        try:
            listing = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{RUN}/")
            keys = [o["Key"] for o in listing.get("Contents", [])]
            for key in keys:
                (self.workdir / "s3" / key).parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(BUCKET, key, str(self.workdir / "s3" / key))
        except Exception as exc:  # the verdict matters more than the copy
            say(f"could not copy s3://{BUCKET}/runs/{RUN}/: {exc}")
            return []
        say(f"s3://{BUCKET}/runs/{RUN}/ holds {len(keys)} objects (copied to {self.workdir}/s3/)")
        return keys

    def start_s3(self) -> None:
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        usable, why = namespaces_available()
        if usable and not self.args.processes:
            self.fleet = Fleet(self.args.nodes, self.workdir, str(os.getpid()))
            self.fleet.__enter__()
            address = self.fleet.gateway
            say(f"simulated hosts: namespaces on {self.fleet.subnet} ({why})")
        else:
            address = "127.0.0.1"
            reason = "--processes" if self.args.processes else why
            say(f"simulated hosts: separate processes on {address} ({reason})")
        ports = []
        for _ in range(2):
            with socket.socket() as probe:
                probe.bind((address, 0))
                ports.append(probe.getsockname()[1])
        moto_port, port = ports
        moto = shutil.which("moto_server", path=str(Path(sys.executable).parent))
        self.moto = self.start(
            "s3", [moto, "-H", address, "-p", str(moto_port)], self.env(), self.workdir / "s3.log"
        )
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{address}:{moto_port}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise StepFailed(f"moto_server did not answer at http://{address}:{moto_port}")
        # Every node's request is judged by its deployed role's policies, as on AWS.
        statements = iam_s3.role_statements(self.synthesize(), REGION)
        self.iam = iam_s3.IamS3Proxy(
            (address, port), (address, moto_port), statements, self.workdir / "iam-refusals.log"
        )
        self.iam.start()
        self.endpoint = f"http://{address}:{port}"
        judged = ", ".join(f"{role} ({len(s)} statements)" for role, s in statements.items())
        say(f"S3 judged by the synthesized IAM policies of: {judged}")
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="rehearsal",
            aws_secret_access_key="rehearsal",
        )
        self.s3.create_bucket(Bucket=BUCKET)
        say(f"S3 endpoint {self.endpoint}, bucket {BUCKET}")

    def synthesize(self) -> list[dict]:
        """The app's templates for the rehearsal's bucket, run and nodes (`python app.py`, as
        `cdk synth` runs it): the IAM policies the local S3 enforces come from them."""
        out = self.workdir / "cdk.out"
        context = {"datasetBucket": BUCKET, "run": RUN, "nodes": self.args.nodes,
                   "region": REGION}  # fmt: skip
        env = {**self.env(), "CDK_OUTDIR": str(out), "CDK_CONTEXT_JSON": json.dumps(context),
               "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}  # fmt: skip
        result = subprocess.run(
            [sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        if result.returncode:
            raise StepFailed(f"cdk synth failed: {result.stderr.strip()[-500:]}")
        names = ("TrainStack", "PreprocessStack", "TeardownStack")
        return [json.loads((out / f"{name}.template.json").read_text()) for name in names]

    def make_sample(self) -> None:
        raw = self.workdir / "raw"
        cmd = [sys.executable, "-m", "trainer.preprocess.sample", "--output", str(raw)]
        cmd += ["--classes", str(self.args.classes), "--train-per-class", str(self.args.per_class)]
        cmd += ["--val-images", str(self.args.val_images)]
        self.wait({"sample": self.start("sample", cmd, self.env())}, 600)
        # What users do with the real archives: aws s3 cp FILE s3://<bucket>/raw/FILE
        for name in RAW_FILES:
            self.s3.upload_file(str(raw / name), BUCKET, f"raw/{name}")
        say(f"uploaded {', '.join(RAW_FILES)} to s3://{BUCKET}/raw/")

    def node_json(self, path: Path, doc: dict) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2))
        return path

    def image_manifest(self) -> Path:
        """The rehearsal's stand-in for /opt/horovod-fleet/image.json: the image.json of a CPU
        node, so the nodes run the same image check a GPU node runs against a baked AMI."""
        path = self.workdir / "image.json"
        document = {
            "format": "horovod-fleet/image/1",
            "recipe_sha256": hashlib.sha256(b"rehearsal").hexdigest(),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": {
                "python": ".".join(map(str, sys.version_info[:3])),
                "tensorflow": importlib.metadata.version("tensorflow-cpu"),
                "horovod": importlib.metadata.version("horovod"),
            },
            "horovod_build": {"TensorFlow": True, "Gloo": True, "MPI": False, "NCCL": False},
        }
        path.write_text(json.dumps(document, indent=2))
        return path

    def common(self, home: Path) -> dict:
        # The rehearsal's keys (docs in bootstrap/node_config.py): no installs, no volume, no
        # CloudWatch, no CloudFormation signal, paths under the work dir.
        return {
            "region": REGION,
            "bucket": BUCKET,
            "log_group": None,
            "project": "horovod-fleet",
            "signal": None,
            "install": False,
            "log_dir": str(home / "logs"),
            "state_dir": str(home / "state"),
            "poll_interval_s": 1,
        }

    def preprocess(self) -> None:
        home = self.workdir / "preprocess"
        doc = {
            "role": "preprocess",
            **self.common(home),
            "raw_prefix": "raw/",
            "output_prefix": "tfrecords/",
            "volume_id": None,
            "mount_point": str(home / "data"),
            "download_secret_arn": None,
            "train_shards": 4,
            "val_shards": 2,
            "stop_when_done": False,
            "instance_id": "rehearsal-preprocess",
        }
        env = {
            **self.env("preprocessor"),
            "NODE_JSON": str(self.node_json(home / "node.json", doc)),
        }
        script = [str(REPO / "bootstrap" / "preprocess_node.sh")]
        self.wait({"preprocess": self.start("preprocess", script, env)}, 900)

    def node_home(self, index: int) -> Path:
        return self.fleet.nodes[index].home if self.fleet else self.workdir / f"node{index}"

    def node_ip(self, index: int) -> str:
        return self.fleet.nodes[index].ip if self.fleet else "127.0.0.1"

    def instance_id(self, index: int) -> str:
        """Node `index`'s current instance: a replacement is a new instance, with a new id."""
        launches = self.replacements.get(index, 0)
        return f"rehearsal-node-{index}" + (f"-r{launches}" if launches else "")

    def notice_file(self, index: int) -> Path:
        """Where node `index`'s current instance reads its Spot interruption notice (its IMDS
        `spot/instance-action`): a replacement, a new instance, has none."""
        return self.workdir / "imds" / f"{self.instance_id(index)}.instance-action.json"

    def end_nodes(self) -> None:
        """SIGKILL every node process group, restarted ones included (their sshd too)."""
        for group in self.node_groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    def renew_fleet(self) -> None:
        """Every node as a fleet deployed anew has it: no process left, empty disks, the
        instance it first had (a Spot row may have replaced it)."""
        self.end_nodes()
        self.node_processes, self.node_groups = [], []
        for index in range(self.args.nodes):
            if self.fleet:
                self.fleet.renew(self.fleet.nodes[index])
            else:
                shutil.rmtree(self.node_home(index), ignore_errors=True)
        shutil.rmtree(self.workdir / "imds", ignore_errors=True)
        self.replacements.clear()

    def save_snapshot(self, name: str, leave_out: tuple[str, ...] = ()) -> None:
        count = snapshots.save(self.s3, BUCKET, self.workdir / "snapshots" / name, leave_out)
        say(f"snapshot '{name}': {count} objects of s3://{BUCKET}/")

    def restore_snapshot(self, name: str) -> None:
        count = snapshots.restore(self.s3, BUCKET, self.workdir / "snapshots" / name)
        say(f"s3://{BUCKET}/ restored from snapshot '{name}' ({count} objects)")

    def train(self, epochs: int, absent: tuple[int, ...] = (), **overrides) -> None:
        """Start every node's train_node.sh and wait for all. A second call is the rerun after a
        reboot: the nodes' processes (sshd included) are gone, their disks, keys and the run's
        S3 prefix are not, so the pull is skipped and training resumes from S3."""
        self.end_nodes()  # the sshd of a node whose bootstrap restarted too
        if self.node_processes:
            # Only S3 may hold the checkpoint a rerun resumes from.
            shutil.rmtree(self.workdir / "node0" / "data" / "model", ignore_errors=True)
        nodes = self.args.nodes
        self.output.clear()
        data_mount = self.workdir / "data"  # every namespace node sees its own data here
        data_mount.mkdir(exist_ok=True)
        procs = {}
        image_json = self.image_manifest()
        for index in range(nodes):
            if index in absent:  # a node that never boots (the fault rehearsal)
                continue
            node = self.fleet.nodes[index] if self.fleet else None
            home = node.home if node else self.workdir / f"node{index}"
            doc = {
                "role": "train",
                **self.common(home),
                "run": RUN,
                "node_index": index,
                "nodes": nodes,
                "gpus_per_node": 0,
                "instance_type": "rehearsal-cpu",
                "efa": False,
                "dataset_prefix": "tfrecords/",
                "runs_prefix": f"runs/{RUN}/",
                "rendezvous_timeout_s": 300,
                "trainer": {
                    "epochs": epochs,
                    "batch_per_gpu": 32,
                    "arch": "resnet18",
                    "image_size": 32,
                    "log_every": 5,
                    "warmup_epochs": 1,
                },
                "metrics": {"namespace": "HorovodFleet", "dimension": {"Run": RUN}},
                "image": {
                    "manifest": str(image_json),
                    "ami": "rehearsal-image",
                    "tensorflow": "2.15.1",
                    "horovod": "0.28.1",
                },
                "instance_store": False,
                "mount_point": str(data_mount if node else home / "data"),
                "ip": self.node_ip(index),
                "instance_id": self.instance_id(index),
                "ssh_port": SSH_PORT,
                "authorized_keys_file": str(home / "ssh" / "authorized_keys"),
                "network_interface": NODE_INTERFACE if node else None,
                "heartbeat_timeout_s": 60,
                "checkpoint_sync_s": 30,
                # CPU processes cost nothing; the status screen still shows the dollars line.
                "cost": {"usd_per_hour": 0.0, "prices_as_of": "rehearsal", "max_hours": 1},
                "status_every_s": 1,  # epochs last seconds here: a screen for each
            }
            doc["trainer"].update(overrides.get("trainer", {}))
            doc.update({k: v for k, v in overrides.items() if k != "trainer"})
            self.market = doc.get("market", "on-demand")
            if self.market == "spot":
                doc["spot_notice_file"] = str(self.notice_file(index))
            env = {**self.env("node"), "NODE_JSON": str(self.node_json(home / "node.json", doc))}
            script = [str(REPO / "bootstrap" / "train_node.sh")]
            cmd = self.fleet.node_command(node, data_mount, script) if node else script
            procs[f"node{index}"] = self.start(f"node{index}", cmd, env)
            # A restarted unit reruns the script on the same host, whose sshd still runs.
            again = self.fleet.node_command(node, data_mount, script, sshd=False) if node else cmd
            self.services[f"node{index}"] = (again, env)
        self.node_processes = list(procs.values())
        self.node_groups = [proc.pid for proc in self.node_processes]
        self.restarts.clear()
        self.wait(procs, self.args.timeout)

    def end_attempt(self, max_restarts: int) -> dict | None:
        """What the run controller's Record step does on a DONE.json: its own code decides and
        records the attempt, here against the local S3 endpoint (docs/contracts.md)."""
        command = [sys.executable, str(CONTROLLER), "--bucket", BUCKET, "--run", RUN,
                   "--max-restarts", str(max_restarts)]  # fmt: skip
        result = subprocess.run(
            command, env=self.env("reaper"), capture_output=True, text=True, timeout=120
        )
        if result.returncode:
            raise StepFailed(f"the run controller failed: {result.stderr.strip()[-500:]}")
        entry = json.loads(result.stdout) if result.stdout.strip() else None
        if entry:
            say(f"run controller: attempt {entry['attempt']} {entry['status']}: "
                f"{entry['decision']} ({entry['why']})")  # fmt: skip
        return entry

    def relaunch(self) -> None:
        """Play EC2's part in the run controller's relaunch (stacks/teardown/reaper/steps_fleet.py,
        StopFleet and Launch). An on-demand fleet is stopped and started: every process of every node
        ends, and each node comes back with an empty instance store (/data) but its own address
        and instance id. A Spot fleet is terminated and launched again from the nodes' launch
        templates: each node is a new instance (new id and address, nothing left on its disks).
        Either way its boot service then runs train_node.sh again."""
        self.end_nodes()
        if self.market == "spot":
            for index in range(self.args.nodes):
                self.replacements[index] = self.replacements.get(index, 0) + 1
                if self.fleet:
                    self.fleet.replace(self.fleet.nodes[index])
                else:
                    shutil.rmtree(self.node_home(index), ignore_errors=True)
            launched = ", ".join(
                f"{self.instance_id(i)} ({self.node_ip(i)})" for i in range(self.args.nodes)
            )
            say(f"EC2: the Spot fleet was terminated and launched from its templates: {launched}")
            return
        if self.fleet:
            for node in self.fleet.nodes:
                self.fleet.kill_host(node.namespace)
        for index in range(self.args.nodes):
            shutil.rmtree(self.node_home(index) / "data", ignore_errors=True)
        say("EC2: the fleet stopped and started again; every node's /data is empty")

    def train_under_controller(
        self, epochs: int, max_restarts: int, before_relaunch=None, **overrides
    ) -> list[dict]:
        """Attempts of one run as the deployed fleet makes them: after each, the run controller
        decides; on `relaunch` the fleet comes back (EC2's part played here) and resumes from
        S3. Returns the controller's entries."""
        entries = []
        while True:
            try:
                self.train(epochs, **overrides)
            except StepFailed as exc:  # a node failed: the controller judges DONE.json
                say(f"the nodes: {exc}")
            entry = self.end_attempt(max_restarts)
            if entry is None:
                return entries
            entries.append(entry)
            if entry["decision"] != "relaunch":
                return entries
            if before_relaunch:
                before_relaunch(self)
            self.relaunch()

    def report(self, epochs: int) -> None:
        done = self.done_json()
        if done is None:
            raise StepFailed(f"no s3://{BUCKET}/runs/{RUN}/DONE.json")
        keys = self.keep_s3()
        say("DONE.json:")
        print(json.dumps(done, indent=2), flush=True)
        if done["status"] != "succeeded":
            raise StepFailed(f"DONE.json status {done['status']}: {done['reason']}")
        if not any(k.endswith(".index") for k in keys if "/model/checkpoints/" in k):
            raise StepFailed("no checkpoint under runs/<run>/model/checkpoints/")
        if done["epochs"] != epochs:
            raise StepFailed(f"DONE.json says {done['epochs']} epochs, expected {epochs}")
        chance = 1 / self.args.classes
        say(
            f"final accuracy: top-1 {done['top1']:.3f} (chance {chance:.3f}), top-5 {done['top5']:.3f}"
        )
