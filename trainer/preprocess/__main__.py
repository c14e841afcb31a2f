"""ILSVRC archives (or an extracted tree) to sharded TFRecords, streamed, parallel, resumable.

    python -m trainer.preprocess --train-tar ILSVRC2012_img_train.tar \
        --val-tar ILSVRC2012_img_val.tar --val-labels ILSVRC2012_devkit_t12.tar.gz \
        --output /data/tfrecords            # or s3://BUCKET/tfrecords; inputs may be s3:// too

The command line: its flags and their checks; each failure it expects is one `error:` line and
exit 2 (130 when interrupted). The conversion itself is convert.py's.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py tests/trainer/test_preprocess_s3.py tests/trainer/test_cli.py
"""

import os
import signal
import sys
from concurrent.futures.process import BrokenProcessPool

from trainer.cli import OneLineErrorParser, fail
from trainer.preprocess.archives import InputError, split_s3_url
from trainer.preprocess.convert import Config, run


def _bounded(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InputError(f"{flag} must be between {low} and {high}, got {value}")


def parse_config(argv: list[str] | None) -> Config:
    parser = OneLineErrorParser(
        prog="python -m trainer.preprocess", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add(
        "--train-tar",
        metavar="PATH_OR_S3",
        help="ILSVRC2012_img_train.tar (a tar of per-synset tars): path or s3://",
    )
    add(
        "--train-dir",
        metavar="TREE",
        help="instead of --train-tar: an extracted tree TREE/<synset>/<image>",
    )
    add(
        "--val-tar",
        metavar="PATH_OR_S3",
        help="ILSVRC2012_img_val.tar (flat images): path or s3://",
    )
    add(
        "--val-labels",
        metavar="PATH_OR_S3",
        help="validation ground truth: the devkit as image-net.org ships it "
        "(ILSVRC2012_devkit_t12.tar.gz), or one synset per line in file-name order",
    )
    add(
        "--output",
        metavar="DIR_OR_S3",
        required=True,
        help="directory or s3://BUCKET/PREFIX for shards + manifest.json",
    )
    add("--train-shards", metavar="N", type=int, default=1024, help="train shards")
    add("--val-shards", metavar="N", type=int, default=128, help="validation shards")
    add(
        "--short-side",
        metavar="N",
        type=int,
        default=256,
        help="shorter side, 32-4096 px, never upscaled",
    )
    add("--quality", metavar="N", type=int, default=90, help="JPEG quality 1-100")
    add(
        "--workers",
        metavar="N",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="processes (default: one per core, %(default)s here)",
    )
    add(
        "--min-images-per-class",
        metavar="K",
        type=int,
        default=0,
        help="with --train-dir: drop smaller classes",
    )
    add(
        "--val-per-class",
        metavar="M",
        type=int,
        default=0,
        help="with --train-dir: carve M images per class as validation",
    )
    add(
        "--shards-per-block",
        metavar="N",
        type=int,
        default=64,
        help="shards written together; a restart redoes at most one block",
    )
    args = parser.parse_args(argv)
    config = Config(**{name: value for name, value in vars(args).items()})
    validate(config)
    return config


def validate(config: Config) -> None:
    """Rejects inconsistent or out-of-range options; paths are checked when opened."""
    if (config.train_tar is None) == (config.train_dir is None):
        raise InputError("give exactly one of --train-tar and --train-dir")
    has_val_archive = config.val_tar is not None or config.val_labels is not None
    if config.val_per_class:
        if config.train_dir is None or has_val_archive:
            raise InputError(
                "--val-per-class needs --train-dir and excludes --val-tar/--val-labels"
            )
    elif config.val_tar is None or config.val_labels is None:
        raise InputError("give --val-tar with --val-labels (or --val-per-class with --train-dir)")
    if config.min_images_per_class and config.train_dir is None:
        raise InputError(
            "--min-images-per-class needs --train-dir (a tar cannot be counted cheaply)"
        )
    _bounded("--train-shards", config.train_shards, 1, 99999)
    _bounded("--val-shards", config.val_shards, 1, 99999)
    _bounded("--short-side", config.short_side, 32, 4096)
    _bounded("--quality", config.quality, 1, 100)
    _bounded("--workers", config.workers, 1, 512)
    _bounded("--min-images-per-class", config.min_images_per_class, 0, 10**7)
    _bounded("--val-per-class", config.val_per_class, 0, 10**6)
    _bounded("--shards-per-block", config.shards_per_block, 1, 99999)
    for flag, value in [
        ("--train-tar", config.train_tar),
        ("--train-dir", config.train_dir),
        ("--val-tar", config.val_tar),
        ("--val-labels", config.val_labels),
        ("--output", config.output),
    ]:
        if value is not None and not value.strip():
            raise InputError(f"{flag} is empty; give a path or an s3:// URL")
        if value and value.startswith("s3://"):
            try:
                split_s3_url(value, object_key=flag != "--output")
            except InputError as exc:
                raise InputError(f"{flag}: {exc}") from None


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        manifest = run(parse_config(argv))
    except InputError as exc:
        fail(str(exc))
    except BrokenProcessPool:
        fail("a worker process died (out of memory?); rerun the same command to resume")
    except KeyboardInterrupt:
        fail("interrupted; rerun the same command to resume", 130)
    except OSError as exc:
        fail(f"{exc.filename or 'I/O'}: {exc.strerror or exc}")
    except Exception as exc:
        if not type(exc).__module__.startswith(("botocore", "boto3", "s3transfer")):
            raise
        fail(f"S3: {' '.join(str(exc).split())}")
    splits = ", ".join(
        f"{name} {s['records']} records in {s['shards']} shards"
        for name, s in manifest["splits"].items()
    )
    print(f"wrote {splits}; {len(manifest['skipped'])} images skipped", file=sys.stderr)


if __name__ == "__main__":
    main()
