"""The first half of the tick's decision: what the guards decide from CloudFormation's, EC2's,
Step Functions' and CloudWatch's view alone, before anything reads the run's records in S3
(observe.world). So a refused or failing read of a record never delays them: the tick acts on
them, then reads the records, and fails loudly after (its error alarm).

    no TrainStack                                   none (orphans only)
    being deleted (cdk destroy, or ours)            deleting: the delete is followed
    past the hard cap                               capped: every other action stopped, deleted
    being created or updated                        creating / updating: only the cap acts
    held by an operator                             held: nothing more (decide.py's docstring)
    an idle delete started, or the fleet idle       idle: deleted
    otherwise                                       None: the records decide (decide.py)

An operator's hold (`horovod-fleet hold`) stops everything but the hard cap and a delete under
way, as AWS ParallelCluster's `disable_all_cluster_management` switches its cluster manager's
repairs off (`manage_cluster`: `if not self._config.disable_all_cluster_management:`,
aws/aws-parallelcluster-node src/slurm_plugin/clustermgtd.py at 2e8f9a8,
https://github.com/aws/aws-parallelcluster-node/blob/2e8f9a8e325d447cbfc36bb3ebd118cbd6439d6d/src/slurm_plugin/clustermgtd.py).
Nothing of the idle guard's clock is kept: it is read from the alarm each tick, so a fleet that
went idle while held goes at the first tick after its release.
Pure, as decide.py. Only the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from contract.runs import stamp
from controller import judge, train_stack
from controller.actions import Verdict
from controller.long_actions import Decider
from controller.snapshot import Snapshot

# Stack statuses in which CloudFormation owns every change: nothing of the run is judged.
ROLLING_BACK = ("ROLLBACK_IN_PROGRESS",)
# A create that failed and could not be rolled back: its instances are left over (orphans).
LEFT_OVER = ("ROLLBACK_FAILED",)


def guards(snapshot: Snapshot, now: datetime.datetime) -> Verdict:
    """{"phase", "why", "actions"}; phase None when no guard owns the tick."""
    return Guards(snapshot, now).verdict()


class Guards(Decider):
    def verdict(self) -> Verdict:
        stack = self.stack
        live = not train_stack.gone(stack) and stack["status"] not in LEFT_OVER
        self.sweep(stack if live else None, of_live=False, known=set())
        if not live:
            return self.phase("none", "no TrainStack" if stack is None else stack["status"])
        if not stack["run"]:
            return self.phase("unknown", "TrainStack names no run (a stack from before the tags)")
        if train_stack.deleting(stack):
            return self.deleting()
        if stack["status"] in ROLLING_BACK:
            return self.phase("rolling_back", "CloudFormation rolls the create back")
        if stack["deadline"] is not None and self.now >= stack["deadline"]:
            return self.capped()
        if train_stack.busy(stack):
            kind = "creating" if train_stack.creating(stack) else "updating"
            return self.phase(kind, f"TrainStack is {stack['status']}: judged once it is over")
        if judge.held(self.hold, stack):
            return self.held()
        if self.given_up():
            return self.phase(None, "an action was given up: the records say what bills")
        idle = judge.chain(self.executions, "idle")
        if idle["state"] != "none":
            return self.follow_chain("idle", idle, self.delete_input("idle"), "idle")
        if (since := self.idle_since()) is not None:
            mail = f"sat idle since {stamp(since)}: the run controller is deleting its fleet"
            return self.follow_chain("idle", idle, self.delete_input("idle"), "idle", mail=mail)
        return self.phase(None, "no guard acts")

    def deleting(self) -> Verdict:
        """A delete under way is followed: by the execution that asked for it, else by one of
        its own (cdk destroy), which terminates what holds a DELETE_FAILED up and deletes again."""
        if any(e["status"] == "RUNNING" for e in self.executions):
            return self.phase("deleting", "an execution follows the delete")
        chain = judge.chain(self.executions, "destroy")
        document = {**self.base_input(), "action": "follow", "reason": "destroy"}
        return self.follow_chain("destroy", chain, document, "deleting")

    def capped(self) -> Verdict:
        """The hard cap defers to nothing: every other long action stops, and the fleet goes."""
        others = [
            e["arn"] for e in self.executions if e["status"] == "RUNNING" and e["kind"] != "cap"
        ]
        if others:
            self.actions.append(
                {"do": "stop_executions", "arns": others, "why": "the hard cap ends the run"}
            )
        chain = judge.chain(self.executions, "cap")
        return self.follow_chain(
            "cap",
            chain,
            self.delete_input("hard-cap"),
            "capped",
            mail="reached its hard cap: the run controller is deleting its fleet",
        )

    def held(self) -> Verdict:
        """An operator holds the run: no action. An idle fleet says when it will go."""
        hold = self.hold
        why = (
            f"held by {hold.get('held_by') or 'an operator'} since {hold.get('held_at')}: the "
            "run controller takes no action but the hard cap and a delete"
        )
        if (since := self.idle_since()) is not None:
            why += f"; idle since {stamp(since)}, the fleet goes at the first tick after release"
        return self.phase("held", why)

    def given_up(self) -> bool:
        """A long action failed past its resumes: decide.py stops what bills, as recorded."""
        kinds = {e["kind"] for e in self.executions}
        return any(judge.chain(self.executions, k)["state"] == "exhausted" for k in kinds)

    def idle_since(self) -> datetime.datetime | None:
        """When the idle alarm went off, if the fleet is due to go now: quiet for the idle window
        since its last progress, and past its launch grace since it was deployed or relaunched
        (the end of its newest relaunch's execution); None otherwise, and while the end of an
        attempt is acted on (an execution of it running, or to be resumed).

        The newest checkpoint's time is the one thing read from S3. When that read failed, the
        alarm is judged alone, as if no checkpoint came after its onset: a checkpoint can only
        postpone the delete, never bring it forward; the alarm itself is CloudWatch's evidence
        of GPUs below 5% (or no metrics at all) for the whole window; deleting TrainStack keeps
        every checkpoint and log in S3, so a wrong delete costs the progress since the newest
        checkpoint and a `cdk deploy`, while waiting for S3 would keep an idle fleet billing up
        to the hard cap for as long as the controller cannot read it."""
        alarm = self.alarm
        if alarm is None or alarm.get("state") != "ALARM":
            return None
        ends = [e for e in self.executions if e["kind"].startswith("a")]
        if any(judge.chain(ends, e["kind"])["state"] in ("running", "failed") for e in ends):
            return None
        relaunched = [e["stopped"] or e["started"] for e in ends if e["stopped"] or e["started"]]
        deployed = max([self.stack.get("deployed_at") or self.stack["created_at"], *relaunched])
        due = judge.idle_due(
            alarm["since"],
            self.checkpoint_at,
            deployed,
            datetime.timedelta(minutes=self.settings.get("idle_minutes", 30)),
            datetime.timedelta(seconds=self.stack["startup_grace_s"]),
        )
        return alarm["since"] if self.now >= due else None
