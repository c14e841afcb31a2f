"""bootstrap/image/jit_env.py, a training node's use of the JIT caches its image baked: exported
where the node's GPUs are of the cache's compute capability (H100, H200) and run its driver,
nothing elsewhere; and the lines train_node.sh's loop exports, from the command with a stub
nvidia-smi first on PATH."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from bootstrap.image.jit_env import settings

ROOT = Path(__file__).resolve().parents[2]
BAKED = {
    "warmed": True,
    "instance_type": "p5.4xlarge",
    "compute_capability": "9.0",
    "nvidia_driver": "580.95.05",
    "cold_s": 900.0,
    "warm_s": 120.0,
    "baked": True,
    "path": "/opt/horovod-fleet/cuda-cache/580.95.05",
    "maxsize_bytes": 4294967296,
    "xla": {"baked": False, "path": None},
}
H100 = ("9.0", "580.95.05")


def exported(record: dict | None, gpu=H100, environ=None) -> dict:
    document = {} if record is None else {"jit_cache": record}
    return settings(document, lambda: gpu, environ or {})[0]


def test_a_p5_class_node_on_the_bakes_driver_exports_the_cuda_cache():
    assert exported(BAKED) == {
        "CUDA_CACHE_PATH": "/opt/horovod-fleet/cuda-cache/580.95.05",
        "CUDA_CACHE_MAXSIZE": "4294967296",
    }


def test_the_xla_cache_joins_the_flags_the_node_already_has():
    record = BAKED | {"xla": {"baked": True, "path": "/opt/horovod-fleet/xla-cache/580.95.05"}}
    flags = exported(record, environ={"TF_XLA_FLAGS": "--tf_xla_auto_jit=2"})["TF_XLA_FLAGS"]
    assert flags == (
        "--tf_xla_auto_jit=2 --tf_xla_persistent_cache_directory=/opt/horovod-fleet/xla-cache/580.95.05"
    )


@pytest.mark.parametrize(
    ("record", "gpu", "reason"),
    [
        (None, H100, "this image has no JIT cache"),
        ({"warmed": False}, H100, "this image has no JIT cache"),
        (BAKED | {"baked": False}, H100, "found no faster start (cold 900.0 s, warm 120.0 s)"),
        (BAKED, ("8.0", "580.95.05"), "this node's GPUs are 8.0 and need none"),
        (BAKED, ("9.0", "580.105.08"), "warmed with driver 580.95.05, this node runs 580.105.08"),
        (BAKED, None, "nvidia-smi does not answer"),
    ],
    ids=["old-image", "no-jit-proof", "not-faster", "p4d", "other-driver", "no-gpu"],
)
def test_nothing_is_exported_where_the_cache_does_not_apply(record, gpu, reason):
    document = {} if record is None else {"jit_cache": record}
    found, why = settings(document, lambda: gpu, {})
    assert found == {} and reason in why


def test_the_command_prints_the_lines_train_node_exports(tmp_path):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    smi = stubs / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '9.0, 580.95.05'\necho '9.0, 580.95.05'\n")
    smi.chmod(0o755)
    image = tmp_path / "image.json"
    image.write_text(json.dumps({"jit_cache": BAKED}))
    # train_node.sh's loop, on the command's output.
    script = (
        "set -euo pipefail\n"
        'while IFS= read -r setting; do export "${setting?}"; done < '
        f"<(python3 -m bootstrap.image.jit_env --image-json {image})\n"
        'echo "path=$CUDA_CACHE_PATH size=$CUDA_CACHE_MAXSIZE"\n'
    )
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("path=/opt/horovod-fleet/cuda-cache/580.95.05 size=4294967296")
    assert "JIT caches warmed on p5.4xlarge for compute capability 9.0" in result.stderr
