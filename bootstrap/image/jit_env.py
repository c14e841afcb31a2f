"""The environment a training node takes from the JIT caches its image baked (image.json
`jit_cache`, written by bootstrap/image_proof/jit_cache.py): CUDA_CACHE_PATH and
CUDA_CACHE_MAXSIZE, and TensorFlow's persistent XLA cache in TF_XLA_FLAGS, where the node's GPUs
are of the compute capability the caches were warmed for (H100 and H200, p5-class) and run the
driver they were warmed with. A cache is valid until a driver upgrade
(https://docs.nvidia.com/cuvs/developer-guide/advanced-topics/jit-compilation).

    python3 -m bootstrap.image.jit_env [--image-json /opt/horovod-fleet/image.json]

prints one KEY=VALUE line per setting for bootstrap/train_node.sh to export (horovodrun passes
the launcher's environment to every rank), and the reason on stderr; nothing on stdout where no
cache applies. It never fails a node: a missing cache costs start-up time, not the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from bootstrap.cli import OneLineErrorParser
from bootstrap.image.manifest import DEFAULT_PATH, ImageError, load

# (compute capability, driver version) of the node's first GPU, or None without one.
GpuQuery = Callable[[], tuple[str, str] | None]


def query_gpu() -> tuple[str, str] | None:
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = output.strip().splitlines()[:1]
    fields = [field.strip() for field in first[0].split(",")] if first else []
    return (fields[0], fields[1]) if len(fields) == 2 else None


def settings(
    document: Mapping, gpu: GpuQuery, environ: Mapping[str, str]
) -> tuple[dict[str, str], str]:
    """The variables to export and the one line that says why (or why not)."""
    record = document.get("jit_cache") or {}
    xla = record.get("xla") or {}
    if not record.get("warmed"):
        return {}, "this image has no JIT cache (baked without -c imageJitInstanceType)"
    if not record.get("baked") and not xla.get("baked"):
        return {}, (
            f"the JIT proof on {record.get('instance_type')} found no faster start "
            f"(cold {record.get('cold_s')} s, warm {record.get('warm_s')} s): nothing was baked"
        )
    found = gpu()
    if found is None:
        return {}, "nvidia-smi does not answer: the JIT cache is not used"
    capability, driver = found
    if capability != record.get("compute_capability"):
        return {}, (
            f"the JIT cache is for compute capability {record.get('compute_capability')}; "
            f"this node's GPUs are {capability} and need none"
        )
    if driver != record.get("nvidia_driver"):
        return {}, (
            f"the JIT cache was warmed with driver {record.get('nvidia_driver')}, this node runs "
            f"{driver}: not used"
        )
    exported = {}
    if record.get("baked"):
        exported["CUDA_CACHE_PATH"] = str(record["path"])
        exported["CUDA_CACHE_MAXSIZE"] = str(record["maxsize_bytes"])
    if xla.get("baked"):
        flag = f"--tf_xla_persistent_cache_directory={xla['path']}"
        exported["TF_XLA_FLAGS"] = " ".join(filter(None, [environ.get("TF_XLA_FLAGS"), flag]))
    return exported, (
        f"JIT caches warmed on {record.get('instance_type')} for compute capability {capability}, "
        f"driver {driver} (start cold {record.get('cold_s')} s, warm {record.get('warm_s')} s): "
        f"{', '.join(exported)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python3 -m bootstrap.image.jit_env")
    parser.add_argument(
        "--image-json", type=Path, default=Path(DEFAULT_PATH), help="the image's record"
    )
    args = parser.parse_args(argv)
    try:
        exported, reason = settings(load(args.image_json), query_gpu, os.environ)
    except ImageError as exc:
        exported, reason = {}, f"no JIT cache: {exc}"
    print(reason, file=sys.stderr)
    for key, value in exported.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
