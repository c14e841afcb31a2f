"""The shapes of the run's shared documents under runs/<run>/ (contract.runs names their keys;
docs/contracts.md, "A run as it goes", says what each field means). TypedDicts: the documents
stay the JSON objects they are on the wire, and a reader or writer says which one it holds.
`total=False`: a document written before a field existed lacks it, so every reader uses .get().
"""

from typing import Any, Literal, TypedDict

STATUS_FORMAT = "horovod-fleet/status/1"
ATTEMPTS_FORMAT = "horovod-fleet/attempts/1"
HOLD_FORMAT = "horovod-fleet/hold/1"

Outcome = Literal["succeeded", "failed", "interrupted"]
Decision = Literal["relaunch", "teardown", "stop"]
# How a node's instance came back for the next attempt (the run controller's relaunch decides
# it; the node's phases record and DONE.json's `attempts` entries say it as `came_back`):
# rebooted in place (its instance store, addresses and billing period kept; no capacity asked
# for), stopped and started (EC2 puts it on a healthy host, with empty instance stores), or
# replaced by a new instance from its launch template.
REBOOTED, STARTED, REPLACED = "rebooted", "started", "replaced"


class Checkpoint(TypedDict):
    key: str  # runs/<run>/model/checkpoints/ckpt-<step>
    step: int
    at: str


class Goodput(TypedDict):
    goodput: float | None
    runtime_goodput: float | None


class Status(TypedDict, total=False):
    """status.json: the head's view of the run as it goes; bootstrap/records/status.py is its one
    writer, the run controller and `horovod-fleet status` read it."""

    format: str  # STATUS_FORMAT
    run: str
    attempt: int
    phase: str  # booting | pulling_data | allreduce_check | training | evaluating | uploading |
    #             done | failed | interrupted
    updated_at: str
    attempt_started_at: str
    instance_type: str
    nodes: int
    gpus_per_node: int
    nodes_healthy: int
    nodes_training: int | None
    nodes_silent: list[str]  # node indexes as text
    progress: dict[str, Any] | None  # the trainer's progress.json
    checkpoint: Checkpoint | None
    reason: str | None
    cost: dict[str, Any] | None  # the price record: usd_per_hour, prices_as_of, max_hours
    goodput: Goodput | None
    resets: list[dict[str, Any]]


class AttemptSummary(TypedDict):
    """An attempt as DONE.json lists every earlier one, then its own."""

    attempt: int
    status: Outcome
    cause: str | None
    reason: str | None


class Done(TypedDict, total=False):
    """DONE.json: the attempt's record, written once per attempt by the head, a node that found
    the head lost, or the run controller (`written_by`); the controller decides on `cause`."""

    run: str
    status: Outcome
    cause: str | None  # a code of contract.causes; null when it succeeded
    reason: str | None
    written_by: str  # head | member <index> | controller
    benchmark: str | None  # synthetic | data, in benchmark mode
    top1: float | None
    top5: float | None
    epochs: int | None
    duration_s: float
    images_per_s: float | None
    end_to_end_images_per_s: float | None
    allreduce_busbw_gbps: float | None
    target_top1: float | None
    reached_target_at_epoch: int | None
    time_to_target_s: float | None
    attempt_started_at: str
    finished_at: str
    restarts: list[dict[str, Any]]
    timeline: dict[str, Any]
    resets: list[dict[str, Any]]
    goodput: float | None
    runtime_goodput: float | None
    goodput_s: dict[str, Any]
    attempt: int
    attempts: list[AttemptSummary]


class AttemptEntry(TypedDict, total=False):
    """One ended attempt in attempts.json: what ended it and what the controller decided."""

    attempt: int
    started_at: str | None
    ended_at: str
    status: Outcome | None
    cause: str | None
    reason: str | None
    epochs: int | None
    retryable: bool
    decision: Decision
    why: str
    decided_at: str
    stack_id: str  # the TrainStack the attempt ran in
    # From the attempt's DONE.json timeline, when it had them (a relaunch deletes it).
    launched_at: str
    first_step_at: str
    lost_s: dict[str, float]
    start_step: int
    end_step: int
    step_s: float
    steps_redone: int


class ControllerFailure(TypedDict, total=False):
    """The run controller's own failure: StopBilling's, once per failed execution, and once the
    tick gave the action up (`final`)."""

    execution: str
    stack_id: str
    error: str | None
    cause: str
    at: str
    stopped: list[str]
    terminated: list[str]
    final: bool


class Attempts(TypedDict, total=False):
    """attempts.json: written only by the run controller, read by the head (its attempt number,
    goodput's earlier attempts), the code guard and `horovod-fleet status`."""

    format: str  # ATTEMPTS_FORMAT
    run: str
    max_restarts: int
    attempts: list[AttemptEntry]
    controller_failures: list[ControllerFailure]


class Noticed(TypedDict):
    """EC2 ended the head (or, without one, nodes) and no node had written DONE.json yet."""

    stack_id: str
    attempt: int
    at: str
    nodes: list[str]


class Replacement(TypedDict, total=False):
    """One try to replace a lost node of the elastic fleet."""

    stack_id: str
    attempt: int
    node: int
    number: int
    instance_id: str | None  # None when EC2 refused it
    replaces: str | None
    why: str
    at: str
    refused: str  # "<code>: <message>"


class Unreplaced(TypedDict):
    stack_id: str
    attempt: int
    nodes: dict[str, str]  # node index as text: why it is not replaced again


class Controller(TypedDict, total=False):
    """controller.json: what the run controller does with the run, its one writer; `horovod-fleet
    status` shows it beside status.json."""

    updated_at: str
    stack_id: str
    execution: str
    controller_state: str  # Started, then the workflow state it last recorded
    phase: str  # the tick's phase when it started a long action
    attempt: int
    reason: str
    noticed: Noticed | None
    replacements: list[Replacement]
    unreplaced: Unreplaced


class Hold(TypedDict, total=False):
    """hold.json: an operator's hold (`horovod-fleet hold`, watch/hold.py writes it); the run
    controller only reads it, and honours it for `stack_id` alone."""

    format: str  # HOLD_FORMAT
    run: str
    stack_id: str
    held: bool
    held_at: str
    held_by: str
    reason: str | None
    released_at: str
    released_by: str
