"""The `horovod-fleet status` screen and the `runs` table, from the run's documents alone.

Pure functions of what S3 and CloudFormation said, so each phase is tested from recorded states.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from contract.names import DEADLINE_OUTPUT_KEY
from contract.runs import parse_stamp, stamp

DONE_PHASE = {"succeeded": "done", "failed": "failed", "interrupted": "interrupted"}
ENDED = ("done", "failed", "interrupted")
SHOWN_ATTEMPTS = 3  # the newest ended attempts the status screen lists
LABELS = {
    "image_bake": "image bake", "booting": "booting", "pulling_data": "pulling data",
    "allreduce_check": "allreduce check", "training": "training", "evaluating": "evaluating",
    "uploading": "uploading", "done": "done", "failed": "failed", "interrupted": "interrupted",
    "relaunching": "relaunching",
}  # fmt: skip


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return parse_stamp(text)


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS."""
    minutes, secs = divmod(max(round(seconds), 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


@dataclass
class RunFacts:
    """What the command found about one run."""

    run: str
    bucket: str
    now: datetime
    status: dict | None = None  # runs/<run>/status.json, with controller.json (with_controller)
    done: dict | None = None  # runs/<run>/DONE.json
    attempts: list[dict] | None = None  # runs/<run>/attempts.json's ended attempts
    nodes_up: int | None = None  # registrations in runs/<run>/nodes/
    stack_phase: str | None = None  # from CloudFormation, before the head writes anything
    stack_created: datetime | None = None  # TrainStack's creation: the bill's start
    hard_cap_at: datetime | None = None  # TrainStack's DEADLINE_OUTPUT_KEY output
    hold: dict | None = None  # runs/<run>/hold.json: an operator's hold (watch/hold.py)
    stack_id: str | None = None  # TrainStack's id, when it deploys this run
    drill: dict | None = None  # runs/<run>/drill.json: a drill's table (watch/drill_report.py)
    config: dict | None = None  # runs/<run>/config.json: what its last deploy was made with

    def trained(self) -> dict:
        """The run's recipe, nodes and type: config.json's training values, else what
        status.json says (a run from before config.json has no recipe on record)."""
        training = (self.config or {}).get("training") or {}
        status = self.status or {}
        return {
            "recipe": training.get("recipe"),
            "nodes": training.get("nodes", status.get("nodes")),
            "type": training.get("instanceType", status.get("instance_type")),
        }

    @property
    def phase(self) -> str:
        status_phase = (self.status or {}).get("phase")
        if self.done and status_phase not in ENDED:
            return DONE_PHASE.get(self.done.get("status"), "done")
        return status_phase or self.stack_phase or "unknown"

    @property
    def started(self) -> datetime | None:
        """When the bill started: TrainStack's creation, else the first attempt's start."""
        if self.stack_created:
            return self.stack_created
        return parse_time((self.status or {}).get("attempt_started_at"))

    @property
    def ended(self) -> datetime | None:
        if self.phase not in ENDED:
            return None
        return parse_time((self.done or {}).get("finished_at")) or parse_time(
            (self.status or {}).get("updated_at")
        )

    def hourly(self) -> tuple[float, dict] | None:
        """The fleet's price per hour and the price record, when status.json carries one."""
        status = self.status or {}
        cost = status.get("cost")
        if not cost or not status.get("nodes"):
            return None
        return cost["usd_per_hour"] * status["nodes"], cost

    def spent(self) -> float | None:
        rate, started = self.hourly(), self.started
        if rate is None or started is None:
            return None
        end = self.ended or self.now
        return rate[0] * max((end - started).total_seconds(), 0) / 3600

    def cap(self) -> tuple[datetime, bool] | None:
        """The hard cap's time, and whether it is exact (TrainStack's output) or estimated."""
        if self.hard_cap_at:
            return self.hard_cap_at, True
        cost, started = (self.status or {}).get("cost"), self.started
        if not cost or started is None:
            return None
        return started + timedelta(hours=cost["max_hours"]), False


def shown(value, missing: str = "?") -> str:
    """A value of a record as the screen prints it: `missing` for one the record lacks, never
    "None"."""
    return missing if value is None else str(value)


def node_name(node: dict) -> str:
    """A node of a reset: its index once discovery knows it, else the instance it is (a
    replacement not indexed yet), else its address."""
    if node.get("node") is not None:
        return f"node {node['node']}"
    if node.get("instance_id"):
        return f"a replacement ({node['instance_id']})"
    return f"a node at {node['ip']}" if node.get("ip") else "a node"


def reset_line(reset: dict) -> str:
    """An elastic reset, for people: when, which nodes left or came, the ranks, its cost."""
    names = lambda nodes: ", ".join(node_name(n) for n in nodes)  # noqa: E731
    changed = "; ".join(
        part for part in (
            f"{names(reset.get('lost') or [])} lost" if reset.get("lost") else "",
            f"{names(reset.get('added') or [])} joined" if reset.get("added") else "",
        ) if part
    )  # fmt: skip
    recovery = reset.get("recovery_s")
    back = f", training again in {recovery:.0f} s" if recovery is not None else ""
    return (
        f"{shown(reset.get('at'), 'at an unknown time')}: {changed or 'the world changed'}, "
        f"{shown(reset.get('ranks_before'))} -> {shown(reset.get('ranks_after'))} "
        f"ranks{back}, {reset.get('steps_redone') or 0} step(s) redone"
    )


def current_resets(status: dict) -> list[dict]:
    """status.json's resets of the attempt it describes: a reset stamped before the attempt
    started is an earlier attempt's (a rerun of the run restores its records). Both stamps are
    UTC "%Y-%m-%dT%H:%M:%SZ", so they compare as text; a reset without one is kept."""
    started = status.get("attempt_started_at") or ""
    return [r for r in status.get("resets") or [] if (r.get("at") or started) >= started]


def status_screen(facts: RunFacts) -> str:
    """One screen: the first line starts with `horovod-fleet status`, the last is blank."""
    status = facts.status or {}
    progress = status.get("progress") or {}
    phase = facts.phase
    lines = [f"horovod-fleet status: run {facts.run}  (s3://{facts.bucket}/runs/{facts.run}/)"]
    updated = parse_time(status.get("updated_at"))
    age = f", updated {clock((facts.now - updated).total_seconds())} ago" if updated else ""
    attempt = f", attempt {status['attempt']}" if status.get("attempt") else ""
    lines.append(f"  phase       {LABELS.get(phase, phase)}{attempt}{age}")
    if held := hold_line(facts.hold, facts.stack_id):
        lines.append(held)
    if training := (facts.config or {}).get("training"):
        lines.append(
            f"  recipe      {shown(training.get('recipe'))}, {shown(training.get('epochs'))} "
            f"epochs, {shown(training.get('batchPerGpu'))} per GPU, {shown(training.get('nodes'))}"
            f" x {shown(training.get('instanceType'))} (config.json)"
        )
    if status:
        up = "?" if facts.nodes_up is None else facts.nodes_up
        gpus = status.get("gpus_per_node") or 0
        training = status.get("nodes_training")
        nodes = shown(status.get("nodes"))
        lines.append(
            (f"  nodes       {training} of {nodes} training, " if training else "  nodes       ")
            + f"{up} up, {shown(status.get('nodes_healthy'))} healthy of "
            f"{nodes} x {shown(status.get('instance_type'), 'an unknown type')}"
            + (f" ({gpus} GPUs each)" if gpus else " (CPU)")
        )
        if resets := current_resets(status):
            lines.append(f"  resets      {len(resets)}, the last: {reset_line(resets[-1])}")
    if progress:
        lines.append(
            f"  progress    epoch {shown(progress.get('epoch'))}/{shown(progress.get('epochs'))}, "
            f"step {shown(progress.get('step'))}/{shown(progress.get('steps_per_epoch'))} "
            f"(global step {shown(progress.get('global_step'))})"
        )
        rate = progress.get("images_per_s")
        if rate is not None:
            ranks = max((status.get("nodes") or 1) * (status.get("gpus_per_node") or 1), 1)
            lines.append(
                f"  throughput  {rate:,.1f} img/s global, {rate / ranks:,.1f} img/s per GPU"
            )
        top1 = progress.get("top1")
        lines.append(
            f"  loss        {shown(progress.get('loss'), 'not measured yet')}   top-1 "
            + ("not evaluated yet" if top1 is None else f"{top1:.4f}")
        )
        eta = progress.get("eta_s")
        if phase not in ENDED:
            lines.append(f"  ETA         {'measuring' if eta is None else clock(eta)}")
    lines.append(f"  cost        {cost_line(facts, progress.get('eta_s'))}")
    lines.append(f"  hard cap    {cap_line(facts)}")
    checkpoint = status.get("checkpoint")
    lines.append(
        "  checkpoint  "
        + (
            f"{shown(checkpoint.get('key'), 'a checkpoint')} (step {shown(checkpoint.get('step'))}, "
            f"{shown(checkpoint.get('at'), 'at an unknown time')})"
            if checkpoint
            else "none in S3 yet"
        )
    )
    if status.get("execution"):
        lines.append(
            f"  controller  {status.get('controller_state') or 'unknown'}: "
            f"{console_link(status['execution'])}"
        )
    for entry in (facts.attempts or [])[-SHOWN_ATTEMPTS:]:
        reason = entry.get("reason") or "no reason"
        reason = reason if len(reason) <= 90 else reason[:87] + "..."
        lines.append(
            f"  attempt {shown(entry.get('attempt'))}   {shown(entry.get('status'), 'ended')}, "
            f"{shown(entry.get('decision'), 'no decision')} ({shown(entry.get('why'), 'no code')}): "
            f"{reason}"
        )
    if line := goodput_line(facts):
        lines.append(line)
    if facts.done:
        done = facts.done
        figures = f", top-1 {done['top1']}" if done.get("top1") is not None else ""
        lines.append(
            f"  DONE.json   {shown(done.get('status'), 'written')}{figures}: "
            f"{done.get('reason') or 'no reason'}"
        )
    elif status.get("reason"):
        lines.append(f"  reason      {status['reason']}")
    return "\n".join(lines) + "\n\n"


def hold_line(hold: dict | None, stack_id: str | None) -> str | None:
    """The line for an operator's hold on record (`horovod-fleet hold`); None when the run is
    not held. A hold names the TrainStack it holds: one left from an earlier stack holds
    nothing."""
    if not hold or hold.get("held") is not True:
        return None
    reason = f" ({hold['reason']})" if hold.get("reason") else ""
    line = (
        f"  hold        held since {shown(hold.get('held_at'), 'an unknown time')} by "
        f"{shown(hold.get('held_by'), 'someone')}{reason}"
    )
    if stack_id and hold.get("stack_id") != stack_id:
        return line + ": for an earlier TrainStack, not in force"
    return (
        line + ": the run controller takes no action but the hard cap and cdk destroy "
        "(horovod-fleet release hands it back)"
    )


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def goodput_of(facts: RunFacts) -> dict:
    """DONE.json's goodput figures once the attempt has ended, else status.json's live ones."""
    if facts.done and "goodput" in facts.done:
        return facts.done
    return (facts.status or {}).get("goodput") or {}


def goodput_line(facts: RunFacts) -> str | None:
    """Goodput from the first launch and from the first step, and (from DONE.json) where the
    rest of the time went, the largest first (docs/contracts.md)."""
    figures = goodput_of(facts)
    if figures.get("goodput") is None and figures.get("runtime_goodput") is None:
        return None
    line = (
        f"  goodput     {percent(figures.get('goodput'))} from the first launch, "
        f"{percent(figures.get('runtime_goodput'))} from the first step"
    )
    lost = (figures.get("goodput_s") or {}).get("lost") or {}
    largest = sorted(((s, k) for k, s in lost.items() if s), reverse=True)[:4]
    if largest:
        line += "\n              lost: " + ", ".join(
            f"{k.replace('_', ' ')} {clock(s)}" for s, k in largest
        )
    return line


def phases_table(run: str, done: dict) -> str | None:
    """`horovod-fleet runs`: each start-up phase of a run's DONE.json, its slowest node's
    seconds against the estimate synthesis made (node.json startup_budget_s)."""
    timeline = done.get("timeline") or {}
    phases, budget = timeline.get("phases") or {}, timeline.get("budget_s") or {}
    if not any(p.get("s") is not None for p in phases.values()):
        return None
    lines = [
        f"{run}: start-up, attempt {shown(done.get('attempt'))}, measured (the slowest node) against "
        "estimated",
        f"  {'phase':<16} {'measured':>9} {'estimated':>10}  slowest",
    ]
    for code, phase in phases.items():
        measured = "-" if phase.get("s") is None else f"{phase['s']:.1f} s"
        estimated = "-" if budget.get(code) is None else f"{budget[code]:g} s"
        lines.append(
            f"  {code:<16} {measured:>9} {estimated:>10}  {phase.get('slowest') or 'not run'}"
        )
    return "\n".join(lines) + "\n"


def with_controller(status: dict | None, controller: dict | None) -> dict | None:
    """status.json as the screen shows it: the head's document (its only writer) with what
    the run controller says in its own controller.json: always its execution and state; its
    phase, attempt and reason when it wrote them after the head's last word (the head is
    gone, or a relaunch is under way). Both stamps are contract.runs.TIME_FORMAT's, so they
    compare as text."""
    if not controller:
        return status
    shown = dict(status or {})
    shown.update({k: controller[k] for k in ("execution", "controller_state") if k in controller})
    if (controller.get("updated_at") or "") > (shown.get("updated_at") or ""):
        shown.update({k: controller[k] for k in ("phase", "attempt", "reason") if k in controller})
    return shown


def console_link(execution_arn: str) -> str:
    """The Step Functions console's page of the run controller's execution (its region is the
    ARN's fourth field): the form public code uses, as AWS documents none."""
    region = execution_arn.split(":")[3]
    return (
        f"https://{region}.console.aws.amazon.com/states/home?region={region}"
        f"#/v2/executions/details/{execution_arn}"
    )


def cost_line(facts: RunFacts, eta_s: float | None) -> str:
    rate = facts.hourly()
    spent = facts.spent()
    if rate is None or spent is None:
        return "unknown (status.json holds no price yet)"
    hourly, cost = rate
    nodes = (facts.status or {}).get("nodes")
    text = f"${spent:,.2f} so far"
    if facts.phase not in ENDED and eta_s is not None:
        text += f", ~${spent + hourly * eta_s / 3600:,.2f} projected to the end of training"
    return (
        f"{text}\n              {nodes} x "
        f"{shown((facts.status or {}).get('instance_type'), 'an unknown type')} at "
        f"${cost['usd_per_hour']:g}/h = ${hourly:,.2f}/h (list prices {cost['prices_as_of']})"
    )


def cap_line(facts: RunFacts) -> str:
    if facts.phase in ENDED:
        return "not reached: the run has ended"
    cap = facts.cap()
    if cap is None:
        return f"unknown (no TrainStack output {DEADLINE_OUTPUT_KEY}, no max_hours in status.json)"
    at, exact = cap
    left = (at - facts.now).total_seconds()
    how = "" if exact else " (estimated from the head's start)"
    return f"{clock(left)} left, at {stamp(at)}{how}"


def runs_table(rows: list[RunFacts]) -> str:
    """`horovod-fleet runs`: one line per run with its goodput, then for each run whose
    DONE.json has a timeline its start-up phases against their estimates."""
    lines = [
        f"{'run':<24} {'recipe':<7} {'nodes':>5} {'type':<14} {'status':<16} {'top-1':>7} "
        f"{'duration':>9} {'cost':>10} {'goodput':>8}"
    ]
    for facts in rows:
        trained = facts.trained()
        top1 = (facts.done or {}).get("top1")
        if top1 is None:
            top1 = ((facts.status or {}).get("progress") or {}).get("top1")
        duration = (facts.done or {}).get("duration_s")
        if duration is None and facts.started:
            duration = ((facts.ended or facts.now) - facts.started).total_seconds()
        spent = facts.spent()
        lines.append(
            f"{facts.run:<24} {shown(trained['recipe'], '-'):<7} {shown(trained['nodes'], '-'):>5} "
            f"{shown(trained['type'], '-'):<14} {LABELS.get(facts.phase, facts.phase):<16} "
            f"{'-' if top1 is None else f'{top1:.4f}':>7} "
            f"{'-' if duration is None else clock(duration):>9} "
            f"{'-' if spent is None else f'${spent:,.2f}':>10} "
            f"{percent(goodput_of(facts).get('goodput')):>8}"
        )
    lines += [f"{f.run}: drill {drill_summary(f.drill)}" for f in rows if f.drill]
    tables = [t for f in rows if f.done and (t := phases_table(f.run, f.done))]
    return "\n".join(lines) + "\n" + "".join("\n" + t for t in tables)


def drill_summary(result: dict) -> str:
    """A drill's result (runs/<run>/drill.json) in a few words: how many experiments passed,
    and the names of those that did not."""
    passed = f"passed {result.get('passed')} of {result.get('of')}"
    failed = result.get("failed") or []
    return f"FAIL {', '.join(failed)} ({passed})" if failed else passed
