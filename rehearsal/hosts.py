"""Simulated training hosts for the rehearsal: one network namespace per node on a private
bridge, each with its own address, its own sshd (own host key and authorized_keys file) and its
own /data (a bind mount visible only inside the node), so the rendezvous, the key exchange and
horovodrun's ssh launch run exactly as across real instances. The head is one more namespace
on the bridge, whose interface has another name than the nodes' (a c6i's is not a p4d's), so
the head's alias of the nodes' name (bootstrap/head/elastic.py alias_interface) runs here too.

Everything is named after the rehearsal's process id and removed by `Fleet.close()`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

SSH_PORT = 2222
NODE_INTERFACE = "hf0"  # the same name inside every namespace: horovodrun --network-interface
HEAD_INTERFACE = "hfhead0"  # the head's own: not the nodes'


def namespaces_available() -> tuple[bool, str]:
    """Whether this machine can simulate separate hosts; otherwise why not."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' not found"
    if not Path("/usr/sbin/sshd").exists():
        return False, "sshd not installed (apt-get install openssh-server)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return False, f"ip netns does not work here: {probe.stderr.strip()}"
    return True, "root, ip netns and sshd available"


def _run(*cmd: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip()}")


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no interface on this machine uses (several rehearsals, or
    other engineers' namespaces, may run at the same time)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    start = os.getpid() % 200 + 20
    for third in [*range(start, 250), *range(20, start)]:
        subnet = ipaddress.ip_network(f"10.213.{third}.0/24")
        if f" 10.213.{third}." not in used:
            return subnet
    raise RuntimeError("no free /24 in 10.213.0.0/16")


@dataclass
class Node:
    index: int | None  # None: the head
    namespace: str
    ip: str
    home: Path  # this node's private files: ssh/, state/, logs/, data/ (its "/data")

    @property
    def authorized_keys(self) -> Path:
        return self.home / "ssh" / "authorized_keys"


class Fleet:
    """Bridge + namespaces + sshd per node. Use as a context manager."""

    def __init__(self, count: int, workdir: Path, tag: str):
        self.subnet = free_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])  # the host side: the local S3 endpoint listens here
        self.bridge = f"hf{tag}br"
        self.nodes = [
            Node(i, f"hf-{tag}-n{i}", str(hosts[i + 1]), workdir / f"node{i}") for i in range(count)
        ]
        self.head = Node(None, f"hf-{tag}-head", str(hosts[-1]), workdir / "head")
        self._spare = [str(host) for host in hosts[count + 1 : -1]]  # addresses for replacements
        self.sshd: list[subprocess.Popen] = []
        self._links: list[str] = []
        self._namespaces: list[str] = []
        self._etc: list[Path] = []

    def __enter__(self) -> Fleet:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for node in [*self.nodes, self.head]:
            interface = NODE_INTERFACE if node is not self.head else HEAD_INTERFACE
            host_side = f"{self.bridge[:-2]}v{'h' if node is self.head else node.index}"
            _run("ip", "netns", "add", node.namespace)
            self._namespaces.append(node.namespace)
            _run("ip", "link", "add", host_side, "type", "veth", "peer", "name", interface,
                 "netns", node.namespace)  # fmt: skip
            self._links.append(host_side)
            _run("ip", "link", "set", host_side, "master", self.bridge, "up")
            ns = ("ip", "netns", "exec", node.namespace)
            _run(*ns, "ip", "addr", "add", f"{node.ip}/24", "dev", interface)
            _run(*ns, "ip", "link", "set", interface, "up")
            _run(*ns, "ip", "link", "set", "lo", "up")
            self._prepare_ssh(node)

    def _prepare_ssh(self, node: Node) -> None:
        ssh = node.home / "ssh"
        ssh.mkdir(parents=True, mode=0o700)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "host_key"))
        (ssh / "sshd_config").write_text(
            f"ListenAddress {node.ip}\nPort {SSH_PORT}\nHostKey {ssh / 'host_key'}\n"
            f"AuthorizedKeysFile {node.authorized_keys}\nPidFile none\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel ERROR\n"
        )
        # `ip netns exec` mounts /etc/netns/<ns>/* over /etc/: this node's ssh client keeps the
        # host keys it learns in its own file instead of the machine's /root/.ssh/known_hosts.
        etc = Path("/etc/netns") / node.namespace
        (etc / "ssh").mkdir(parents=True)
        self._etc.append(etc)
        (etc / "ssh" / "ssh_config").write_text(
            f"Host *\n  UserKnownHostsFile {ssh / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n"
        )
        # Horovod 0.28.1 builds the Gloo device of its process sets from the host name, not from
        # --network-interface: the name must resolve to the node's own address, as on EC2.
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{node.ip} {socket.gethostname()}\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory

    def node_command(
        self, node: Node, data_mount: Path, command: list[str], sshd: bool = True
    ) -> list[str]:
        """Run `command` as the node: inside its namespace, with its data dir mounted at
        data_mount (the same path on every node, as /data is) and its sshd running alongside in
        the same mount namespace, so ranks launched over ssh see this node's data. sshd=False:
        the node's sshd runs already (a restarted bootstrap)."""
        (node.home / "data").mkdir(parents=True, exist_ok=True)
        start_sshd = '{ /usr/sbin/sshd -D -e -f "$3" 2>>"$4" & } && ' if sshd else ""
        script = f'mount --bind "$1" "$2" && {start_sshd}shift 4 && exec "$@"'
        return ["ip", "netns", "exec", node.namespace, "bash", "-c", script, "node",
                str(node.home / "data"), str(data_mount), str(node.home / "ssh" / "sshd_config"),
                str(node.home / "sshd.log"), *command]  # fmt: skip

    def replace(self, node: Node) -> None:
        """The node comes back as a new instance would (EC2 RunInstances from its launch
        template): renewed (below), at a new address."""
        self.kill_host(node.namespace)
        ns = ("ip", "netns", "exec", node.namespace)
        _run(*ns, "ip", "addr", "flush", "dev", self.interface(node))
        node.ip = self._spare.pop(0)
        _run(*ns, "ip", "addr", "add", f"{node.ip}/24", "dev", self.interface(node))
        self.renew(node)

    def interface(self, node: Node) -> str:
        return HEAD_INTERFACE if node is self.head else NODE_INTERFACE

    def renew(self, node: Node) -> None:
        """The node as a fleet deployed anew has it, at its address: every process gone, its
        network up, and nothing left of its disks: host key, authorized_keys, state, logs and
        /data start empty."""
        self.kill_host(node.namespace)
        link = self.interface(node)
        _run("ip", "netns", "exec", node.namespace, "ip", "link", "set", link, "up")
        if (
            node is self.head
        ):  # the alias its bootstrap added to its network (a new instance has none)
            subprocess.run(["ip", "netns", "exec", node.namespace, "ip", "link", "del", NODE_INTERFACE],
                           capture_output=True)  # fmt: skip
        shutil.rmtree(node.home, ignore_errors=True)
        etc = Path("/etc/netns") / node.namespace
        shutil.rmtree(etc)
        self._etc.remove(etc)
        self._prepare_ssh(node)

    def kill_host(self, namespace: str) -> list[int]:
        """SIGKILL every process of a node's namespace (bootstrap, ranks, sshd): the host is
        gone, as when its hardware fails. Returns the pids."""
        return self.signal_host(namespace, signal.SIGKILL)

    def signal_host(self, namespace: str, signum: signal.Signals) -> list[int]:
        """Send signum to every process of a node's namespace; returns the pids."""
        pids = subprocess.run(
            ["ip", "netns", "pids", namespace], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signum)
        return [int(pid) for pid in pids]

    def close(self) -> None:
        for namespace in self._namespaces:
            self.kill_host(namespace)  # whatever still runs there (sshd, ranks) goes with it
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for etc in self._etc:
            shutil.rmtree(etc, ignore_errors=True)
        if Path("/etc/netns").is_dir() and not any(Path("/etc/netns").iterdir()):
            Path("/etc/netns").rmdir()
        self._namespaces, self._links, self._etc = [], [], []
