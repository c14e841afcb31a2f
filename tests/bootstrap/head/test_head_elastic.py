"""The head's elastic horovodrun (bootstrap/head/elastic.py): its command line against
horovodrun's own parser, the keep-alive ssh, and the driver's interface name."""

import itertools
import os
import shutil
import subprocess

import pytest
from bootstrap_helpers import train_doc

from bootstrap.fleet.interfaces import interface_of
from bootstrap.head import elastic
from bootstrap.head.elastic import (
    alias_interface,
    cooldown_range,
    elastic_command,
    elastic_env,
    install_ssh_wrapper,
)
from bootstrap.node_config import parse


def head(tmp_path, **overrides):
    doc = train_doc(role="head", state_dir=str(tmp_path / "state"), **overrides)
    del doc["node_index"]
    return parse(doc)


def command(tmp_path, **overrides):
    return elastic_command(
        head(tmp_path, **overrides),
        discovery="python3 -m bootstrap.head.hosts_file /state",
        key=tmp_path / "key",
        interface="ens32",
        program=["python3", "-m", "bootstrap.fleet.rank", "python3", "-m", "trainer.train"],
    )


def test_the_command_is_every_nodes_slots_at_most_and_min_nodes_at_least(tmp_path):
    found = command(tmp_path, nodes=8, gpus_per_node=8, min_nodes=6, reset_limit=40)
    flags = dict(itertools.pairwise(found))
    assert found[:2] == ["horovodrun", "--gloo"]  # elastic is Gloo's (launch.py _run_elastic)
    assert (flags["-np"], flags["--min-np"], flags["--max-np"]) == ("64", "48", "64")
    assert flags["--slots-per-host"] == "8" and flags["--reset-limit"] == "40"
    assert flags["--elastic-timeout"] == "120"
    assert flags["--network-interface"] == "ens32"
    assert found[-6:] == ["python3", "-m", "bootstrap.fleet.rank", "python3", "-m", "trainer.train"]


def test_horovodrun_parses_the_command_as_an_elastic_gloo_run(tmp_path):
    """horovodrun's own parser (horovod.runner.launch.parse_args, v0.28.1) reads the command as
    we mean it: elastic (a discovery script and --min-np), every setting where it reads it."""
    from horovod.runner import launch

    found = command(tmp_path, nodes=3, gpus_per_node=0, min_nodes=2, reset_limit=15)
    args = (
        launch.parse_args.__wrapped__(found[1:])
        if hasattr(launch.parse_args, "__wrapped__")
        else None
    )
    if args is None:
        import sys

        saved = sys.argv
        sys.argv = found
        try:
            args = launch.parse_args()
        finally:
            sys.argv = saved
    assert launch._is_elastic(args) and args.use_gloo
    assert (args.num_proc, args.min_num_proc, args.max_num_proc, args.slots) == (3, 2, 3, 1)
    assert args.reset_limit == 15 and args.elastic_timeout == 120
    assert args.cooldown_range == list(cooldown_range(head(tmp_path)))
    assert args.host_discovery_script == "python3 -m bootstrap.head.hosts_file /state"
    assert args.nics == {"ens32"} and args.ssh_port == 22
    assert args.command == [
        "python3",
        "-m",
        "bootstrap.fleet.rank",
        "python3",
        "-m",
        "trainer.train",
    ]


def test_a_dead_hosts_cooldown_outlasts_its_heartbeat(tmp_path):
    lower, upper = cooldown_range(head(tmp_path, heartbeat_timeout_s=120))
    assert lower > 120 and upper == 600
    assert cooldown_range(head(tmp_path, heartbeat_timeout_s=9000)) == (3600, 3600)  # Horovod's cap


