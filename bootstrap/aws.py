"""The AWS edges of a node: clients, IMDSv2 identity, CloudFormation signals, and the one retry
policy every S3 call goes through (s5cmd's verified copies: bootstrap/transfer.py).

Every client honours AWS_ENDPOINT_URL (boto3 reads it; s5cmd gets it as --endpoint-url), which is
how the tests and the rehearsal point all of this at moto.

S3 outages: every call has a timeout (boto3: connect and read timeouts; s5cmd, which has no
timeout flag of its own, is killed when it stays silent), and a call that fails for a reason an
outage explains (connection refused or reset, timeout, 5xx, throttling) is retried with capped
exponential backoff and full jitter until its budget is spent, saying once a minute what it waits
for. Other errors (access denied, no such key) fail at once. An s5cmd transfer counts only when
what it should have moved is verified to be there: its exit code alone proves nothing (s5cmd
v2.3.0 exits 0 when the listing behind a sync fails).

Every S3 call also tells S3Reachability whether S3 answered it: what this node's heartbeat
judgements (a heartbeat could not be refreshed while S3 was down) and DONE.json's timeline
(the seconds S3 did not answer) read.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from io import BytesIO
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from bootstrap.lines import one_line
from contract import causes, runs

# How S3 answers a GET of a missing key: 404 to a caller that may list the bucket, 403 to one
# that may not. The node role may list only its prefixes (an s3:prefix condition), which does
# not count, so inside runs/<run>/, where it may read every key, 403 means "not there yet".
# https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html ("Permissions")
ABSENT_KEY_CODES = ("NoSuchKey", "404", "AccessDenied", "403")

IMDS = "http://169.254.169.254/latest"


# Where log() writes once stdout is gone: a shutdown stops the node script's `tee` into
# bootstrap.log together with us, and the report of that shutdown must still reach the file.
log_fallback: list[Path] = []


def log(message: str) -> None:
    """One timestamped line on stdout (the node's log), or appended to log_fallback's file when
    stdout's reader is gone; never an error of its own."""
    line = f"{runs.stamp_at(time.time())} [bootstrap] {message}"
    try:
        print(line, flush=True)
    except (OSError, ValueError):
        for path in log_fallback:
            with contextlib.suppress(OSError), path.open("a") as out:
                out.write(line + "\n")


# ---------------------------------------------------------------- the retry policy


@dataclass(frozen=True)
class RetryPolicy:
    """How long one S3 action may keep trying through an outage.

    budget_s None: until it works (the results upload; the hard cap bounds it). Delays follow
    "full jitter" (a uniform draw below min(max_delay_s, first_delay_s * 2^attempt)), from
    https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/.
    """

    budget_s: float | None
    first_delay_s: float = 1.0
    max_delay_s: float = 20.0
    note_every_s: float = 60.0


# An S3 outage of up to 5 minutes delays a step and costs nothing; the budget is that plus the
# longest backoff step, so the first attempt after a 5-minute outage still falls inside it.
OUTAGE_S = 300
STEP_POLICY = RetryPolicy(budget_s=OUTAGE_S + RetryPolicy(None).max_delay_s + 10)
UNTIL_DONE = RetryPolicy(budget_s=None)
# Per request: one quick retry inside boto3 and s5cmd for a one-off error; everything longer is
# the policy above. A request that cannot answer in 2 x 20 s, or an s5cmd silent for 60 s, ends
# in under a minute, so the waiting line comes about once a minute.
REQUEST_ATTEMPTS = 2
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 20

# A SIGTERM (instance stop, Spot notice) leaves about 90 s (systemd's default stop timeout): from
# then on, every retry loop ends by this deadline instead of its own budget.
_shutdown_deadline: list[float] = []


def shutdown_within(seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
    _shutdown_deadline[:] = [clock() + seconds]


def past_shutdown(clock: Callable[[], float] = time.monotonic) -> bool:
    """Whether a SIGTERM's deadline (shutdown_within) has passed."""
    return bool(_shutdown_deadline) and clock() > _shutdown_deadline[0]


class S3Unavailable(RuntimeError):
    """S3 stayed unreachable for a step's whole budget."""

    cause = causes.S3_UNREACHABLE


class TransferNotVerified(RuntimeError):
    """s5cmd said it succeeded, but what it should have moved is not all there."""


class S5cmdFailed(RuntimeError):
    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


THROTTLING = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
}


def is_outage(exc: BaseException) -> bool:
    """Whether an S3 error is what an outage looks like (worth retrying) rather than a refusal."""
    if isinstance(exc, (S5cmdFailed,)):
        return exc.transient
    if isinstance(exc, TransferNotVerified):
        return True
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or error.get("Code") in THROTTLING
    return isinstance(exc, (BotoConnectionError, HTTPClientError))


class S3Reachability:
    """When S3 did not answer this process. An outage runs from a call that S3 left unanswered
    (an error is_outage counts) to the next call it answered, whichever threads made them, so
    the heartbeat, status and checkpoint-sync threads waiting through the same outage count it
    once. Times are time.time(): heartbeats carry wall-clock stamps."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._outages: list[tuple[float, float]] = []
        self._answered_again_at: float | None = None

    def unanswered(self) -> None:
        with self._lock:
            if self._down_since is None:
                self._down_since = self.clock()

    def answered(self) -> None:
        with self._lock:
            if self._down_since is not None:
                now = self.clock()
                self._outages.append((self._down_since, now))
                self._down_since, self._answered_again_at = None, now

    def answered_again_at(self) -> float | None:
        """When S3 last answered this process after an outage (None: it never missed one)."""
        with self._lock:
            return self._answered_again_at

    def unreachable_s(self, since: float, now: float) -> float:
        """Seconds between since and now during which S3 did not answer this process."""
        with self._lock:
            spans = [*self._outages]
            if self._down_since is not None:
                spans.append((self._down_since, now))
        return sum(max(0.0, min(end, now) - max(start, since)) for start, end in spans)


S3_REACHABILITY = S3Reachability()


def s3_answered_again_at() -> float | None:
    return S3_REACHABILITY.answered_again_at()


def s3_unreachable_s(since: float, now: float) -> float:
    return S3_REACHABILITY.unreachable_s(since, now)


def with_retries(
    what: str,
    action: Callable[[], object],
    policy: RetryPolicy | None = None,
    note: Callable[[str], None] = log,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    draw: Callable[[], float] = random.random,
    of_s3: bool = True,
):
    """Run action until it succeeds, retrying outages per `policy`; raises S3Unavailable naming
    `what` and the last error once the budget (or a shutdown's deadline) is spent. Each answer
    and each outage error goes to S3_REACHABILITY unless the action is not S3's (of_s3 False)."""
    policy = policy or STEP_POLICY
    # Another service's outage is not S3's: told to a record nothing reads.
    reachability = S3_REACHABILITY if of_s3 else S3Reachability()
    started = clock()
    next_note = started + policy.note_every_s
    attempt = 0
    while True:
        try:
            result = action()
        except Exception as exc:
            if not is_outage(exc):
                if isinstance(exc, ClientError):  # a refusal is an answer
                    reachability.answered()
                raise
            reachability.unanswered()
            last = exc
        else:
            reachability.answered()
            return result
        attempt += 1
        now = clock()
        deadline = started + policy.budget_s if policy.budget_s is not None else float("inf")
        if _shutdown_deadline:
            deadline = min(deadline, _shutdown_deadline[0])
        if now >= deadline:
            raise S3Unavailable(
                f"S3 unreachable for {now - started:.0f} s while {what}; last error: "
                f"{one_line(last)}"
            ) from last
        if now >= next_note:
            limit = (
                "until it works"
                if deadline == float("inf")
                else (f"for {deadline - now:.0f} s more")
            )
            note(
                f"S3 unreachable for {now - started:.0f} s while {what}; retrying {limit}. "
                f"Last error: {one_line(last)}"
            )
            next_note = now + policy.note_every_s
        delay = draw() * min(policy.max_delay_s, policy.first_delay_s * 2 ** min(attempt, 30))
        sleep(max(0.0, min(delay, deadline - now)))


class RetryingS3:
    """An S3 client whose every call goes through with_retries. get_object's body is read inside
    the retry, so a connection cut mid-body is retried too."""

    def __init__(self, raw, policy: RetryPolicy | None = None, note: Callable[[str], None] = log):
        self.raw, self.policy, self.note = raw, policy, note

    def with_policy(self, policy: RetryPolicy) -> RetryingS3:
        return RetryingS3(self.raw, policy, self.note)

    def __getattr__(self, name: str):
        method = getattr(self.raw, name)
        if name in ("meta", "exceptions") or not callable(method):
            return method

        def call(**kwargs):
            target = (
                f"s3://{kwargs.get('Bucket', '')}/{kwargs.get('Key', kwargs.get('Prefix', ''))}"
            )

            def once():
                result = method(**kwargs)
                if name == "get_object":
                    result["Body"] = BytesIO(result["Body"].read())
                return result

            return with_retries(f"{name} {target}", once, self.policy, self.note)

        return call


def list_objects(s3, bucket: str, prefix: str) -> dict[str, dict]:
    """{key relative to prefix: its listing entry (Size, ETag, ...)} of every object under
    prefix, all pages (each page a call of its own, retried through a RetryingS3)."""
    found: dict[str, dict] = {}
    token = None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kwargs["ContinuationToken"] = token
        page = s3.list_objects_v2(**kwargs)
        found.update({o["Key"][len(prefix) :]: o for o in page.get("Contents", [])})
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return found


def list_sizes(s3, bucket: str, prefix: str) -> dict[str, int]:
    """{key relative to prefix: size} of every object under prefix."""
    return {name: entry["Size"] for name, entry in list_objects(s3, bucket, prefix).items()}


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
    """A boto3 client whose every request times out and is retried REQUEST_ATTEMPTS times in
    total (botocore's standard retry mode, which includes throttling errors; options from
    https://docs.aws.amazon.com/boto3/latest/guide/retries.html)."""
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"total_max_attempts": REQUEST_ATTEMPTS, "mode": "standard"},
    )
    return boto3.client(service, region_name=region, config=config)


def s3_client(region: str, policy: RetryPolicy | None = None) -> RetryingS3:
    return RetryingS3(client("s3", region), policy)


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
    signal_resource = client("cloudformation", cfg.region).signal_resource
    try:
        with_retries(
            f"signalling {status} to CloudFormation",
            lambda: signal_resource(
                StackName=cfg.signal.stack,
                LogicalResourceId=cfg.signal.resource,
                UniqueId=instance_id(cfg),
                Status=status,
            ),
            of_s3=False,
        )
    except ClientError as exc:
        # A second signal (a rerun after the stack finished creating) is refused; that is fine.
        return f"CloudFormation refused the {status} signal: {exc}"
    # The reason is not part of the API; it is in the log and, for the fleet, in DONE.json.
    return f"signalled {status} to {cfg.signal.stack}/{cfg.signal.resource}: {reason}"
