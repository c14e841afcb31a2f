"""The two actions an elastic run adds to the loop (trainer/loop.py), and the cadence of its
commits; trainer/elastic.py's session plugs them into each world's loop and docs/trainer.md,
"Elastic training", says why each is so.

- ElasticCommit: a commit (in memory, every rank at the same step) every N steps, N from the
  world's measured step time, and at each epoch end; Horovod's host updates taken at the next
  check step, from the flag rank 0's notice puts into the step's allreduce.
- ElasticStop: a SIGTERM's hosts leave at a commit (LeftJob, EXIT_LEFT), or every rank stops at
  a checkpoint when fewer than --min-ranks would be left (CheckpointOnStop's coordinated stop).

No TensorFlow; Horovod's exception classes only.
"""

from __future__ import annotations

import math

from horovod.common.exceptions import HostsUpdatedInterrupt

from trainer.actions import CheckpointOnStop
from trainer.loop import Action, Check

# Exit status of a rank that left the elastic job while the others go on: its host got SIGTERM
# (a Spot notice) and enough ranks are left. Never 0: once a worker exited 0,
# Horovod's driver ends the job at the others' next reset instead of forming a new world
# (registration.py v0.28.1 lines 145-149, "if any process succeeded, shutdown all other
# processes").
EXIT_LEFT = 76


class LeftJob(Exception):
    """This rank leaves the elastic job; the others train on without it."""


class CommitCadence:
    """Commit every `every_steps` steps: at each check step until the world's step time is
    measured (between its first two check steps, the same steps on every rank, the slowest
    rank's time agreed), then every floor(every_s / step_s) steps."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.every_steps: int | None = None
        self.first_check: tuple[int, float] | None = None

    def measure(self, global_step: int, now: float) -> float | None:
        """This rank's mean step time at the world's second check, else None."""
        if self.every_steps is not None:
            return None
        if self.first_check is None:
            self.first_check = (global_step, now)
            return None
        steps, began = global_step - self.first_check[0], self.first_check[1]
        return (now - began) / steps if steps > 0 else None

    def set_step_seconds(self, step_s: float) -> int:
        self.every_steps = max(1, math.floor(self.every_s / step_s)) if step_s > 0 else 1
        return self.every_steps

    def due(self, global_step: int, last_commit_step: int) -> bool:
        if self.every_steps is None:
            return True
        return global_step - last_commit_step >= self.every_steps


class ElasticCommit(Action):
    """Commits (in memory, every rank at the same steps) and Horovod's host updates. `session`:
    trainer/elastic.py's ElasticSession (its commit, take_host_updates, collectives, log)."""

    def __init__(self, session, cadence: CommitCadence):
        self.session = session
        self.cadence = cadence

    def at_check(self, check: Check) -> None:
        session = self.session
        session.settle_recovery()
        step_s = self.cadence.measure(check.global_step, session.step_clock())
        if step_s is not None:
            # Horovod: every rank measured the same steps; the slowest sets the cadence.
            agreed = session.collectives.most(step_s, "step_seconds")
            every = self.cadence.set_step_seconds(agreed)
            session.log(
                f"elastic: commit every {every} steps (at most {self.cadence.every_s:g} s of "
                f"steps at {agreed:.3f} s/step)"
            )
        if check.hosts_updated:
            # Commit first: a host update resets without restoring (docs/elastic.rst step 3).
            session.commit(check.epoch - 1, check.step, check.global_step)
            session.take_host_updates()  # raises HostsUpdatedInterrupt on every rank
        elif not check.last_in_epoch and self.cadence.due(check.global_step, session.committed):
            session.commit(check.epoch - 1, check.step, check.global_step)

    def at_epoch_end(self, epoch: int, evaluation: dict | None, last: bool) -> bool:
        self.session.commit(epoch, 0, self.session.loop.global_step)
        return False


class ElasticStop(Action):
    """SIGTERM under --elastic: the signalled ranks' hosts leave at this check step, or every
    rank stops at a checkpoint (`coordinated`, CheckpointOnStop) when fewer than `min_ranks`
    would be left. `session`: trainer/elastic.py's ElasticSession."""

    def __init__(self, session, coordinated: CheckpointOnStop, min_ranks: int):
        self.session = session
        self.coordinated = coordinated
        self.min_ranks = min_ranks

    def at_check(self, check: Check) -> None:
        if not check.stop:
            return
        session, world = self.session, self.session.world
        # Horovod: which hosts asked to leave (a node's SIGTERM reaches each of its ranks at its
        # own moment: a host leaves whole when any of its ranks asked).
        asked = session.collectives.gather((world.host, session.stop_request.requested), "leave")
        leaving = {host for host, requested in asked if requested}
        staying = sum(1 for host, _ in asked if host not in leaving)
        if staying < max(self.min_ranks, 1):
            session.log(
                f"elastic: {', '.join(sorted(leaving))} leaving would leave {staying} of "
                f"{len(asked)} ranks, fewer than --min-ranks {self.min_ranks}: every rank stops"
            )
            self.coordinated.at_check(check)  # raises Interrupted
            return
        session.commit(check.epoch - 1, check.step, check.global_step)
        session.note("leave")
        if world.host in leaving:
            raise LeftJob(
                f"host {world.host} leaves the elastic job at step {check.global_step} "
                f"(SIGTERM); {staying} ranks go on"
            )
        # The others reset into a world without it; its ranks exit EXIT_LEFT, which Horovod's
        # driver records as their failure and so takes their host out.
        raise HostsUpdatedInterrupt(False)