def test_the_keep_alive_ssh_comes_first_and_wins_over_horovodruns_own_options(tmp_path):
    """`ssh -G` prints the options ssh would use without connecting: the wrapper's keep-alives
    hold, and its ConnectTimeout wins over a later one (ssh takes the first value)."""
    real = shutil.which("ssh")
    if real is None:
        pytest.skip("no ssh client here")
    ssh_bin = install_ssh_wrapper(tmp_path / "state")
    env = elastic_env({"PATH": os.environ["PATH"]}, ssh_bin)
    assert env["PATH"].split(os.pathsep)[0] == str(ssh_bin) and env[elastic.SSH_ENV] == real
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "30"
    # As horovodrun runs it: through a shell, `ssh` found on PATH (remote.py SSH_COMMAND_PREFIX).
    shown = subprocess.run(
        "ssh -G -o PasswordAuthentication=no -o StrictHostKeyChecking=no 10.0.0.7 -p 2222 "
        "-o ConnectTimeout=60",
        shell=True, env=env, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    for setting in ("serveraliveinterval 5", "serveralivecountmax 3", "connecttimeout 10"):
        assert setting in shown
    assert "port 2222" in shown
    # Installed again (a restarted bootstrap): the PATH holds it once.
    again = elastic_env(env, install_ssh_wrapper(tmp_path / "state"))
    assert again["PATH"].split(os.pathsep).count(str(ssh_bin)) == 1


ADDRESSES = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: ens5    inet 10.0.0.7/24 metric 100 brd 10.0.0.255 scope global dynamic ens5\\       valid_lft 3000sec
"""
LINKS = """1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN
2: ens5: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9001 qdisc mq state UP
"""


class StubIp:
    """`ip` as a c6i head answers it: one interface, ens5, with 10.0.0.7."""

    def __init__(self):
        self.calls = []

    def __call__(self, command, **_):
        self.calls.append(command)
        out = {("-o", "-4"): ADDRESSES, ("-o", "link"): LINKS}.get(tuple(command[1:3]), "")
        return subprocess.CompletedProcess(command, 0, out, "")


def test_the_interface_holding_an_address_is_found_by_name():
    assert interface_of("10.0.0.7", StubIp()) == "ens5"
    assert interface_of("10.0.0.8", StubIp()) is None


def test_the_head_gets_the_nodes_interface_name_holding_its_own_address():
    ip = StubIp()
    assert "added interface ens32" in alias_interface("ens32", "10.0.0.7", ip)
    assert ip.calls[-4:] == [
        ["ip", "link", "add", "ens32", "type", "veth", "peer", "name", "ens32-hfp"],
        ["ip", "addr", "add", "10.0.0.7/32", "dev", "ens32"],
        ["ip", "link", "set", "ens32", "up"],
        ["ip", "link", "set", "ens32-hfp", "up"],
    ]
    assert alias_interface("ens5", "10.0.0.7", StubIp()) is None  # same name: nothing to do
    with pytest.raises(RuntimeError, match="does not hold its address"):
        alias_interface("ens5", "10.0.0.9", StubIp())


def test_a_restarted_head_keeps_the_alias_it_added():
    ip = StubIp()
    aliased = (
        ADDRESSES + "4: ens32    inet 10.0.0.7/32 scope global ens32\\       valid_lft forever\n"
    )

    def ip_with_alias(command, **_):
        listing = aliased if command[1:3] == ["-o", "-4"] else LINKS
        return subprocess.CompletedProcess(command, 0, listing, "")

    assert interface_of("10.0.0.7", ip_with_alias) == "ens5"
    assert alias_interface("ens32", "10.0.0.7", ip_with_alias) is None
    assert ip.calls == []


def test_the_drivers_word_on_too_few_slots_is_fewer_than_min_nodes():
    """horovodrun's elastic driver gave up waiting for --min-np slots (a node's ranks failed and
    the driver took its host out, while the discovery still lists it): fewer than minNodes."""
    said = (
        "horovodrun exited 1: collective timeout: Timed out waiting for {activity}. Please check "
        "that you have enough resources to run at least 2 Horovod processes. Timeout after 30 "
        "seconds."
    )
    assert elastic.driver_gave_up(said, 2).startswith("fewer than minNodes (2) nodes left")
    assert elastic.driver_gave_up("horovodrun exited 1: rank 1 killed by SIGKILL", 2) is None
