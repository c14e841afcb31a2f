"""Train ResNet-50 v1.5 on ImageNet TFRecords with TensorFlow 2 + Horovod; resumable, then evaluate.

Run (one process, or under horovodrun for several ranks; every rank gets the same flags):
    python -m trainer.train --data-dir /data/tfrecords --model-dir /data/model
    horovodrun -np 2 -H localhost:2 --gloo python -m trainer.train --data-dir D --model-dir M \
        --arch resnet18 --image-size 64 --batch-size 16 --epochs 2
    python -m trainer.train --synthetic --model-dir /tmp/m --epochs 1   # device-only smoke test

The command line is parsed and validated (trainer/config.py) before TensorFlow and Horovod are
imported: a mistake costs one `error: ...` line and exit status 2, not seconds of imports. The run
itself is trainer/run.py and the parts it lists; its outputs and exit statuses are in
docs/contracts.md.
"""

from __future__ import annotations

import sys
import time

from trainer.cli import fail
from trainer.config import ConfigError, parse_config


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the process's start, as near as Python gets (startup.json)
    try:
        config = parse_config(argv)  # the same argv on every rank: no agreement needed
    except ConfigError as exc:
        fail(str(exc))
    from trainer import run  # TensorFlow and Horovod: only for a command line that parsed

    return run.start(config, started)


if __name__ == "__main__":
    sys.exit(main())
