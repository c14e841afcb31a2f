"""Why a training failed, from what its ranks printed: pure functions of the horovodrun output's
tail and the hostfile (and, for a full disk, the node's mount table). The first known cause a
rank names (a full disk, a corrupt checkpoint) wins over which rank died of it, and a collective
timeout names the rank that stopped answering, not the ones that waited for it; then the
trainer's `error:` line; then which rank died where and how."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from bootstrap.fleet.rank import MARK as RANK_MARK
from bootstrap.lines import trim_reason
from contract import causes

TRAINER_ERROR = re.compile(r"(?<![A-Za-z])error: ")


# horovodrun's own summary of the first rank to fail (Gloo: "Process name: <rank>"; OpenMPI:
# "Process name: [[job,1],<rank>]"), per horovod 0.28.1 horovod/runner/gloo_run.py.
FIRST_FAILED_RANK = re.compile(
    r"Process name:\s*(?:\[\[\d+,\d+\],)?(\d+)\]?\s*Exit code:\s*(-?\d+)"
)


RANK_EXIT = re.compile(r"Process (\d+) exit with status code (-?\d+)")


MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")


# bootstrap.fleet.rank's line for a rank a signal killed (over ssh, horovodrun itself only sees 255).
RANK_SIGNAL = re.compile(re.escape(RANK_MARK) + r" rank (\d+) killed by (SIG[A-Z0-9]+)")
# ... and for a rank that exited with a code of its own.
RANK_CODE = re.compile(re.escape(RANK_MARK) + r" rank (\d+) exited (\d+)")
# The trainer's exit statuses (docs/contracts.md, "Trainer command line and outputs").
TRAINER_USAGE = 2
TRAINER_INTERRUPTED = 75


SIGNAL_HINTS = {"SIGKILL": " (out of memory?)", "SIGSEGV": " (a crash in native code)"}


def rank_nodes(hostfile: str) -> list[tuple[int, str]]:
    """The node index and host of each rank: the hostfile lists the nodes in index order
    (rendezvous.write_hostfile), and horovodrun gives ranks host by host in that order."""
    nodes = []
    lines = [line for line in hostfile.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        host, _, slots = line.partition(" slots=")
        nodes += [(index, host.strip())] * int(slots or 1)
    return nodes


def describe_exit(code: int) -> str:
    """'killed by SIGKILL' for a signal (a shell's 128+N, or Python's -N), else 'exited N'."""
    number = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        name = signal.Signals(number).name if number else None
    except ValueError:
        name = None
    return f"killed by {name}{SIGNAL_HINTS.get(name, '')}" if name else f"exited {code}"


# Causes that a rank's own failure line names better than which rank died of it; the first
# line that matches is the cause (what follows are its consequences on the other ranks).
ENOSPC = re.compile(r"No space left on device|ENOSPC|\[Errno 28\]")


ENOSPC_PATHS = (
    re.compile(r"\[Errno 28\] No space left on device: '([^']+)'"),  # Python's OSError
    re.compile(r"(/[^\s;'\"]+?)[;:]?\s+No space left on device"),  # TensorFlow's file errors
)


# TensorFlow's tensor_bundle reader on a damaged checkpoint file.
CORRUPT = re.compile(r"[Cc]hecksum does not match|DataLossError")


# Gloo's transport timeouts as the Gloo that Horovod 0.28.1 vendors spells them (third_party/gloo
# at d96897b: gloo/transport/tcp/unbound_buffer.cc, pair.cc, pair.h, buffer.cc). Horovod waits on
# unbound buffers, whose "Timed out waiting <ms>ms for recv|send operation to complete" names no
# peer: who stopped answering is read from which ranks timed out.
# https://github.com/facebookincubator/gloo/blob/d96897b339a07087f588223ca216e75f64e3ca58/gloo/transport/tcp/unbound_buffer.cc
GLOO_TIMEOUT = re.compile(
    r"Timed out waiting|(?:Read|Write|Connect) timeout|Application timeout caused pair closure"
)
# NCCL's (e.g. "NCCL WARN Net : Connect to <peer> failed : Connection timed out"): one rank's
# error, which says nothing of the ranks that did not print one.
NCCL_TIMEOUT = re.compile(r"NCCL.*(?:timeout|timed out)")


# Horovod's stall inspector on rank 0: "Missing ranks:", then one "<rank>: [<tensors>]" line per
# rank that has not submitted a tensor the others wait on ("<rank>!: " once past
# HOROVOD_STALL_SHUTDOWN_TIME_SECONDS), per horovod/common/stall_inspector.cc at v0.28.1
# (https://github.com/horovod/horovod/blob/v0.28.1/horovod/common/stall_inspector.cc).
MISSING_RANKS = "Missing ranks:"
MISSING_RANK = re.compile(r"(\d+)!?: \[")


RANK_PREFIX = re.compile(r"^(?:\S*)?\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")


def size_text(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def describe_filesystem(path: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """'filesystem SOURCE (TYPE) mounted on DIR: FREE free of TOTAL' for the filesystem that
    holds path on this node (None: no part of path is here)."""
    target = Path(path)
    while not target.exists() and target != target.parent:
        target = target.parent
    if not target.exists():
        return None
    resolved = str(target.resolve())
    best = None
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        mount_point = fields.split()[4].replace("\\040", " ")
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= len(best[0])):
            fstype, source = [*rest.split(), "?", "?"][:2]
            best = (mount_point, fstype, source)
    if best is None:
        return None
    stat = os.statvfs(resolved)
    free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    return (
        f"filesystem {best[2]} ({best[1]}) mounted on {best[0]}: {size_text(free)} free of "
        f"{size_text(total)}"
    )


def rank_of(line: str) -> int | None:
    found = RANK_PREFIX.match(line)
    return int(found.group(1)) if found else None


class Failure(NamedTuple):
    cause: str  # contract/causes.py
    reason: str  # one line, for people


def known_cause(
    lines: list[str], nodes: list[tuple[int, str]], filesystem: Callable[[str], str | None]
) -> Failure | None:
    """A known cause (full disk, corrupt checkpoint, collective timeout) and the rank that hit it
    first (for a collective timeout, the rank that stopped answering), or None. `nodes`: each
    rank's node index and host (rank_nodes)."""
    hosts = [host for _, host in nodes]

    def where(line: str) -> str:
        rank = rank_of(line)
        if rank is None:
            return ""
        return f" on rank {rank}" + (f" ({hosts[rank]})" if rank < len(hosts) else "")

    def words(line: str) -> str:
        return RANK_PREFIX.sub("", line).strip()

    for line in lines:
        if ENOSPC.search(line):
            path = next((m.group(1) for p in ENOSPC_PATHS if (m := p.search(line))), None)
            if path is None:
                reason = f"no space left on device (ENOSPC){where(line)}: {words(line)}"
                return Failure(causes.DISK_FULL, trim_reason(reason))
            # Only a process on this host wrote where this host can look: a fleet's ranks
            # (a hostfile) all run on GPU nodes, never on the head, whose disk says nothing
            # of theirs; a lone process (the preprocessing node) runs here.
            disk = filesystem(path) if not hosts else None
            reason = f"no space left on device (ENOSPC) writing {path}{where(line)}"
            return Failure(causes.DISK_FULL, trim_reason(reason + (f"; {disk}" if disk else "")))
    for line in lines:
        if CORRUPT.search(line):
            reason = f"corrupt checkpoint (checksum does not match){where(line)}: {words(line)}"
            return Failure(causes.CORRUPT_CHECKPOINT, trim_reason(reason))
    return collective_timeout(lines, nodes)


