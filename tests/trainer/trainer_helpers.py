"""Values shared by the trainer tests and their conftest.py (a unique module name: every tests/
folder has a conftest.py)."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
HOROVODRUN = str(Path(PYTHON).parent / "horovodrun")


def trainer_env(**extra: str) -> dict[str, str]:
    """The environment of a trainer process the tests start (built from os.environ, so the
    default tier's guard sees what it starts)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


# The shared two-rank run's flags (conftest.py two_rank_digits_run): 8 epochs planned, evaluated
# after each, stopped at the first whose top-1 reaches DIGITS_TARGET_TOP1 (10 classes: chance
# is 0.10; working training passes 0.6 in two or three epochs here; labels off by one, a missing
# weight broadcast or unaveraged gradients do not).
DIGITS_TARGET_TOP1 = 0.6
DIGITS_RUN = ["--arch", "resnet18", "--image-size", "32", "--batch-size", "32", "--epochs", "8",
              "--warmup-epochs", "1", "--base-lr", "0.8", "--min-crop-area", "0.5",
              "--log-every", "10", "--eval-every", "1", "--target-top1", str(DIGITS_TARGET_TOP1)]  # fmt: skip
