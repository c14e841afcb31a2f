"""The rehearsal's local S3: moto_server behind the IAM judge (rehearsal/iam_s3.py) for the roles
the app synthesizes, the bucket, the run's DONE.json, the copy of runs/<run>/ kept in the work
dir, and the named snapshots the fault rows start from (rehearsal/snapshots.py).

`LocalS3` is one part of `Rehearsal` (rehearsal/core.py): it starts moto_server as one of the
rehearsal's processes (rehearsal/processes.py) and decides whether the nodes are namespaces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3

from contract import names, runs
from rehearsal import iam_s3, snapshots
from rehearsal.common import BUCKET, REGION, REPO, RUN, StepFailed, say
from rehearsal.hosts import Fleet, namespaces_available


class LocalS3:
    """The local S3 endpoint, what the run left in it, and its snapshots."""

    def start_s3(self, sample: bool = False) -> None:
        """The local S3 and its IAM judge; with `sample`, the sample dataset's archives are
        written meanwhile (make_sample uploads them): the app's synthesis below and the
        images each keep one core busy, about 10 s apiece."""
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        if sample:
            self.start_sample()
        usable, why = namespaces_available()
        if usable and not self.args.processes:
            self.fleet = Fleet(self.fleet_size or self.args.nodes, self.workdir, str(os.getpid()))
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
        if self.args.pull_mb_per_s:
            # Each node's shards at most this fast: the pull takes visible time beside the
            # start-up (docs/rehearsal.md, "The start-up, measured").
            self.iam.pace = iam_s3.Pace(re.compile(r"/tfrecords/(train|validation)-"),
                                        self.args.pull_mb_per_s * 1e6)  # fmt: skip
            say(f"the local S3 serves each node's shards at most {self.args.pull_mb_per_s:g} MB/s")
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

    @staticmethod
    def context(nodes: int) -> dict:
        """The app's context for the rehearsal's bucket, run and nodes."""
        return {"datasetBucket": BUCKET, "run": RUN, "nodes": nodes, "region": REGION}

    def synthesize(self) -> list[dict]:
        """The app's templates for the rehearsal's bucket, run and nodes (`python app.py`, as
        `cdk synth` runs it): the IAM policies the local S3 enforces come from them."""
        out = self.workdir / "cdk.out"
        context = self.context(self.args.nodes)
        env = {**self.env(), "CDK_OUTDIR": str(out), "CDK_CONTEXT_JSON": json.dumps(context),
               "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}  # fmt: skip
        result = subprocess.run(
            [sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        if result.returncode:
            raise StepFailed(f"cdk synth failed: {result.stderr.strip()[-500:]}")
        stacks = (names.TRAIN_STACK, names.PREPROCESS_STACK, names.TEARDOWN_STACK)
        return [json.loads((out / f"{name}.template.json").read_text()) for name in stacks]

    def done_json(self) -> dict | None:
        try:
            body = self.s3.get_object(Bucket=BUCKET, Key=runs.key(RUN, runs.DONE))["Body"]
            return json.loads(body.read())
        except Exception:  # no endpoint yet, no DONE.json: nothing to show
            return None

    def keep_s3(self) -> list[str]:
        """Copy what the run wrote to <workdir>/s3/: the local S3 endpoint goes away with us."""
        if not hasattr(self, "s3"):
            return []
        try:
            listing = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=runs.prefix(RUN))
            keys = [o["Key"] for o in listing.get("Contents", [])]
            for key in keys:
                (self.workdir / "s3" / key).parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(BUCKET, key, str(self.workdir / "s3" / key))
        except Exception as exc:  # the verdict matters more than the copy
            say(f"could not copy s3://{BUCKET}/runs/{RUN}/: {exc}")
            return []
        say(f"s3://{BUCKET}/runs/{RUN}/ holds {len(keys)} objects (copied to {self.workdir}/s3/)")
        return keys

    def save_snapshot(self, name: str, leave_out: tuple[str, ...] = ()) -> None:
        count = snapshots.save(self.s3, BUCKET, self.workdir / "snapshots" / name, leave_out)
        say(f"snapshot '{name}': {count} objects of s3://{BUCKET}/")

    def restore_snapshot(self, name: str) -> None:
        count = snapshots.restore(self.s3, BUCKET, self.workdir / "snapshots" / name)
        say(f"s3://{BUCKET}/ restored from snapshot '{name}' ({count} objects)")