def name_ranks(ranks: list[int], nodes: list[tuple[int, str]]) -> str:
    """'rank 1 on node 1 (10.0.0.6)'; several, grouped by node in rank order: 'ranks 0, 1 on
    node 0 (10.0.0.5) and rank 2 on node 1 (10.0.0.6)'."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(ranks):
        where = f" on node {nodes[rank][0]} ({nodes[rank][1]})" if rank < len(nodes) else ""
        groups.setdefault(where, []).append(rank)
    return " and ".join(
        f"rank{'s' if len(group) > 1 else ''} {', '.join(map(str, group))}{where}"
        for where, group in groups.items()
    )


def missing_ranks(lines: list[str]) -> list[int]:
    """The ranks Horovod's stall inspector last listed as missing (none: it listed none). It
    lists a rank whose background thread still negotiates but whose program has not submitted
    the tensor: a rank stuck in Python, not a stopped process or host."""
    missing: list[int] = []
    lister = None  # the rank whose "Missing ranks:" list is being read
    for line in lines:
        rank, said = rank_of(line), RANK_PREFIX.sub("", line).strip()
        if said == MISSING_RANKS:
            missing, lister = [], rank
        elif lister is not None and rank == lister:
            if found := MISSING_RANK.match(said):
                missing.append(int(found.group(1)))
            else:
                lister = None
    return missing


def collective_timeout(lines: list[str], nodes: list[tuple[int, str]]) -> Failure | None:
    """A Gloo collective timeout, named by who stopped answering whom. A rank waiting on a
    stopped peer times out; the stopped one prints no timeout (a paused process prints nothing,
    one cut off from the head cannot reach its output, one that resumes finds its peers gone).
    So the stalled ranks are those the stall inspector lists as missing, else those of the
    hostfile that reported no timeout; when every rank timed out, each waited on another: a
    partition, and the reason names every end. Without the hostfile, or for NCCL's timeouts,
    the rank that reported one first (first_timeout)."""
    timed_out: dict[int | None, str] = {}
    for line in lines:
        if found := GLOO_TIMEOUT.search(line):
            timed_out.setdefault(rank_of(line), line[found.start() :])
    waiters = sorted(rank for rank in timed_out if rank is not None)
    if not nodes or not waiters:
        return first_timeout(lines, nodes)
    said = next(iter(timed_out.values()))
    stalled = missing_ranks(lines) or [r for r in range(len(nodes)) if r not in timed_out]
    if stalled:
        reason = (
            f"collective timeout: {name_ranks(stalled, nodes)} stopped answering "
            f"{name_ranks(waiters, nodes)}, which timed out: {said}"
        )
    else:
        reason = (
            f"collective timeout: every rank timed out waiting for another "
            f"({name_ranks(waiters, nodes)}), so none stalled alone: their nodes stopped "
            f"reaching each other (a network partition?): {said}"
        )
    return Failure(causes.COLLECTIVE_TIMEOUT, trim_reason(reason))


def first_timeout(lines: list[str], nodes: list[tuple[int, str]]) -> Failure | None:
    """The first line that reports a collective timeout, by the rank that printed it."""
    for line in lines:
        if found := GLOO_TIMEOUT.search(line) or NCCL_TIMEOUT.search(line):
            rank = rank_of(line)
            where = "" if rank is None else f" on {name_ranks([rank], nodes)}"
            reason = f"collective timeout{where}: {line[found.start() :]}"
            return Failure(causes.COLLECTIVE_TIMEOUT, trim_reason(reason))
    return None


def stall_inspector_names(tail: str, hostfile: str) -> str | None:
    """What Horovod's stall inspector says of a stalled training: 'Horovod's stall inspector
    lists rank 1 on node 1 (10.0.0.6) as missing', or None when it listed no rank."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    missing = missing_ranks(lines)
    if not missing:
        return None
    return f"Horovod's stall inspector lists {name_ranks(missing, rank_nodes(hostfile))} as missing"


