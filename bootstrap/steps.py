"""The steps of a node's bootstrap, whatever the node: each one named, timed and logged; any error
of a step a StepFailed with its cause (a code of contract/causes.py: the error's, else the
step's); a SIGTERM the end of the current step as Interrupted; and a failure told to
CloudFormation."""

from __future__ import annotations

import errno
import signal
import time
from collections.abc import Callable

from bootstrap import aws
from bootstrap.lines import REASON_LIMIT, one_line
from contract import causes

# A SIGTERM (systemd stop, Spot interruption, instance shutdown) gives the node systemd's stop
# timeout, 90 s by default (DefaultTimeoutStopSec, systemd-system.conf(5)): horovodrun gets
# launch.STOP_GRACE_S of it to end, the uploads and DONE.json get the rest but a margin.
FLUSH_AFTER_SIGTERM_S = 75


class Interrupted(Exception):
    """The node was told to stop (SIGTERM), or a Spot notice stopped the ranks."""

    cause = causes.INTERRUPTED


class StepFailed(RuntimeError):
    """A step of the node's bootstrap ended the attempt: why, for people, and its cause
    (contract/causes.py), for the run controller."""

    def __init__(self, step: str, reason: str, cause: str, status: str = "failed"):
        verb = "was interrupted" if status == "interrupted" else "failed"
        super().__init__(f"step '{step}' {verb}: {reason}")
        self.step, self.reason, self.cause, self.status = step, reason, cause, status


# The node's steps whose failure is a cause whatever the error (train_node.sh's shell steps
# report through `python3 -m bootstrap fail STEP`).
STEP_CAUSES = {
    "read node.json": causes.CONFIG_INVALID,
    "training image": causes.IMAGE_MISMATCH,
    "boot service": causes.NODE_UNHEALTHY,
    "instance store": causes.NODE_UNHEALTHY,
    "gpu fabric": causes.NODE_UNHEALTHY,
    "cloudwatch agent": causes.NODE_UNHEALTHY,
    "health": causes.NODE_UNHEALTHY,
    "instance identity": causes.NODE_UNHEALTHY,
    "launch assignment": causes.NODE_UNHEALTHY,
    "allreduce check": causes.NODE_UNHEALTHY,
}


def cause_of(step: str, error: BaseException) -> str:
    """The cause of `error`, raised in `step`: the one the error names (a `cause` attribute: its
    class's, or its own), else ENOSPC's, else the step's, else `unknown`."""
    cause = getattr(error, "cause", None)
    if cause in causes.CAUSES:
        return cause
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return causes.DISK_FULL
    return STEP_CAUSES.get(step, causes.UNKNOWN)


# Each finished step's seconds in this process, for DONE.json's timeline.
STEP_SECONDS: dict[str, float] = {}


def step(name: str, action: Callable[[], object]):
    """Run one named step with timestamped start/end lines; any error becomes StepFailed."""
    aws.log(f"step '{name}': start")
    started = time.time()
    try:
        result = action()
    except StepFailed:  # another step's failure, seen here (the data pull's, beside the others)
        raise
    except Interrupted as exc:
        raise StepFailed(name, str(exc), causes.INTERRUPTED, "interrupted") from exc
    except Exception as exc:
        raise StepFailed(name, one_line(exc, REASON_LIMIT), cause_of(name, exc)) from exc
    took = time.time() - started
    STEP_SECONDS[name] = round(STEP_SECONDS.get(name, 0.0) + took, 1)
    aws.log(f"step '{name}': done in {took:.1f} s")
    return result


def attempt_to(what: str, action: Callable[[], object]) -> bool:
    """One best-effort action while reporting a failure: an error of its own (AWS unreachable, no
    credentials) is one log line, never a traceback that would hide the failure being reported."""
    try:
        action()
    except Exception as exc:
        aws.log(f"could not {what}: {one_line(exc, REASON_LIMIT)}")
        return False
    return True


def announce_failure(cfg, failure: StepFailed) -> None:
    """What every node does first with a failure: log it, and tell CloudFormation (which rolls
    the stack back while it is being created)."""
    aws.log(f"{failure.status.upper()}: {failure}")
    attempt_to(
        "signal FAILURE to CloudFormation",
        lambda: aws.log(aws.signal_cloudformation(cfg, False, str(failure))),
    )


def interrupt_on_sigterm() -> None:
    """SIGTERM ends the current step as Interrupted; from then on every S3 retry ends within
    the shutdown's time, and a second SIGTERM is ignored so the flush can finish."""

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        aws.shutdown_within(FLUSH_AFTER_SIGTERM_S)
        raise Interrupted("the node was stopped (SIGTERM)")

    signal.signal(signal.SIGTERM, handler)
