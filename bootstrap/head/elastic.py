"""The head's elastic horovodrun: its command line, its environment, its ssh and its network.

Elastic Horovod runs over Gloo only (horovod/runner/launch.py v0.28.1 `_run_elastic`: "Gloo
support is required to use elastic training"; gloo_run.py `gloo_run_elastic`): Gloo carries
Horovod's coordination and the rendezvous, NCCL the GPU collectives (HOROVOD_GPU_OPERATIONS is
built into the image's Horovod), and only hierarchical allreduce, which needs MPI, is lost.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

from bootstrap.head.discovery import REFRESH_S, Verdict
from bootstrap.node_config import TrainConfig

# horovod/runner/elastic/driver.py v0.28.1 DISCOVER_HOSTS_FREQUENCY_SECS: Horovod runs the
# discovery script this often.
HOROVOD_DISCOVERY_S = 1.0
# The longest a failed host stays out before Horovod tries it again, if discovery still lists
# it (Horovod allows at most 3600: elastic/discovery.py DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS).
COOLDOWN_MAX_S = 600
COOLDOWN_CAP_S = 3600  # Horovod refuses a longer one
# A Gloo collective's wait on a silent peer (HOROVOD_GLOO_TIMEOUT_SECONDS, read per rank by
# horovod/common/gloo/gloo_context.cc): under elastic training a peer that stops answering costs a
# reset, not an attempt, so it is let go within the issue's ~30 s. A paused rank costs the same.
ELASTIC_COLLECTIVE_TIMEOUT_S = 30
SSH_WRAPPER = Path(__file__).with_name("ssh.sh")
SSH_ENV = "HOROVOD_FLEET_SSH"  # the real ssh, which the wrapper execs (bootstrap/head/ssh.sh)


def cooldown_range(cfg: TrainConfig) -> tuple[int, int]:
    """--blacklist-cooldown-range: without one, Horovod never takes a failed host back
    (docs/elastic.rst, "Blacklisting"), so a replacement at a reused address could not join.
    The lower bound outlasts a dead host's heartbeat going stale and the discovery dropping it,
    so a dead host is not tried again: the docs give it as the first cooldown, the code as at
    least twice it (elastic/discovery.py HostState._set_cooldown_period: lower * 2^count +
    random * lower, count 1 at the first failure)."""
    lower = min(
        math.ceil(cfg.heartbeat_timeout_s + REFRESH_S + HOROVOD_DISCOVERY_S), COOLDOWN_CAP_S
    )
    return lower, max(lower, COOLDOWN_MAX_S)


def elastic_command(
    cfg: TrainConfig,
    *,
    discovery: str,
    key: Path,
    interface: str | None,
    program: list[str],
    nodes: int | None = None,
) -> list[str]:
    """horovodrun with every node's slots at most, minNodes' at least, the discovery script, a
    reset limit and a blacklist cooldown; ssh with the run's key on the nodes' port. `nodes`:
    the nodes it starts on (a horovodrun started again on the nodes left; the driver waits for
    -np slots at its start, horovod/runner/elastic/driver.py v0.28.1 lines 102-104 and 181-186),
    every node by default."""
    slots = cfg.slots
    lower, upper = cooldown_range(cfg)
    command = [
        "horovodrun",
        "--gloo",
        "-np", str((nodes or cfg.nodes) * slots),
        "--min-np", str(cfg.min_nodes * slots),
        "--max-np", str(cfg.nodes * slots),
        "--slots-per-host", str(slots),
        "--host-discovery-script", discovery,
        # How long the driver waits for --min-np slots after a reset, and for -np at the start
        # (elastic/driver.py wait_for_available_slots; 600 s by default).
        "--elastic-timeout", str(int(cfg.elastic_timeout_s)),
        "--blacklist-cooldown-range", str(lower), str(upper),
        "--ssh-port", str(cfg.ssh_port),
        "--ssh-identity-file", str(key),
        "--start-timeout", str(int(min(cfg.rendezvous_timeout_s, 600))),
    ]  # fmt: skip
    if cfg.reset_limit is not None:
        command += ["--reset-limit", str(cfg.reset_limit)]
    if interface:
        command += ["--network-interface", interface]
    return command + program


# What horovodrun's elastic driver says when the hosts it may use (the discovery's, less those it
# took out after their ranks failed) held fewer than --min-np slots for --elastic-timeout
# (horovod/runner/elastic/driver.py v0.28.1 wait_for_available_slots). The discovery may still
# list a node whose host the driver took out (its heartbeat is not stale yet): the driver's word
# is the one that ended the job.
DRIVER_TOO_FEW = "Please check that you have enough resources to run at least"


def driver_gave_up(reason: str, min_nodes: int) -> str | None:
    """Fewer than min_nodes nodes left, when horovodrun's elastic driver said so in `reason`."""
    if DRIVER_TOO_FEW not in reason:
        return None
    return (
        f"fewer than minNodes ({min_nodes}) nodes left to train on: horovodrun's elastic driver "
        "found too few slots within elastic_timeout_s (a node's ranks failed and its host is out)"
    )


