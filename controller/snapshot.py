"""What the tick reads of the run (observe.py), as decide.py, its rules and act.py take it.
TypedDicts: a snapshot stays the plain mapping that tests and the rehearsal write by hand, and
each reader says which part it holds. Only the standard library and contract/.
"""

import datetime
from typing import Any, TypedDict

from contract.records import AttemptEntry, Controller, ControllerFailure, Done, Hold, Status


class Zone(TypedDict):
    """Where a launch goes: a zone, its subnet and cluster placement group (None for a fleet
    whose zone is fixed: launched as its templates say)."""

    zone: str | None
    subnet: str | None
    group: str | None


class Stack(TypedDict, total=False):
    """TrainStack as the controller reads it (train_stack.of): "" or 0 for what neither its tags
    nor its outputs hold yet."""

    id: str
    name: str
    status: str
    status_reason: str
    created_at: datetime.datetime
    run: str
    nodes: int
    min_nodes: int
    max_restarts: int
    deadline: datetime.datetime | None  # the hard cap; from its schedule while it is created
    heartbeat_timeout_s: int
    startup_grace_s: int
    notify_topic: str
    template: str  # the replacement launch template; "" for a stack from before it
    zones: list[Zone]
    deployed_at: datetime.datetime  # read only while the idle alarm is in ALARM


class Instance(TypedDict):
    """A fleet instance (ec2_fleet.node_of), whatever stack its tag names."""

    id: str
    state: str
    node: str | None  # the node tag: an index as text, "head", or None (not tagged yet)
    launched: datetime.datetime | None
    spot: bool
    zone: str | None
    stack: str | None  # FLEET_TAG: the id of the TrainStack it belongs to
    cloudformation: bool  # CloudFormation made it (not a launch of the controller's)
    client_token: str


class Execution(TypedDict):
    """One of the run's executions of the workflow (executions.of_run)."""

    name: str
    kind: str  # a<attempt>, cap, idle or destroy
    resume: int
    status: str
    arn: str
    started: datetime.datetime | None
    stopped: datetime.datetime | None


class Alarm(TypedDict):
    state: str
    since: datetime.datetime


class Settings(TypedDict):
    """What TeardownStack puts in the functions' environment for the tick."""

    idle_minutes: int
    replacements_per_node: int


class Records(TypedDict, total=False):
    """The run's records in S3 (observe.run_records), read once no guard owns the tick."""

    attempts: list[AttemptEntry]
    controller_failures: list[ControllerFailure]
    done: Done | None
    done_etag: str | None
    controller: Controller
    status: Status | None
    heartbeats: dict[str, datetime.datetime]  # node index as text: its registration's time
    assigned: set[str]  # the instances given a launch assignment
    head_beat: datetime.datetime | None  # an elastic fleet's: head.json's LastModified
    assignments: list[dict[str, Any]]  # an elastic fleet's: every launch assignment


class Snapshot(TypedDict):
    """The whole run as one tick read it."""

    stack: Stack | None
    instances: list[Instance]
    records: Records | None
    executions: list[Execution]
    alarm: Alarm | None
    checkpoint_at: datetime.datetime | None
    hold: Hold | None
    settings: Settings