def exit_cause(code: int) -> str:
    """The cause a rank's exit code says: the trainer's contract (2: its input refused, 75: a
    SIGTERM turned into a checkpoint), a signal, or ssh's lost connection."""
    if code == TRAINER_USAGE:
        return causes.TRAINER_INPUT
    if code == TRAINER_INTERRUPTED:
        return causes.INTERRUPTED
    if code == SSH_LOST:
        return causes.NODE_LOST
    if code > 128 or code < 0:
        return causes.RANK_KILLED
    return causes.UNKNOWN


# horovodrun's ssh check of every remote host before it starts a rank: "ssh not successful for
# host <host>:" and ssh's own words for each host it could not reach, then "could not connect to
# some hosts via ssh" (horovod 0.28.1 horovod/runner/launch.py, _check_all_hosts_ssh_successful,
# https://github.com/horovod/horovod/blob/v0.28.1/horovod/runner/launch.py).
SSH_CHECK_FAILED = "could not connect to some hosts via ssh"
SSH_HOST_FAILED = re.compile(r"ssh not successful for host (\S+?):?$")


def unreachable_at_start(lines: list[str], nodes: list[tuple[int, str]]) -> Failure | None:
    """A node horovodrun could not reach over ssh as it started: its host died or went off the
    network between the rendezvous and the launch. Named as a lost node, with ssh's words."""
    if not any(SSH_CHECK_FAILED in line for line in lines):
        return None
    index_of = {host: index for index, host in nodes}
    named = []
    for at, line in enumerate(lines):
        if not (found := SSH_HOST_FAILED.search(line)):
            continue
        host = found.group(1)
        said = lines[at + 1] if at + 1 < len(lines) else ""
        words = "" if not said or SSH_HOST_FAILED.search(said) else f" ({said})"
        who = f"node {index_of[host]} ({host})" if host in index_of else f"host {host}"
        named.append(f"{who} lost: horovodrun could not reach it over ssh as it started{words}")
    if not named:
        named = [f"a node lost: horovodrun {SSH_CHECK_FAILED} as it started"]
    return Failure(causes.NODE_LOST, trim_reason("; ".join(named)))


