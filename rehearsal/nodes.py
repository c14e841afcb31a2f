"""What the rehearsal's nodes run: the sample dataset's raw/ archives, the preprocessing node, and
the training nodes with their node.json, on hosts (rehearsal/hosts.py) or as processes; each
node's home, address and current instance, and a fleet deployed anew.

`Nodes` is one part of `Rehearsal` (rehearsal/core.py): it starts the nodes as the rehearsal's
processes (rehearsal/processes.py) against the local S3 (rehearsal/local_s3.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from contract import names, runs
from rehearsal.common import BUCKET, REGION, REPO, RUN, say
from rehearsal.hosts import NODE_INTERFACE, SSH_PORT

HEARTBEAT_TIMEOUT_S = 60  # node.json's, and TrainStack's tag the run controller reads

RAW_FILES = (
    "ILSVRC2012_img_train.tar",
    "ILSVRC2012_img_val.tar",
    "ILSVRC2012_validation_ground_truth.txt",
)


class Nodes:
    """The sample dataset, the preprocessing node, the training nodes and their fleet."""

    def start_sample(self) -> None:
        """Start writing the sample's raw/ archives; make_sample waits for them."""
        raw = self.workdir / "raw"
        cmd = [sys.executable, "-m", "trainer.preprocess.sample", "--output", str(raw)]
        cmd += ["--classes", str(self.args.classes), "--train-per-class", str(self.args.per_class)]
        cmd += ["--val-images", str(self.args.val_images)]
        self.start("sample", cmd, self.env())

    def make_sample(self) -> None:
        """Wait for the archives start_s3(sample=True) began, then upload them."""
        self.wait({"sample": self.named["sample"]}, 600)
        raw = self.workdir / "raw"
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
            "built_at": runs.stamp_at(time.time()),
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
            "train_shards": self.shards[0],
            "val_shards": self.shards[1],
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
        """Node `index`'s current instance: a replacement is a new instance, with a new id; the
        deployed fleet's in moto (rehearsal/cloud.py) by the id EC2 gave it."""
        return self.launched.get(index) or self.deployed.get(index, f"rehearsal-node-{index}")

    def head_ip(self) -> str:
        return self.fleet.head.ip if self.fleet else "127.0.0.1"

    def notice_file(self, index: int) -> Path:
        """Where node `index`'s current instance reads its Spot interruption notice (its IMDS
        `spot/instance-action`): a replacement, a new instance, has none."""
        return self.workdir / "imds" / f"{self.instance_id(index)}.instance-action.json"

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
        if self.fleet:
            self.fleet.renew(self.fleet.head)
        else:
            shutil.rmtree(self.workdir / "head", ignore_errors=True)
        shutil.rmtree(self.workdir / "imds", ignore_errors=True)
        self.launched.clear()
        self.deployed, self.head_instance = {}, None
        self.close_cloud()  # its instances were the old deployment's

    def train(self, epochs: int, absent: tuple[int, ...] = (), **overrides) -> None:
        """Start every node's train_node.sh and the head's, and wait for all (a fault row
        without a run controller: their exits are the attempt's end)."""
        self.wait(self.start_nodes(epochs, absent, **overrides), self.args.timeout)

    def start_nodes(self, epochs: int, absent: tuple[int, ...] = (), **overrides) -> dict:
        """Start every node's train_node.sh and the head's; the processes by name. A second
        call is the rerun after a reboot: the processes (sshd included) are gone, the disks,
        keys and the run's S3 prefix are not, so the pull is skipped and training resumes from
        S3."""
        self.end_nodes()  # the sshd of a node whose bootstrap restarted too
        if self.node_processes:
            # Only S3 may hold the checkpoint a rerun resumes from.
            shutil.rmtree(self.head_home() / "data" / "model", ignore_errors=True)
        self.output.clear()
        data_mount = self.workdir / "data"  # every namespace node sees its own data here
        data_mount.mkdir(exist_ok=True)
        procs = {}
        for index in range(self.args.nodes):
            if index in absent:  # a node that never boots (the fault rehearsal)
                continue
            procs[f"node{index}"] = self.start_instance(
                f"node{index}", self.node_document(index, epochs, overrides), data_mount
            )
        procs["head"] = self.start_instance(
            "head", self.head_document(epochs, overrides), data_mount
        )
        self.node_processes = list(procs.values())
        self.node_groups = [proc.pid for proc in self.node_processes]
        self.restarts.clear()
        return procs

    def head_home(self) -> Path:
        """The head's own files; without namespaces its model dir is node 0's (one disk)."""
        return self.fleet.head.home if self.fleet else self.workdir / "node0"

    def start_instance(self, name: str, doc: dict, data_mount: Path) -> subprocess.Popen:
        """train_node.sh on its host (its namespace, its /data) as user-data starts it, and
        what systemd's restart of its bootstrap runs there."""
        host = None
        if self.fleet:
            host = self.fleet.head if name == "head" else self.fleet.nodes[int(name[4:])]
        home = Path(doc["state_dir"]).parent
        env = {**self.env("node"), "NODE_JSON": str(self.node_json(home / f"{name}.json", doc))}
        script = [str(REPO / "bootstrap" / "train_node.sh")]
        # The head runs no sshd: nobody starts processes on it.
        cmd = (
            self.fleet.node_command(host, data_mount, script, sshd=name != "head")
            if host
            else script
        )
        # A restarted unit reruns the script on the same host, whose sshd still runs.
        again = self.fleet.node_command(host, data_mount, script, sshd=False) if host else cmd
        self.services[name] = (again, env)
        return self.start(name, cmd, env)

    def head_document(self, epochs: int, overrides: dict) -> dict:
        """The head's node.json: the nodes' keys, role head, no index (docs/contracts.md)."""
        doc = self.node_document(0, epochs, overrides)
        home = self.fleet.head.home if self.fleet else self.workdir / "head"
        doc.update(self.common(home))
        doc.pop("node_index", None)
        doc.pop("spot_notice_file", None)
        doc.update(
            role="head",
            ip=self.head_ip(),
            instance_id=self.head_instance or "rehearsal-head",
            mount_point=str(self.workdir / "data" if self.fleet else self.head_home() / "data"),
            authorized_keys_file=str(home / "ssh" / "authorized_keys"),
        )
        return doc

    def node_document(self, index: int, epochs: int, overrides: dict) -> dict:
        node = self.fleet.nodes[index] if self.fleet else None
        home = node.home if node else self.workdir / f"node{index}"
        doc = {
            "role": "train",
            **self.common(home),
            "run": RUN,
            "node_index": index,
            "nodes": self.args.nodes,
            "gpus_per_node": 0,
            "instance_type": "rehearsal-cpu",
            "efa": False,
            "dataset_prefix": "tfrecords/",
            "runs_prefix": runs.prefix(RUN),
            "rendezvous_timeout_s": 300,
            "trainer": {
                "epochs": epochs,
                "batch_per_gpu": 32,
                "arch": "resnet18",
                "image_size": 32,
                "log_every": 5,
                "warmup_epochs": 1,
                "data_wait_s": 600,  # stacks/config.py DATA_WAIT_S: training starts on own shards
            },
            "metrics": {"namespace": names.METRIC_NAMESPACE, "dimension": {"Run": RUN}},
            "image": {
                "manifest": str(self.image_manifest()),
                "ami": "rehearsal-image",
                "tensorflow": "2.15.1",
                "horovod": "0.28.1",
            },
            "instance_store": False,
            "mount_point": str(self.workdir / "data" if node else home / "data"),
            "ip": self.node_ip(index),
            "instance_id": self.instance_id(index),
            # EC2's launch time, for the start-up record: this process's start.
            "launched_at": runs.stamp_at(time.time()),
            "ssh_port": SSH_PORT,
            "authorized_keys_file": str(home / "ssh" / "authorized_keys"),
            "network_interface": NODE_INTERFACE if node else None,
            "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
            # stacks/train/stack.py's elastic settings for this many nodes (2: the run
            # controller's REPLACEMENTS_PER_NODE, which the synthesized tick has).
            "min_nodes": max(1, self.args.nodes - 1),
            "reset_limit": self.args.nodes * (2 * 2 + 1),
            "checkpoint_sync_s": 30,
            # CPU processes cost nothing; the status screen still shows the dollars line.
            "cost": {"usd_per_hour": 0.0, "prices_as_of": "rehearsal", "max_hours": 1},
            "status_every_s": 1,  # epochs last seconds here: a screen for each
        }
        doc["trainer"].update(overrides.get("trainer", {}))
        doc.update({k: v for k, v in overrides.items() if k != "trainer"})
        if index in self.launched:  # the replacement template's node.json: no index
            del doc["node_index"]  # (the node reads the controller's launch assignment)
        self.market = doc.get("market", "on-demand")
        if self.market == "spot":
            doc["spot_notice_file"] = str(self.notice_file(index))
        return doc