def too_few_left(verdict: Verdict | None, min_nodes: int) -> list[str]:
    """Why the elastic horovodrun ended when the discovery lists fewer than min_nodes nodes (its
    driver waited --elastic-timeout for their slots, then gave up), for the failure's reason; []
    when enough are listed (the failure is the ranks' own)."""
    if verdict is None or len(verdict.live) >= min_nodes:
        return []
    left = "; ".join(why for _, why in sorted(verdict.left.items()))
    return [
        f"fewer than minNodes ({min_nodes}) nodes left to train on, {len(verdict.live)} listed"
        + (f": {left}" if left else "")
    ]


def install_ssh_wrapper(state_dir: Path) -> Path:
    """The keep-alive ssh (bootstrap/head/ssh.sh) as `<state_dir>/ssh-bin/ssh`, executable (the
    code assets are unzipped without modes); returns its directory."""
    directory = state_dir / "ssh-bin"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "ssh"
    shutil.copyfile(SSH_WRAPPER, target)
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def elastic_env(env: dict[str, str], ssh_bin: Path) -> dict[str, str]:
    """The launcher's environment for the elastic horovodrun: the keep-alive ssh first on its
    PATH, the real one named for it, the Gloo timeout of a reset."""
    path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p != str(ssh_bin)]
    real = env.get(SSH_ENV) or shutil.which("ssh", path=os.pathsep.join(path))
    if real is None:
        raise RuntimeError("no ssh on the head's PATH: horovodrun starts every rank over ssh")
    return env | {
        "PATH": os.pathsep.join([str(ssh_bin), *path]),
        SSH_ENV: real,
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(ELASTIC_COLLECTIVE_TIMEOUT_S),
    }


# ---------------------------------------------------------------- the driver's network name

Run = Callable[..., subprocess.CompletedProcess]


def addresses(run: Run = subprocess.run) -> list[tuple[str, str]]:
    """(interface name, IPv4 address) of this host (`ip -o -4 addr show`: one line per address,
    `2: ens5    inet 10.0.0.7/24 ...`)."""
    listing = run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True)
    found = []
    for line in listing.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            found.append((fields[1].rstrip(":"), fields[3].split("/")[0]))
    return found


def interface_of(ip: str, run: Run = subprocess.run) -> str | None:
    """The name of this host's interface that holds `ip`, or None."""
    return next((name for name, address in addresses(run) if address == ip), None)


def alias_interface(name: str, ip: str, run: Run = subprocess.run) -> str | None:
    """Make this host have an interface called `name` that holds `ip`, when it has none.

    horovodrun gives Gloo one interface name for every rank (HOROVOD_GLOO_IFACE) and takes the
    driver's address from the same name on the driver's host (horovod/runner/util/network.py
    get_driver_ip: `net_if_addrs()[iface]`). The nodes' name (a p4d's, say) need not exist on
    the head (a c6i), so the head gets one: a veth end of that name holding its own address as a
    /32, which adds no route (traffic still leaves by its real interface) and which Linux
    answers on any interface. Returns what it did, or None when nothing was needed."""
    if (name, ip) in addresses(run):  # its own, or the alias a previous start added
        return None
    links = run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    if any(line.split(":")[1].strip().split("@")[0] == name for line in links.splitlines()):
        raise RuntimeError(
            f"this host has an interface {name} that does not hold its address {ip}: horovodrun "
            "would give the ranks the wrong driver address"
        )
    peer = f"{name[:11]}-hfp"
    for command in (
        ["ip", "link", "add", name, "type", "veth", "peer", "name", peer],
        ["ip", "addr", "add", f"{ip}/32", "dev", name],
        ["ip", "link", "set", name, "up"],
        ["ip", "link", "set", peer, "up"],
    ):
        run(command, capture_output=True, text=True, check=True)
    return f"added interface {name} holding {ip}/32 (the nodes' interface name) for horovodrun"