def classify(
    tail: str, hostfile: str = "", filesystem: Callable[[str], str | None] = describe_filesystem
) -> Failure:
    """Why a run failed, from its output's tail: a known cause (full disk, corrupt checkpoint,
    collective timeout) where the rank that hit it first says so, else what the first rank to
    fail exited with (bootstrap.fleet.rank's line: its exit code; the trainer's `error: ...` line is
    the reason of an input it refused), else which rank died where and how, else the last line.
    Tracebacks stay in the log file."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    nodes = rank_nodes(hostfile)
    if known := known_cause(lines, nodes, filesystem):
        return known
    if unreachable := unreachable_at_start(lines, nodes):
        return unreachable
    exits = {int(rank): int(code) for rank, code in RANK_CODE.findall(tail)}
    killed = {int(rank): name for rank, name in RANK_SIGNAL.findall(tail)}
    # The trainer's lowercase `error:` (after horovodrun's `[1]<stderr>:` prefix), not the
    # `RuntimeError: Horovod detected that one or more processes exited` horovodrun adds last.
    # It is the cause where a rank exited 2 (or no rank's end is known: output not from ranks).
    errors = [line for line in lines if TRAINER_ERROR.search(line)]
    if errors and (TRAINER_USAGE in exits.values() or not (exits or killed)):
        return Failure(causes.TRAINER_INPUT, trim_reason(errors[-1]))
    if found := MPI_SIGNAL.search(tail):
        rank, node = int(found.group(1)), found.group(2)
        code = 128 + int(found.group(3))
        return Failure(exit_cause(code), describe_rank(rank, f" on {node}", code, lines))
    first = FIRST_FAILED_RANK.search(tail) or RANK_EXIT.search(tail)
    if first or killed:
        rank = int(first.group(1)) if first else next(iter(killed))
        code = int(first.group(2)) if first else 1
        if rank in killed:
            code = 128 + signal.Signals[killed[rank]].value
        elif rank in exits:
            code = exits[rank]
        where = f" on node {nodes[rank][0]} ({nodes[rank][1]})" if rank < len(nodes) else ""
        return Failure(exit_cause(code), describe_rank(rank, where, code, lines))
    return Failure(causes.UNKNOWN, trim_reason((lines or ["no output"])[-1]))


def failure_reason(
    tail: str, hostfile: str = "", filesystem: Callable[[str], str | None] = describe_filesystem
) -> str:
    """classify's reason alone."""
    return classify(tail, hostfile, filesystem).reason


# ssh exits 255 when the connection fails or drops (ssh(1), EXIT STATUS): a remote rank whose
# host died or went off the network, as no rank's own exit says 255.
SSH_LOST = 255


def describe_rank(rank: int, where: str, code: int, lines: list[str]) -> str:
    """A rank that exited on its own gets its last stderr line; a killed one has none worth it."""
    how = describe_exit(code)
    if code == SSH_LOST:
        how += " (ssh's code for a lost connection: its host is gone or unreachable)"
    said = [
        line.split(":", 1)[1].strip() for line in lines if line.startswith(f"[{rank}]<stderr>:")
    ]
    said = [words for words in said if words]
    last = f"; its last words: {said[-1]}" if said else ""
    return trim_reason(f"rank {rank}{where} {how}{'' if how.startswith('killed') else last}")
