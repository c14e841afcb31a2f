"""`python3 -m bootstrap.fleet.rank PROGRAM...`: one Horovod rank's program, run as a child so that a
signal that kills it is named. horovodrun starts remote ranks over ssh, and OpenSSH's client
exits 255 for a remote command killed by a signal, so horovodrun could only report
`Exit code: 255`; this line says which signal (and the leader adds the host from the hostfile),
and for a rank that failed on its own, its exit code (horovodrun turns every rank's failure into
its own status 1): the trainer's codes are its contract (2: input refused, 75: interrupted).

The exit code passes through (128 + N for signal N, as a shell reports it); SIGTERM, SIGINT and
SIGHUP are passed on to the program, which may checkpoint before it ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

MARK = "horovod-fleet rank exit:"


def rank() -> str:
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return os.environ[name]
    return "?"


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python3 -m bootstrap.fleet.rank PROGRAM [ARG...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv)
    for passed_on in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(passed_on, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    if code < 0:
        print(f"{MARK} rank {rank()} killed by {signal.Signals(-code).name}", file=sys.stderr)
        return 128 - code
    if code:
        print(f"{MARK} rank {rank()} exited {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
