"""Fakes of the loop's parts (trainer/loop.py): the step, the batches, the recorder and the
checkpoint saver, shared by tests/trainer/test_loop.py and test_elastic.py (a module of its own:
every tests/ folder has a conftest.py, so test modules do not import each other).

The fake step sums the ranks' flags between reads as the step's allreduce does, so a stop or an
input failure is seen at the next check step, as on the ranks.
"""

import dataclasses

from trainer.actions import StopRequest
from trainer.loop import Schedule, StepSums


class Agreed(Exception):
    """What the fake agree raises for an error, as trainer/ranks.py's raises RunError."""


@dataclasses.dataclass
class FakeStep:
    events: list
    start_step: int = 0
    top1_by_epoch: dict = dataclasses.field(default_factory=dict)
    stop_after: int | None = None  # a signal arrives once this global step is done
    request: StopRequest | None = None
    signal_name: str | None = "SIGTERM"  # None: it came to another rank, seen only in the sums

    def __post_init__(self):
        self.steps = self.start_step
        self.flags = [False, False, False]  # bad input, stop, hosts updated
        self.epoch = 0

    def train(self, images, labels, *, bad_input, stop, hosts_updated):
        self.steps += 1
        self.events.append(("train", self.steps, images))
        sent = (bad_input, stop, hosts_updated)
        self.flags = [summed or flag for summed, flag in zip(self.flags, sent, strict=True)]
        if self.stop_after == self.steps:
            self.request.requested = True
            self.request.signal_name = self.signal_name

    def read_sums(self, steps):
        self.events.append(("read", self.steps, steps))
        sums, self.flags = StepSums(1.0, 2.0, *self.flags), [False, False, False]
        return sums

    def global_step(self):
        return self.steps

    def wait(self):
        self.events.append(("wait", self.steps))

    def learning_rate(self):
        return 0.1

    def average_batchnorm_statistics(self):
        self.events.append(("batchnorm", self.steps))

    def record_epoch(self, epoch):
        self.epoch = epoch
        self.events.append(("epoch done", epoch))

    def evaluate(self, batches, describe_error):
        self.events.append(("evaluate", self.epoch))
        return {"top1": self.top1_by_epoch.get(self.epoch, 0.0), "epoch": self.epoch}


class FakeSource:
    def __init__(self, size, fail_at=None):
        self.size, self.fail_at, self.error, self.taken = size, fail_at, None, 0

    def next(self):
        self.taken += 1
        if self.taken == self.fail_at:
            self.error = "label 9 outside 1..4 in train-00001"
        return ("placeholder" if self.error else f"batch at {self.size}"), None


@dataclasses.dataclass
class FakeBatches:
    events: list
    fail_at: int | None = None

    def train(self, size, epoch, skip_steps):
        self.events.append(("pipeline", size, epoch, skip_steps))
        return FakeSource(size, self.fail_at)

    def eval(self):
        return []

    def describe_eval_error(self, exc):
        return str(exc)


class FakeRecorder:
    def __init__(self, events):
        self.events = events

    def __getattr__(self, name):
        def record(*args, **kwargs):
            if "learning_rate" in kwargs:
                kwargs["learning_rate"] = kwargs["learning_rate"]()
            self.events.append((name, *args, *sorted(kwargs.items())))
            return 12.0  # training_seconds

        return record


class FakeCheckpoints:
    def __init__(self, events, step, since_save=0.0):
        self.events, self.step, self.since_save = events, step, since_save

    def save(self, epoch_step):
        self.events.append(("save", self.step.steps, epoch_step))
        self.since_save = 0.0

    def seconds_since_save(self):
        return self.since_save


def schedule(**changes) -> Schedule:
    values = dict(
        epochs=2,
        steps_per_epoch=10,
        log_every=5,
        eval_every=1,
        image_size=32,
        train_size=lambda epoch: 32,
    )
    return Schedule(**(values | changes))
