"""Fleet rendezvous through the run prefix in S3: registration, the run's SSH key, the hostfile.

Layout (docs/contracts.md): runs/<run>/nodes/<index>.json (each node's registration, its
heartbeat), runs/<run>/head.json (the head's), runs/<run>/ssh/head.pub, runs/<run>/hostfile.
Every step is idempotent, so a rebooted or redeployed node with the same run name repeats it
safely. Nodes keep re-registering until the run's DONE.json appears (a heartbeat), and the head
only counts registrations younger than heartbeat_timeout_s: after a redeploy, the old instances'
entries (old IPs) are never mistaken for live nodes.

A relaunch can replace the head (its instance terminated) and the nodes (a Spot fleet comes back
as new instances, with new keys and addresses). The head's rendezvous therefore counts only
registrations written since it began, by nodes that name the key it published
(`head_key_sha256`): a node that installed an old key, or an entry of an instance that is gone,
would refuse or miss horovodrun's ssh.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from botocore.exceptions import ClientError

from bootstrap import aws
from bootstrap.aws import poll_until
from bootstrap.node_config import TrainConfig
from contract import causes, runs
from contract.runs import parse_stamp_s, stamp_at


class RendezvousError(RuntimeError):
    """Nodes of the fleet did not register in time."""

    cause = causes.NODES_MISSING


class HeadLost(RendezvousError):
    """A node's head went silent: its heartbeat is stale, or it never beat."""

    cause = causes.NODE_LOST


def read_object(s3, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None while it does not exist."""
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response["Error"]["Code"] in aws.ABSENT_KEY_CODES:
            return None
        raise


def key_fingerprint(public_key: str) -> str:
    """What a registration names the head's key by: sha256 of its line."""
    return hashlib.sha256(public_key.strip().encode()).hexdigest()


def register_node(
    s3,
    cfg: TrainConfig,
    ip: str,
    instance_id: str,
    now: float,
    head_key: str | None = None,
    shards: str | None = None,
    interface: str | None = None,
) -> dict:
    """The node's registration, its heartbeat. `shards`: what it holds of the dataset, "own"
    (what its ranks read in the fleet's first world) or "all" (what any other world needs);
    `interface`: the name of its network interface that holds `ip` (the head gives horovodrun
    that name, bootstrap/head/elastic.py)."""
    entry = {
        "index": cfg.node_index,
        "ip": ip,
        "gpus": cfg.gpus_per_node,
        "instance_id": instance_id,
        "registered_at": stamp_at(now),
        "head_key_sha256": head_key,
        "shards": shards,
        "interface": interface,
    }
    key = f"{cfg.runs_prefix}{runs.NODES}{cfg.node_index}.json"
    s3.put_object(Bucket=cfg.bucket, Key=key, Body=json.dumps(entry).encode())
    return entry


def private_key_path(cfg: TrainConfig) -> Path:
    return Path(cfg.state_dir) / "ssh" / cfg.run / "id_ed25519"


HEAD_KEY = "ssh/head.pub"  # under the run prefix: the head's public key, which every node installs


def register_head(s3, cfg: TrainConfig, ip: str, instance_id: str, now: float, key: str) -> dict:
    """The head's heartbeat, which every node watches (supervision.HeadWatch)."""
    entry = {
        "ip": ip,
        "instance_id": instance_id,
        "registered_at": stamp_at(now),
        "head_key_sha256": key,
    }
    s3.put_object(
        Bucket=cfg.bucket, Key=f"{cfg.runs_prefix}{runs.HEAD}", Body=json.dumps(entry).encode()
    )
    return entry


def ensure_head_key(s3, cfg: TrainConfig) -> Path:
    """Make the run's key pair once (reused on reruns) and publish its public half: the private
    half stays on the head, which starts every rank over ssh."""
    key = private_key_path(cfg)
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hvd-{cfg.run}", "-f", str(key)],
            check=True,
        )
    public = key.with_suffix(".pub").read_bytes()
    pub_key = f"{cfg.runs_prefix}{HEAD_KEY}"
    if read_object(s3, cfg.bucket, pub_key) != public:
        s3.put_object(Bucket=cfg.bucket, Key=pub_key, Body=public)
    return key


