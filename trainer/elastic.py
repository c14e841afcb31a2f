"""Elastic training's control (`python -m trainer.train --elastic`): one world after another under
`hvd.elastic.run`, each from the last commit, until the epochs are done (docs/trainer.md,
"Elastic training"; Horovod's side: docs/elastic.rst and horovod/common/elastic.py, v0.28.1).

Each world (`ElasticSession.run_world`, what hvd.elastic.run calls after its state sync): open
it (this world's ranks, shards, learning rate, the restore in the first), record the reset that
led to it, commit, train with the loop (trainer/loop.py) and two more actions
(trainer/elastic_actions.py), finish together.

- ElasticCommit commits the state in memory every N steps (N from the measured step time, so
  that a commit ends at most --commit-every-s of steps) and at every epoch end, and takes
  Horovod's host updates at the next check step, where the flag riding in the step's allreduce
  says rank 0 got one (horovod/runner/elastic/driver.py notifies rank 0 alone): no collective
  between commits beyond the step's own.
- ElasticStop turns a SIGTERM into a planned leave: the signalled ranks' hosts leave at a commit
  and the others go on, or, when fewer than --min-ranks would be left, every rank stops at a
  checkpoint as without --elastic (exit 75): a graceful drop below the minimum world would
  otherwise wait for hosts and deadlock (horovod/horovod#3494).
- A collective that failed (a peer lost) becomes HorovodInternalError here: hvd.elastic.run
  turns only an UnknownError whose message names HorovodAllreduce, HorovodAllgather or
  HorovodBroadcast into one and returns None for any other (horovod/tensorflow/elastic.py
  v0.28.1 lines 53-60), and a named allreduce inside a tf.function names neither
  (tests/trainer/test_elastic.py holds the real messages).
- A host update always re-syncs every rank (skip_sync False): old ranks that skip the sync
  after a removal while new ones sync deadlock (horovod/horovod#3494).

No TensorFlow here: the TF/Horovod side (trainer/elastic_run.py) hands in the world and the
collectives, so tests/trainer/test_elastic.py drives this with fakes through Horovod's own
run_fn. Only Horovod's exception classes are imported (pure Python).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from trainer.actions import CheckpointOnStop, StopAtTarget, StopWhenAsked, checkpoint_and_target
from trainer.elastic_actions import CommitCadence, ElasticCommit, ElasticStop
from trainer.loop import Action, Loop, Schedule
from trainer.progress import utc_stamp


class UnexpectedError(RuntimeError):
    """An UnknownError that is no collective's: raised as this so that hvd.elastic.run, which
    swallows the UnknownErrors it does not recognise, lets it end the rank."""


def is_collective_failure(exc: BaseException) -> bool:
    """A Horovod collective failed (a peer lost, Horovod shut down): TensorFlow's UnknownError
    from a Horovod op. Eager ops name themselves ([Op:HorovodAllreduce] name: agree_flag); ops in
    a tf.function carry Horovod's op-definition trace (horovod/tensorflow/mpi_ops.py,
    horovod_allreduce) and, when Horovod shut down, its message "Horovod has been shut down"."""
    return type(exc).__name__ == "UnknownError" and "horovod" in str(exc).lower()


@dataclasses.dataclass
class World:
    """One world as the TF side opened it: this rank's place, every rank's host, and the parts
    the loop runs with. `synced_step` is the global step of the synced state (the last commit),
    before it was realigned to this world's steps; `start_epoch` and `skip_steps` where the loop
    starts."""

    rank: int
    ranks: int
    hosts: list[str]  # every rank's Horovod host name (HOROVOD_HOSTNAME), in rank order
    host: str  # this rank's
    synced_step: int
    start_step: int  # the global step at the loop's start, in this world's steps
    start_epoch: int
    skip_steps: int
    steps_per_epoch: int
    batches: Any
    schedule: Schedule


@dataclasses.dataclass(frozen=True)
class Pending:
    """What this rank saw of the failure or host update that ends its world: kept until the
    next world records it (from rank 0's, an old rank, whose note every rank then shares)."""

    at: float  # wall time it was caught
    kind: str  # "failure" | "hosts updated" | "leave"
    failed_at_step: int  # the last global step issued before it
    steps_seen_done_at: float  # wall time the host last saw steps done


@dataclasses.dataclass
class Parts:
    """What the TF side hands the session: `open_world(state)` (collective) returns the World;
    `step` is trainer/step.py's Trainer, `recorder` the Recorder, `checkpoints` the Checkpoints
    saver; `collectives` has agree(error), gather(value, name), broadcast(value, name) (rank
    0's) and most(value, name) (the maximum over ranks); `finish(epochs, target, resets,
    record)` writes train.json (the attempt's start-up figures from `record`) and the digest
    hook."""

    open_world: Callable[[Any], World]
    step: Any
    recorder: Any
    checkpoints: Any
    collectives: Any
    finish: Callable[[int, dict, list[dict], dict], None]
    stop_request: Any
    log: Callable[[str], None]


class ElasticSession:
    """The function hvd.elastic.run runs (run_world) and what it keeps between worlds."""

    def __init__(
        self,
        parts: Parts,
        *,
        min_ranks: int,
        commit_every_s: float,
        checkpoint_every_s: float,
        target_top1: float | None,
        stop_file: Path | None = None,
        clock: Callable[[], float] = time.time,
        step_clock: Callable[[], float] = time.perf_counter,
    ):
        self.parts = parts
        self.step = parts.step
        self.recorder = parts.recorder
        self.collectives = parts.collectives
        self.stop_request = parts.stop_request
        self.log = parts.log
        self.min_ranks = min_ranks
        self.commit_every_s = commit_every_s
        self.checkpoint_every_s = checkpoint_every_s
        self.target_top1 = target_top1
        self.stop_file = stop_file  # --stop-file: the agreed stop asked from outside
        self.asked: StopWhenAsked | None = None
        self.clock = clock  # wall time, for the record
        self.step_clock = step_clock  # for the step time the commits follow
        self.state = None
        self.world: World | None = None
        self.loop: Loop | None = None
        self.committed = 0  # the global step of the last commit
        self.position = (0, 0)  # and its epochs done and steps into the next epoch
        self.pending: Pending | None = None
        self.awaiting_recovery: float | None = None  # the last steps seen done before a reset

    # -- one world ------------------------------------------------------------------------
    def run_world(self, state) -> int:
        """hvd.elastic.run's function: the rest of the training in the world Horovod formed.
        Returns the epochs trained."""
        self.state, self.world, self.loop = state, None, None
        try:
            return self._run_world(state)
        except HostsUpdatedInterrupt as exc:
            self.note("hosts updated")
            if exc.skip_sync:
                # Removed hosts only: fewer may be left than horovodrun's --min-np, and Horovod
                # then waits up to HOROVOD_ELASTIC_TIMEOUT for others; keep this step on disk.
                self.parts.checkpoints.save(self.position[1])
            # Every rank syncs, old and new (horovod/horovod#3494).
            raise HostsUpdatedInterrupt(False) from exc
        except Exception as exc:
            if is_collective_failure(exc):
                self.note("failure")
                raise HorovodInternalError(exc) from exc
            if type(exc).__name__ == "UnknownError":
                raise UnexpectedError(f"{type(exc).__name__}: {exc}") from exc
            raise

    def _run_world(self, state) -> int:
        world = self.world = self.parts.open_world(state)
        self.position = (world.start_epoch, world.skip_steps)
        self.record_world(state, world)
        self.recorder.write_digest(f"world-{len(state.resets)}-")  # the test hook, after a sync
        self.commit_at(world.start_step)  # this world's start is the first commit point
        if (ended := state.record.get("reached") or state.record.get("stopped")) is not None:
            epochs = ended["epoch"]  # the target reached, or the stop asked, before a reset
        else:
            self.loop, target = self.make_loop(world)
            epochs = self.loop.run(world.start_epoch, world.skip_steps)
            if target is not None and target.reached is not None:
                state.record = {**state.record, "reached": target.reached}
                self.commit_at(self.loop.global_step)
            elif self.asked is not None and self.asked.stopped_at is not None:
                state.record = {**state.record, "stopped": {"epoch": self.asked.stopped_at}}
                self.commit_at(self.loop.global_step)
        # Horovod: every rank is here before any leaves (none exits 0 while another could still
        # fail in a collective and reset, registration.py's trap above).
        self.collectives.agree(None)
        self.settle_recovery()
        self.parts.finish(epochs, self.target_summary(state), state.resets, state.record)
        return epochs

    def make_loop(self, world: World) -> tuple[Loop, StopAtTarget | None]:
        checkpoints, recorder = self.parts.checkpoints, self.recorder
        agree = self.collectives.agree
        coordinated = CheckpointOnStop(self.step, checkpoints, recorder, self.stop_request, agree)
        more, target = checkpoint_and_target(
            checkpoints, self.checkpoint_every_s, self.target_top1, recorder
        )
        actions: list[Action] = [
            ElasticStop(self, coordinated, self.min_ranks),
            ElasticCommit(self, CommitCadence(self.commit_every_s)),
            *more,
        ]
        self.asked = None
        if self.stop_file is not None:
            # Horovod: whether any rank's node holds the file, the largest flag of all ranks'.
            self.asked = StopWhenAsked(
                self.stop_file,
                lambda flag, name: self.collectives.most(float(flag), name) > 0,
                checkpoints,
                self.log,
            )
            actions.append(self.asked)
        loop = Loop(
            self.step,
            world.batches,
            recorder,
            world.schedule,
            actions=actions,
            stop_request=self.stop_request,
            agree=agree,
            hosts_updated=lambda: self.state.hosts_update_pending,
            on_step=recorder.steps_seen,
        )
        return loop, target

    def target_summary(self, state) -> dict:
        """train.json's fields of the stops: the target's, and the epoch a stop was asked at."""
        summary = {}
        if self.target_top1 is not None:
            reached = state.record.get("reached")
            summary = {
                "target_top1": self.target_top1,
                "reached_target_at_epoch": reached and reached["epoch"],
                "time_to_target_s": reached and reached["time_to_target_s"],
            }
        if self.stop_file is not None:
            stopped = state.record.get("stopped")
            summary["stopped_as_asked_at_epoch"] = stopped and stopped["epoch"]
        return summary

    # -- commits and host updates ------------------------------------------------------------
    def commit(self, epochs_done: int, epoch_step: int, global_step: int) -> None:
        """Every rank at the same step: the position into the state's variables, then a copy
        of every variable in memory (no disk)."""
        self.step.mark_position(epochs_done, epoch_step)
        self.position = (epochs_done, epoch_step)
        self.commit_at(global_step)

    def commit_at(self, global_step: int) -> None:
        self.state.save()
        self.committed = global_step

    def take_host_updates(self) -> None:
        """Horovod: rank 0's host update, broadcast; raises HostsUpdatedInterrupt on every
        rank when there is one (horovod/common/elastic.py State.check_host_updates)."""
        self.state.hosts_update_pending = False
        self.state.check_host_updates()

    def note(self, kind: str) -> None:
        """What this rank saw when its world ended; the next world records rank 0's."""
        loop = self.loop
        now = self.clock()
        if loop is not None:
            failed_at, seen = loop.global_step, loop.steps_seen_done_at or now
        else:
            failed_at, seen = self.committed, now
        if self.pending is None:  # a failure during a reset belongs to the same reset
            self.pending = Pending(now, kind, failed_at, seen)

    # -- the record of resets -------------------------------------------------------------------
    def record_world(self, state, world: World) -> None:
        """After the sync: the first world's start-up, or the reset that led here, from rank
        0's note (every rank appends the same entry; rank 0 writes resets.json)."""
        # Horovod: rank 0's note (an old rank: Horovod gives rank 0 to the oldest host left).
        note = self.collectives.broadcast(self.pending if world.rank == 0 else None, "reset_note")
        self.pending = None
        if not state.started:
            state.started = True
            state.record = {**state.record, "start_step": world.start_step}
        previous = state.world
        state.world = {"ranks": world.ranks, "hosts": world.hosts}
        if previous is None:
            return
        failed_at = note.failed_at_step if note else world.synced_step
        before, after = set(previous["hosts"]), set(world.hosts)
        reset = {
            "at": utc_stamp(note.at if note else self.clock()),
            "ranks_before": previous["ranks"],
            "ranks_after": world.ranks,
            "hosts_lost": sorted(before - after),
            "hosts_added": sorted(after - before),
            "failed_at_step": failed_at,
            "resumed_at_step": world.synced_step,
            "steps_redone": max(0, failed_at - world.synced_step),
            "recovery_s": None,
        }
        state.resets = [*state.resets, reset]
        self.awaiting_recovery = note.steps_seen_done_at if note else None
        self.log(
            f"elastic: reset to {world.ranks} ranks (from {previous['ranks']}; hosts lost: "
            f"{', '.join(reset['hosts_lost']) or 'none'}, added: "
            f"{', '.join(reset['hosts_added']) or 'none'}), {reset['steps_redone']} steps "
            f"redone from step {world.synced_step}"
        )
        self.recorder.write_resets(state.resets)

    def settle_recovery(self) -> None:
        """Once this world's first step ended: the last reset's recovery_s (from the last steps
        seen done before it), and the attempt's start-up figures if none are kept yet."""
        loop, state = self.loop, self.state
        if loop is None or loop.first_step_ended_at is None:
            return
        if "first_step_at" not in state.record:
            timings = self.recorder.timings
            state.record = {
                **state.record,
                "framework_start_s": timings.framework_start_s,
                "first_step_s": timings.first_step_s,
                "first_step_at": timings.first_step_at,
            }
        if self.awaiting_recovery is None:
            return
        recovery = round(loop.first_step_ended_at - self.awaiting_recovery, 1)
        self.awaiting_recovery = None
        state.resets = [*state.resets[:-1], {**state.resets[-1], "recovery_s": recovery}]
        self.recorder.write_resets(state.resets)
