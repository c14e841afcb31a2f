"""`python3 -m bootstrap.head.hosts_file STATE_DIR`: the elastic horovodrun's discovery script.

It prints `<state_dir>/hosts` (`ip:slots` per line, kept current by bootstrap/head/discovery.py),
admitting at most one host it has not printed before per run. Horovod runs it every second
under its driver's lock and ends the job on its first failure (horovod/runner/elastic/driver.py
v0.28.1 `_discover_hosts`): it imports the standard library only, reads two small files and
never exits non-zero.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

HOSTS_FILE = "hosts"  # under the head's state dir: what the script prints
ADMITTED_FILE = "hosts.admitted"  # what the script printed last: Horovod's view


def admit(desired: list[str], admitted: list[str]) -> list[str]:
    """What the script prints: the admitted hosts still desired, in their order, then at most
    one more, the first desired host not yet admitted (so Horovod meets new hosts one by one,
    in node order; the module docstring says why)."""
    hosts = {line.split(":")[0]: line for line in desired}
    kept = [hosts[host] for host in (line.split(":")[0] for line in admitted) if host in hosts]
    known = {line.split(":")[0] for line in kept}
    new = [line for line in desired if line.split(":")[0] not in known]
    return kept + new[:1]


def write_atomically(path: Path, text: str) -> None:
    """Readers see the old content or the new, never part of it (rename is atomic)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def read_lines(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def print_hosts(state_dir: Path) -> int:
    """The discovery script: prints the admitted hosts and remembers them. It never fails, since
    Horovod ends the job on a first failure: a problem is one line on stderr and the hosts it
    printed last."""
    admitted_path = state_dir / ADMITTED_FILE
    try:
        admitted = admit(read_lines(state_dir / HOSTS_FILE), read_lines(admitted_path))
        write_atomically(admitted_path, "".join(f"{line}\n" for line in admitted))
    except Exception as exc:  # the job must not end on the head's own file trouble
        print(f"horovod-fleet discovery: {type(exc).__name__}: {exc}", file=sys.stderr)
        try:
            admitted = read_lines(admitted_path)
        except OSError:
            admitted = []
    for line in admitted:
        print(line)
    return 0


def script_command(state_dir: Path) -> str:
    """horovodrun's --host-discovery-script: run by a shell (safe_shell_exec), so a command line;
    the head's own Python, its bootstrap on the path."""
    app = Path(__file__).resolve().parents[2]
    return (
        f"cd {shlex.quote(str(app))} && {shlex.quote(sys.executable)} -m bootstrap.head.hosts_file "
        f"{shlex.quote(str(state_dir))}"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python3 -m bootstrap.head.hosts_file STATE_DIR", file=sys.stderr)
        sys.exit(0)  # never a failure: Horovod ends the job on one
    sys.exit(print_hosts(Path(sys.argv[1])))
