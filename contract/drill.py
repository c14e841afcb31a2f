"""The drill's experiments (docs/faults-and-recovery.md, "The drill"): ONE list, played by two
executors and read by one judge.

- On AWS, `-c drill=true` makes TrainStack synthesize each experiment as an
  AWS::FIS::ExperimentTemplate, and the head starts each at its point in the run.
- Offline, `python -m rehearsal --drill` plays the same list on its simulated hosts and its moto
  cloud, each FIS action by the rehearsal's own model of it.

Experiments run in this order, one at a time: the first once the run has finished
`START_AFTER_EPOCH` epochs, each next one once the one before it is judged (passed, or past its
`within_s`). An action's `parameters` are exactly what FIS takes
(https://docs.aws.amazon.com/fis/latest/userguide/fis-actions-reference.html): durations in
ISO 8601, lists comma-separated without spaces (a parameter value matches `[\\S]+`, botocore's
FIS model). A value `{zone}` is the fleet's zone, known only at deploy; each executor fills it.

The standard library only: part of the contract package every room imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIS_ACTIONS_REFERENCE = (
    "https://docs.aws.amazon.com/fis/latest/userguide/fis-actions-reference.html"
)

# What an action is aimed at; each executor resolves it for its own world.
NODE = "node"  # one training node of this run (aws:ec2:instance by the run's tags, COUNT(1))
HEAD = "head"  # the run's head (aws:ec2:instance by the run's tags and the head's)
SPOT_NODE = "spot_node"  # one Spot training node (aws:ec2:spot-instance, COUNT(1))
CONTROLLER_ROLE = "controller_role"  # the run controller's IAM role, by ARN
FLEET_SUBNET = "fleet_subnet"  # the fleet's subnet, by ARN

# FIS's resource type and the key an action names it by, for each target (the actions reference
# above, and https://docs.aws.amazon.com/fis/latest/userguide/action-sequence.html#action-targets).
TARGETS = {
    NODE: ("aws:ec2:instance", "Instances"),
    HEAD: ("aws:ec2:instance", "Instances"),
    SPOT_NODE: ("aws:ec2:spot-instance", "SpotInstances"),
    CONTROLLER_ROLE: ("aws:iam:role", "Roles"),
    FLEET_SUBNET: ("aws:ec2:subnet", "Subnets"),
}

# The FIS actions the drill uses, with the parameters each takes and the target it needs
# (the actions reference above, read 2026-11-29; /work/notes is not shipped: the facts are
# repeated here where they decide something).
TERMINATE = "aws:ec2:terminate-instances"
STOP = "aws:ec2:stop-instances"
SPOT_INTERRUPTION = "aws:ec2:send-spot-instance-interruptions"
THROTTLE = "aws:fis:inject-api-throttle-error"
INSUFFICIENT_CAPACITY = "aws:ec2:api-insufficient-instance-capacity-error"
DISRUPT_CONNECTIVITY = "aws:network:disrupt-connectivity"
ACTIONS = {
    TERMINATE: ((), frozenset({NODE, HEAD})),
    # startInstancesAfterDuration and completeIfInstancesTerminated are optional; without the
    # first the instance stays stopped, as a host's retirement leaves it.
    STOP: ((), frozenset({NODE, HEAD})),
    # durationBeforeInterruption: 2 to 15 minutes.
    SPOT_INTERRUPTION: (("durationBeforeInterruption",), frozenset({SPOT_NODE})),
    # service: `ec2` or `kinesis` only; operations: EC2 API names.
    THROTTLE: (("service", "operations", "percentage", "duration"), frozenset({CONTROLLER_ROLE})),
    # Affects RunInstances, StartInstances, CreateFleet and CreateCapacityReservation, and never a
    # request that asks for capacity in several zones at once; its role is given by ARN only.
    INSUFFICIENT_CAPACITY: (
        ("availabilityZoneIdentifiers", "percentage", "duration"),
        frozenset({CONTROLLER_ROLE}),
    ),
    # scope: all, availability-zone, dynamodb, prefix-list, s3, s3express, vpc. It cuts every
    # instance in the subnet, the head's included.
    DISRUPT_CONNECTIVITY: (("scope", "duration"), frozenset({FLEET_SUBNET})),
}
SCOPES = ("all", "availability-zone", "dynamodb", "prefix-list", "s3", "s3express", "vpc")
DURATION = re.compile(r"^PT(\d+)([MS])$")
ZONE = "{zone}"
# FIS bills every action by the minute, an instant one (a termination) budgeted at one
# ($0.10 an action-minute outside GovCloud: https://aws.amazon.com/fis/pricing/).
USD_PER_ACTION_MINUTE = 0.10

# What the judge looks for in the run's records, by code (the judge says how each is read).
RESET = "reset"  # an elastic reset on the nodes left, the attempt going on
REPLACEMENT_JOINED = "replacement_joined"  # the controller's replacement joined the training
ONE_ATTEMPT = "one_attempt"  # no attempt ended while the experiment played
TICK_WENT_ON = "tick_went_on"  # the tick failed while throttled and succeeded after
ONE_REPLACEMENT = "one_replacement_per_loss"  # never two instances launched for one loss
TRAINING_AGAIN = "training_again"  # steps advanced after the fault ended
LEFT_AT_COMMIT = "left_at_commit"  # the noticed node left at a commit, no step redone
NEW_HEAD = "new_head"  # a head launched again from its template trains the run on
CAPACITY_HANDLED = "capacity_wait_or_zone_move"  # the relaunch waited for capacity or moved
OBSERVATIONS = (
    RESET, REPLACEMENT_JOINED, ONE_ATTEMPT, TICK_WENT_ON, ONE_REPLACEMENT, TRAINING_AGAIN,
    LEFT_AT_COMMIT, NEW_HEAD, CAPACITY_HANDLED,
)  # fmt: skip

# TrainStack's output that maps each experiment of a drill to its FIS experiment template's id,
# `{"<experiment>": "<id>", ...}` in the plan's order (docs/contracts.md).
TEMPLATES_OUTPUT_KEY = "HorovodFleetDrillExperiments"

# The drill's GPU type when none is given (-c instanceType empty, `horovod-fleet drill
# --instance-type`): the cheapest of the table, 3 x $0.526/h (stacks/drill_plan.py says why).
DEFAULT_INSTANCE_TYPE = "g4dn.xlarge"

# The first experiment starts once the run has finished this many epochs (a checkpoint to come
# back to, the start-up measured).
START_AFTER_EPOCH = 1


@dataclass(frozen=True)
class Dataset:
    """The drill's data: ILSVRC-shaped archives from `python -m trainer.preprocess.sample
    --classes C --train-per-class T --val-images V` (about 21 MB of JPEGs, a few MB of
    TFRecords), uploaded under `raw_prefix` of the dataset bucket and converted into
    `tfrecords_prefix` with these shard counts: by PreprocessStack (-c drill=true), or by
    `horovod-fleet drill` on the user's machine (-c drillPreprocess=false)."""

    raw_prefix: str = "drill/raw/"
    tfrecords_prefix: str = "drill/tfrecords/"
    classes: int = 10
    train_per_class: int = 20
    val_images: int = 50
    # 6 train shards split evenly over 3, 2 or 1 nodes (the drill's fleet, and what a loss
    # leaves of it); one validation shard per node.
    train_shards: int = 6
    val_shards: int = 3


DATASET = Dataset()


@dataclass(frozen=True)
class FisAction:
    """One FIS action of an experiment: its id, what it is aimed at, and its parameters."""

    name: str  # the action's key in the experiment template ([\S]{1,64})
    action_id: str
    target: str
    parameters: tuple[tuple[str, str], ...] = ()

    @property
    def minutes(self) -> int:
        """The action-minutes FIS bills for it: its duration, at least one."""
        longest = 1
        for key, value in self.parameters:
            if key in ("duration", "durationBeforeInterruption") and (m := DURATION.match(value)):
                seconds = int(m[1]) * (60 if m[2] == "M" else 1)
                longest = max(longest, -(-seconds // 60))
        return longest


@dataclass(frozen=True)
class Experiment:
    name: str  # the template's name and the records' key ([a-z0-9-]{1,40})
    what: str  # what is done, for people
    actions: tuple[FisAction, ...]
    expect: str  # what must follow, for people
    observe: tuple[str, ...]  # the OBSERVATIONS the judge must find
    within_s: int  # from the experiment's start to the last observation
    market: str | None = None  # "spot": played only on a Spot fleet

    @property
    def action_ids(self) -> tuple[str, ...]:
        return tuple(a.action_id for a in self.actions)

    @property
    def minutes(self) -> int:
        return sum(a.minutes for a in self.actions)


def _throttle(operations: str, duration: str) -> FisAction:
    parameters = (("service", "ec2"), ("operations", operations), ("percentage", "100"),
                  ("duration", duration))  # fmt: skip
    return FisAction("throttle", THROTTLE, CONTROLLER_ROLE, parameters)


# The controller's EC2 calls in a replacement: what it reads and what it launches and tags.
CONTROLLER_EC2_CALLS = "DescribeInstances,DescribeInstanceStatus,RunInstances,CreateTags"

EXPERIMENTS = (
    Experiment(
        "node-terminated",
        "one training node's instance terminated while the fleet trains",
        (FisAction("terminate", TERMINATE, NODE),),
        "an elastic reset on the nodes left; the run controller launches one replacement, which "
        "joins; the attempt goes on",
        (RESET, REPLACEMENT_JOINED, ONE_REPLACEMENT, ONE_ATTEMPT),
        within_s=900,
    ),
    Experiment(
        "controller-throttled",
        "the run controller's EC2 calls throttled for 3 minutes, and a node's instance stopped "
        "in them (and left stopped)",
        (_throttle(CONTROLLER_EC2_CALLS, "PT3M"), FisAction("stop", STOP, NODE)),
        "the tick fails while throttled and goes on after it, no decision lost: the node's "
        "one replacement is launched once the throttle ends, and joins",
        (TICK_WENT_ON, RESET, REPLACEMENT_JOINED, ONE_REPLACEMENT, ONE_ATTEMPT),
        within_s=1200,
    ),
    Experiment(
        "s3-cut",
        "the fleet's subnet cut off from S3 for 60 s",
        (
            FisAction(
                "cut", DISRUPT_CONNECTIVITY, FLEET_SUBNET, (("scope", "s3"), ("duration", "PT1M"))
            ),
        ),
        "ridden out: the nodes' and the head's S3 calls wait and retry, and training goes on in "
        "the same attempt",
        (TRAINING_AGAIN, ONE_ATTEMPT),
        within_s=600,
    ),
    Experiment(
        "spot-notice",
        "a Spot interruption notice on one node, two minutes before EC2 reclaims it",
        (
            FisAction(
                "interrupt", SPOT_INTERRUPTION, SPOT_NODE, (("durationBeforeInterruption", "PT2M"),)
            ),
        ),
        "the noticed node leaves at the next commit with no step redone; its replacement joins",
        (LEFT_AT_COMMIT, REPLACEMENT_JOINED, ONE_ATTEMPT),
        within_s=1200,
        market="spot",
    ),
    Experiment(
        "head-terminated",
        "the head's instance terminated while the run controller's launches in the fleet's zone "
        "meet InsufficientInstanceCapacity for 5 minutes",
        (
            FisAction(
                "no-capacity",
                INSUFFICIENT_CAPACITY,
                CONTROLLER_ROLE,
                (
                    ("availabilityZoneIdentifiers", ZONE),
                    ("percentage", "100"),
                    ("duration", "PT5M"),
                ),
            ),
            FisAction("terminate", TERMINATE, HEAD),
        ),
        "the run goes on under a new head launched from its template, after a capacity wait or "
        "a zone move as docs/faults-and-recovery.md's Capacity says; no deploy",
        (CAPACITY_HANDLED, NEW_HEAD, TRAINING_AGAIN),
        within_s=1800,
    ),
)


class UnknownExperiment(ValueError):
    pass


def plan(market: str, only: tuple[str, ...] = ()) -> tuple[Experiment, ...]:
    """The experiments a drill of this market plays, in order: every one, or those named in
    `only` (an unknown name raises UnknownExperiment, naming the allowed ones). A Spot-only
    experiment is left out of an on-demand drill."""
    names = [e.name for e in EXPERIMENTS]
    if unknown := [n for n in only if n not in names]:
        raise UnknownExperiment(
            f"unknown experiment {', '.join(map(repr, unknown))}: allowed {', '.join(names)}"
        )
    chosen = [e for e in EXPERIMENTS if not only or e.name in only]
    return tuple(e for e in chosen if e.market in (None, market))


def problems(experiments: tuple[Experiment, ...] = EXPERIMENTS) -> list[str]:
    """What is wrong with the list against FIS's rules as the actions reference gives them;
    [] when nothing is. Tests hold the list to it, and each executor refuses what it names."""
    found = []
    names = [e.name for e in experiments]
    found += [f"experiment {n} is listed twice" for n in {n for n in names if names.count(n) > 1}]
    for experiment in experiments:
        where = f"experiment {experiment.name}"
        if not re.fullmatch(r"[a-z0-9-]{1,40}", experiment.name):
            found.append(f"{where}: its name is not [a-z0-9-]{{1,40}}")
        keys = [a.name for a in experiment.actions]
        if len(set(keys)) != len(keys):
            found.append(f"{where}: two actions share a name")
        unknown = set(experiment.observe) - set(OBSERVATIONS)
        if unknown:
            found.append(f"{where}: unknown observations {sorted(unknown)}")
        for action in experiment.actions:
            found += [f"{where}, {action.name}: {p}" for p in action_problems(action)]
    return found


def action_problems(action: FisAction) -> list[str]:
    if action.action_id not in ACTIONS:
        return [f"{action.action_id} is not an action the drill knows"]
    takes, targets = ACTIONS[action.action_id]
    found = []
    if action.target not in targets:
        found.append(f"{action.action_id} cannot target {action.target}")
    given = dict(action.parameters)
    if sorted(given) != sorted(takes):
        found.append(f"{action.action_id} takes {list(takes)}, given {sorted(given)}")
    for key, value in given.items():
        if not re.fullmatch(r"\S{1,1024}", value):
            found.append(f"{key}={value!r} is not a FIS parameter value ([\\S]{{1,1024}})")
        if key in ("duration", "durationBeforeInterruption") and not DURATION.match(value):
            found.append(f"{key}={value} is not an ISO 8601 duration like PT3M")
    if action.action_id == SPOT_INTERRUPTION:
        m = DURATION.match(given.get("durationBeforeInterruption", ""))
        if m and not (m[2] == "M" and 2 <= int(m[1]) <= 15):
            found.append("durationBeforeInterruption is 2 to 15 minutes")
    if action.action_id == THROTTLE and given.get("service") not in ("ec2", "kinesis"):
        found.append("inject-api-throttle-error's service is ec2 or kinesis")
    if action.action_id == DISRUPT_CONNECTIVITY and given.get("scope") not in SCOPES:
        found.append(f"disrupt-connectivity's scope is one of {', '.join(SCOPES)}")
    return found


def fis_minutes(experiments: tuple[Experiment, ...]) -> int:
    return sum(e.minutes for e in experiments)


def fis_usd(experiments: tuple[Experiment, ...]) -> float:
    return round(fis_minutes(experiments) * USD_PER_ACTION_MINUTE, 2)
