"""`python3 -m bootstrap.fleet.rank PROGRAM...`: one Horovod rank's program, run as a child so that a
signal that kills it is named. horovodrun starts remote ranks over ssh, and OpenSSH's client
exits 255 for a remote command killed by a signal, so horovodrun could only report
`Exit code: 255`; this line says which signal (and the head adds the host from the hostfile),
and for a rank that failed on its own, its exit code (horovodrun turns every rank's failure into
its own status 1): the trainer's codes are its contract (2: input refused, 75: interrupted).

The exit code passes through (128 + N for signal N, as a shell reports it); SIGTERM, SIGINT and
SIGHUP are passed on to the program, which may checkpoint before it ends.

The program runs in horovodrun's environment, which is the launcher's: the head's, a CPU
instance. What only the rank's own node knows (the JIT caches baked for its GPUs and driver:
bootstrap/image/jit_env.py) is in that node's `KEY=VALUE` file named by HOROVOD_FLEET_NODE_ENV
(docs/contracts.md), which goes over the launcher's values; a node without the file adds none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

MARK = "horovod-fleet rank exit:"
NODE_ENV = "HOROVOD_FLEET_NODE_ENV"  # a path, the same on every node; the file is the node's own


def node_env(environ: dict[str, str]) -> dict[str, str]:
    """environ with the node's own KEY=VALUE lines over it (blank lines and # comments left out)."""
    path = environ.get(NODE_ENV)
    try:
        text = Path(path).read_text() if path else ""
    except FileNotFoundError:
        text = ""
    settings = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    return {**environ, **settings}


def rank() -> str:
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return os.environ[name]
    return "?"


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python3 -m bootstrap.fleet.rank PROGRAM [ARG...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, env=node_env(dict(os.environ)))
    # Passed on to the child while it runs; a caller in the same process gets its own back.
    previous = {
        passed_on: signal.signal(passed_on, lambda signum, frame: child.send_signal(signum))
        for passed_on in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if code < 0:
        print(f"{MARK} rank {rank()} killed by {signal.Signals(-code).name}", file=sys.stderr)
        return 128 - code
    if code:
        print(f"{MARK} rank {rank()} exited {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
