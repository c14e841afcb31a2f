"""What every part of the rehearsal shares: the local S3's bucket, its run and region, `say` and
`StepFailed`. rehearsal/core.py composes the parts into `Rehearsal`; rehearsal/benchmark.py and
the fault rehearsal (rehearsal/faults.py and its fault_*.py) build on them, never on the command
line (`python -m rehearsal` runs __main__.py as the module `__main__`: importing it again would
make a second copy).
"""

from __future__ import annotations

import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUCKET = "horovod-fleet-rehearsal"
RUN = "rehearsal"
REGION = "us-east-1"
# TrainStack's defaults, which the rehearsal's fleet plays: cdk.json's maxRestarts, and the hard
# cap of stacks/config.py's DEFAULT_MAX_HOURS (tests/rehearsal/test_rehearsal.py keeps them equal).
MAX_RESTARTS = 3
MAX_HOURS = 4


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [rehearsal] {message}", flush=True)


class StepFailed(RuntimeError):
    pass
