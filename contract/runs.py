"""Where a run's records are: the keys under runs/<run>/ in the dataset bucket, and the one form
of a time in them (docs/contracts.md, "The dataset bucket" and "A run as it goes").
"""

import datetime

RUNS = "runs/"
DONE = "DONE.json"  # the attempt's record, written once per attempt (a node, or the controller)
STATUS = "status.json"  # the head's view of the run as it goes, its one writer
ATTEMPTS = "attempts.json"  # the run controller's record of the ended attempts
CONTROLLER = "controller.json"  # what the run controller does with the run, its one writer
CONFIG = "config.json"  # every context value of the run's last deploy that got its fleet up
HEAD = "head.json"  # the head's registration; its LastModified is the head's heartbeat
HOLD = "hold.json"  # an operator's hold (`horovod-fleet hold`): the controller only reads it
NODES = "nodes/"  # nodes/<index>.json: each node's registration and heartbeat
LAUNCHES = "launches/"  # launches/<instance-id>.json: which node a launched instance is
FAILURES = "failures/"  # failures/<index>.json: a node's own failure, told to the head
INTERRUPTIONS = "interruptions/"  # interruptions/<index>.json: a node's Spot notice
LOGS = "logs/"
CHECKPOINTS = "model/checkpoints/"

# Every time in a run's documents: UTC to the second, so that two of them compare as text.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def prefix(run: str) -> str:
    """runs/<run>/; `run` "*" gives the pattern of every run's (an IAM resource, an event rule)."""
    return f"{RUNS}{run}/"


def key(run: str, name: str) -> str:
    """The key of `name` (DONE, STATUS, ..., or a path under NODES, LAUNCHES) of `run`."""
    return f"{prefix(run)}{name}"


def stamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime(TIME_FORMAT)


def stamp_at(seconds: float) -> str:
    """A wall time (time.time()) as the records write it."""
    return stamp(datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc))


def parse_stamp(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=datetime.timezone.utc)


def parse_stamp_s(text: str) -> float:
    """A record's time as a wall time (time.time()): stamp_at's inverse."""
    return parse_stamp(text).timestamp()