def install_authorized_key(path: str | Path, public_key: str) -> bool:
    """Append the key unless it is there already; returns whether the file changed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = public_key.strip()
    existing = path.read_text().splitlines() if path.exists() else []
    if line in (existing_line.strip() for existing_line in existing):
        return False
    with path.open("a") as out:
        out.write(line + "\n")
    os.chmod(path, 0o600)
    return True


def wait_for_head_key(
    s3, cfg: TrainConfig, clock=time.time, sleep=time.sleep, timeout_s: float | None = None
) -> str:
    timeout_s = cfg.rendezvous_timeout_s if timeout_s is None else timeout_s
    pub_key = f"{cfg.runs_prefix}{HEAD_KEY}"
    found = poll_until(
        lambda: read_object(s3, cfg.bucket, pub_key), timeout_s, cfg.poll_interval_s, clock, sleep
    )
    if not found:
        raise RendezvousError(
            f"the head did not publish s3://{cfg.bucket}/{pub_key} within {timeout_s:.0f} s"
        )
    return found.decode()


def live_nodes(
    s3, cfg: TrainConfig, now: float, head_key: str | None = None, since: float | None = None
) -> dict[int, dict]:
    """Registrations of this run young enough to belong to running instances; with `head_key`,
    only those naming that key, and with `since`, only those written at or after it (stamps
    have whole seconds)."""
    listing = s3.list_objects_v2(Bucket=cfg.bucket, Prefix=f"{cfg.runs_prefix}{runs.NODES}")
    nodes = {}
    for obj in listing.get("Contents", []):
        entry = json.loads(read_object(s3, cfg.bucket, obj["Key"]) or b"{}")
        registered = parse_stamp_s(entry["registered_at"])
        fresh = (
            now - registered <= cfg.heartbeat_timeout_s
            and (since is None or registered >= int(since))
            and (head_key is None or entry.get("head_key_sha256") == head_key)
        )
        # A node's own entry is current by construction, however long it has been waiting.
        if (fresh or entry["index"] == cfg.node_index) and 0 <= entry["index"] < cfg.nodes:
            nodes[entry["index"]] = entry
    return nodes


MISSING_NOTE_EVERY_S = 30  # how often the head says who it is still waiting for


def describe_missing(cfg: TrainConfig, nodes: dict[int, dict]) -> str:
    missing = [str(i) for i in range(cfg.nodes) if i not in nodes]
    return f"node(s) {', '.join(missing)} of {cfg.nodes}"


def wait_for_nodes(
    s3,
    cfg: TrainConfig,
    clock=time.time,
    sleep=time.sleep,
    log=aws.log,
    head_key: str | None = None,
    since: float | None = None,
    while_waiting: Callable[[], None] = lambda: None,
) -> list[dict]:
    """All N live registrations sorted by index, or RendezvousError naming the missing ones.
    Says every 30 s which nodes it still waits for. `head_key` and `since`: see live_nodes;
    while_waiting() at each look."""
    started = clock()
    next_note = started + MISSING_NOTE_EVERY_S

    def all_registered() -> dict[int, dict] | None:
        nonlocal next_note
        while_waiting()
        nodes = live_nodes(s3, cfg, clock(), head_key, since)
        if len(nodes) == cfg.nodes:
            return nodes
        if clock() >= next_note:
            log(
                f"rendezvous: waiting {clock() - started:.0f} s for {describe_missing(cfg, nodes)}"
                f" to register under s3://{cfg.bucket}/{cfg.runs_prefix}{runs.NODES} (giving up after "
                f"{cfg.rendezvous_timeout_s:.0f} s)"
            )
            next_note = clock() + MISSING_NOTE_EVERY_S
        return None

    nodes = poll_until(all_registered, cfg.rendezvous_timeout_s, cfg.poll_interval_s, clock, sleep)
    if nodes:
        return [nodes[i] for i in range(cfg.nodes)]
    present = live_nodes(s3, cfg, clock(), head_key, since)
    raise RendezvousError(
        f"{describe_missing(cfg, present)} did not register under "
        f"s3://{cfg.bucket}/{cfg.runs_prefix}{runs.NODES} within {cfg.rendezvous_timeout_s:.0f} s"
    )


def hostfile_text(slots_per_node: list[tuple[str, int]]) -> str:
    """`<ip> slots=<n>` per (ip, n) in order (rank 0 on the first); nodes sharing an address
    (the rehearsal without namespaces) become one line."""
    slots: dict[str, int] = {}
    for ip, count in slots_per_node:
        slots[ip] = slots.get(ip, 0) + count
    return "".join(f"{ip} slots={count}\n" for ip, count in slots.items())


def write_hostfile(s3, cfg: TrainConfig, nodes: list[dict], path: str | Path) -> str:
    """The hostfile of `nodes` (index order, one slot per GPU), locally and in S3."""
    text = hostfile_text([(node["ip"], node["gpus"] or 1) for node in nodes])
    Path(path).write_text(text)
    s3.put_object(Bucket=cfg.bucket, Key=f"{cfg.runs_prefix}hostfile", Body=text.encode())
    return text


def last_written(s3, cfg: TrainConfig, name: str) -> float | None:
    """When runs/<run>/<name> was last written (S3's LastModified), or None while absent."""
    try:
        head = s3.head_object(Bucket=cfg.bucket, Key=f"{cfg.runs_prefix}{name}")
    except ClientError:
        return None
    return head["LastModified"].timestamp()


def run_finished_since(s3, cfg: TrainConfig, since: float) -> bool:
    written = last_written(s3, cfg, runs.DONE)
    return written is not None and written >= since


FLEET_CHECK = "fleet-check.json"


def signal_fleet_ready(cfg: TrainConfig, detail: str, log=aws.log) -> None:
    """SUCCESS to CloudFormation: this node is healthy with its data, and the fleet passed."""
    log(aws.signal_cloudformation(cfg, True, f"healthy, data verified; fleet check: {detail}"))


def write_fleet_check(s3, cfg: TrainConfig, detail: str, now: float) -> None:
    """The head's word that the fleet passed its checks (every node met, the allreduce crossed
    the nodes as the type requires): each node signals CloudFormation SUCCESS on it."""
    document = {"passed": True, "detail": detail, "at": stamp_at(now)}
    s3.put_object(
        Bucket=cfg.bucket, Key=f"{cfg.runs_prefix}{FLEET_CHECK}", Body=json.dumps(document).encode()
    )


def read_fleet_check(s3, cfg: TrainConfig, since: float) -> dict | None:
    """This deployment's fleet check (written at or after `since`), or None."""
    body = read_object(s3, cfg.bucket, f"{cfg.runs_prefix}{FLEET_CHECK}")
    if body is None:
        return None
    document = json.loads(body)
    # Stamps have whole seconds: a check written in the second this node started counts.
    return document if parse_stamp_s(document["at"]) >= int(since) else None


def serve_as_member(
    s3,
    cfg: TrainConfig,
    ip: str,
    instance_id: str,
    log,
    clock=time.time,
    sleep=time.sleep,
    head_lost: Callable[[float], str | None] = lambda now: None,
    fleet_ready: Callable[[dict], None] = lambda check: None,
    shards: Callable[[], str | None] = lambda: None,
    on_beat: Callable[[float], None] = lambda now: None,
    interface: str | None = None,
) -> None:
    """Install the head's key, register, then heartbeat until the run's DONE.json appears (the
    head's, or a node's that found the head lost), or until head_lost(now) says why the head is
    gone (bootstrap.fleet.supervision.HeadWatch): this node then writes it. fleet_ready(check)
    is called once, when the head's fleet check of this deployment appears. Each registration
    says what shards() holds and the node's `interface`; on_beat(now) runs at each beat (it may
    raise: the node's data pull failed).

    The key goes in before the registration, so the head never ssh-es to a node that would
    refuse it; a key the head replaced (a relaunched head) is picked up on the next beat.
    """
    started = clock()
    ready = False
    while not run_finished_since(s3, cfg, started):
        if not ready and (check := read_fleet_check(s3, cfg, started)):
            fleet_ready(check)
            ready = True
        public_key = wait_for_head_key(s3, cfg, clock, sleep)
        if install_authorized_key(cfg.authorized_keys_file, public_key):
            log(f"installed the run's public key in {cfg.authorized_keys_file}")
        register_node(
            s3, cfg, ip, instance_id, clock(), key_fingerprint(public_key), shards(), interface
        )
        on_beat(clock())
        if why := head_lost(clock()):
            raise HeadLost(why)
        sleep(min(cfg.poll_interval_s, cfg.heartbeat_timeout_s / 4))
    log("DONE.json is written: this node's part is over")
