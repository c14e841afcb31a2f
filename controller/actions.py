"""The tick's actions: what decide.py and its rules list, and act.py takes in order (act.DO holds
one function per kind, `do`). Each a TypedDict, as the decision stays the plain list the tests
compare; only the standard library and contract/.
"""

from typing import Any, Literal, TypedDict

from contract.records import AttemptEntry, ControllerFailure
from controller.snapshot import Instance, Zone


class Terminate(TypedDict):
    do: Literal["terminate"]
    ids: list[str]
    why: str


class StopBilling(TypedDict):
    do: Literal["stop_billing"]
    fleet: list[Instance]


class Replace(TypedDict):
    """One new instance for a lost node of the elastic fleet (replace.py)."""

    do: Literal["replace"]
    node: int
    attempt: int
    number: int  # the node's replacement number in the attempt
    zone: Zone
    replaces: str | None  # the instance lost
    why: str


class Tag(TypedDict):
    """The node tag of a replacement an earlier tick launched and assigned."""

    do: Literal["tag"]
    id: str
    node: int
    attempt: int | None
    number: int


class Record(TypedDict):
    do: Literal["record"]
    entry: AttemptEntry


class DeleteDone(TypedDict):
    do: Literal["delete_done"]
    etag: str | None


class WriteDone(TypedDict):
    """The DONE.json of an attempt whose nodes could not write one."""

    do: Literal["write_done"]
    attempt: int
    status: str
    cause: str
    reason: str


class Start(TypedDict):
    """A long action's execution, under the name of what it does (executions.name)."""

    do: Literal["start"]
    name: str
    input: dict[str, Any]
    mail: str | None
    tell: dict[str, Any]  # what controller.json says once it started


class StopExecutions(TypedDict):
    do: Literal["stop_executions"]
    arns: list[str]
    why: str


class RecordFailure(TypedDict):
    do: Literal["record_failure"]
    failure: ControllerFailure


class Tell(TypedDict):
    """Fields merged into controller.json."""

    do: Literal["tell"]
    fields: dict[str, Any]


Action = (
    Terminate | StopBilling | Replace | Tag | Record | DeleteDone | WriteDone | Start
    | StopExecutions | RecordFailure | Tell
)  # fmt: skip


class Verdict(TypedDict):
    """The tick's verdict: the run's phase (None: no guard owns the tick), why, and what to do."""

    phase: str | None
    why: str
    actions: list[Action]
