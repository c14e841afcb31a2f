"""The training image's JIT proof (ImageStack's optional third stage, -c imageJitInstanceType): on one
H100 or H200 instance, start the trainer's ResNet-50 three times and keep in the image the caches
that made a start measurably faster.

TensorFlow 2.15.1's wheel holds GPU code up to compute_80 (its build_info.py:
cuda_compute_capabilities sm_50, sm_60, sm_70, sm_75, compute_80), so on sm_90 the driver
JIT-compiles TensorFlow's kernels from compute_80 PTX at every first start, on every new node and
relaunch ("could take 30 minutes or longer", https://github.com/tensorflow/tensorflow/issues/62320).
The driver keeps what it compiled in CUDA_CACHE_PATH (at most CUDA_CACHE_MAXSIZE bytes), "valid
until a CUDA driver upgrade", and the cache "can be shared between machines"
(https://docs.nvidia.com/cuvs/developer-guide/advanced-topics/jit-compilation,
https://developer.nvidia.com/blog/cuda-pro-tip-understand-fat-binaries-jit-caching/). XLA's own
compilations are kept by TensorFlow's persistent XLA cache (TF_XLA_FLAGS
--tf_xla_persistent_cache_directory, a flag of TensorFlow 2.15.1's libtensorflow_cc: "JIT-compiled
executables are saved to and loaded from the specified file system directory path").

The starts: cold (both caches empty), warm-CUDA (the CUDA cache the cold start filled; XLA compiles
again) and warm (both caches). The CUDA cache is kept when warm-CUDA beats cold, the XLA cache when
warm beats warm-CUDA, each by MIN_SAVING; a cache lives at a path named by the driver version, so a
node on another driver never reads it. Everything goes into image.json `jit_cache`.

    python3 -m bootstrap.image_proof.jit_cache run --gpus 1 --instance-type p5.4xlarge --image-json J
    python3 -m bootstrap.image_proof.jit_cache validate --image-json J
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bootstrap.cli import OneLineErrorParser
from bootstrap.image.manifest import ImageError, load
from bootstrap.image_proof.proof import BENCHMARK_BATCH, ProofError, Tools, benchmark, run_program

CACHE_ROOT = Path("/opt/horovod-fleet/cuda-cache")
XLA_CACHE_ROOT = Path("/opt/horovod-fleet/xla-cache")
# CUDA_CACHE_MAXSIZE's maximum, 4 GiB, as NVIDIA's environment variable reference gives it
# (https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html):
# a cache that overflows evicts older kernels, and the warm start shows it.
CACHE_MAXSIZE = 4 * 1024**3
JIT_STEPS = 50  # enough steps to load every kernel a training step uses
JIT_CAPABILITY = "9.0"  # H100 and H200
MIN_SAVING = 0.1  # a warm start at least 10% faster, beyond run-to-run noise


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    driver: str


def gpu(tools: Tools, expected: int) -> Gpu:
    """The instance's GPUs as nvidia-smi sees them; the proof is for compute capability 9.0."""
    rows = run_program(
        [
            tools.nvidia_smi,
            "--query-gpu=name,compute_cap,driver_version",
            "--format=csv,noheader",
        ],
        tools,
        120,
        "nvidia-smi",
    ).splitlines()
    found = [Gpu(*(field.strip() for field in row.split(","))) for row in rows if row.strip()]
    if len(found) != expected:
        raise ProofError(f"nvidia-smi sees {len(found)} GPU(s), the instance has {expected}")
    if found[0].compute_capability != JIT_CAPABILITY:
        raise ProofError(
            f"the JIT proof warms the cache of compute capability {JIT_CAPABILITY} (H100, H200); "
            f"{found[0].name} is {found[0].compute_capability}"
        )
    return found[0]


def size_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def faster(warm_s: float, cold_s: float) -> bool:
    return warm_s <= cold_s * (1 - MIN_SAVING)


Start = Callable[[Mapping[str, str]], float]


def timed_start(tools: Tools, steps: int, batch: int) -> Start:
    """One start of the trainer's ResNet-50 (fp16, XLA, as the fleet trains) with extra
    environment; returns its wall time in seconds, process start to exit."""

    def start(env: Mapping[str, str]) -> float:
        began = time.monotonic()
        benchmark(dataclasses.replace(tools, env={**tools.env, **env}), steps, batch, "fp16", "on")
        return round(time.monotonic() - began, 1)

    return start


def warm(start: Start, driver: str, cache_root: Path, xla_root: Path) -> dict:
    """The three starts and what is kept; returns image.json's `jit_cache` without the GPU."""
    cache, xla = cache_root / driver, xla_root / driver
    for directory in (cache, xla):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    cuda_env = {
        "CUDA_CACHE_PATH": str(cache),
        "CUDA_CACHE_MAXSIZE": str(CACHE_MAXSIZE),
        "CUDA_CACHE_DISABLE": "0",
    }
    xla_env = {"TF_XLA_FLAGS": f"--tf_xla_persistent_cache_directory={xla}"}
    cold_s = start(cuda_env | xla_env)
    warm_cuda_s = start(cuda_env)
    warm_s = start(cuda_env | xla_env)
    cuda_size, xla_size = size_bytes(cache), size_bytes(xla)
    cuda_baked = cuda_size > 0 and faster(warm_cuda_s, cold_s)
    xla_baked = xla_size > 0 and faster(warm_s, warm_cuda_s)
    for directory, baked in ((cache, cuda_baked), (xla, xla_baked)):
        if not baked:
            shutil.rmtree(directory)
    return {
        "warmed": True,
        "cold_s": cold_s,
        "warm_s": warm_cuda_s,
        "size_bytes": cuda_size,
        "maxsize_bytes": CACHE_MAXSIZE,
        "baked": cuda_baked,
        "path": str(cache) if cuda_baked else None,
        "xla": {
            "warm_s": warm_s,
            "size_bytes": xla_size,
            "baked": xla_baked,
            "path": str(xla) if xla_baked else None,
        },
    }


def prove(tools: Tools, *, gpus: int, steps: int, batch: int) -> dict:
    found = gpu(tools, gpus)
    print(
        f"jit: {found.name}, compute capability {found.compute_capability}, driver {found.driver}",
        flush=True,
    )
    record = warm(timed_start(tools, steps, batch), found.driver, CACHE_ROOT, XLA_CACHE_ROOT)
    print(
        f"jit: ResNet-50 start cold {record['cold_s']} s, with the CUDA cache "
        f"{record['warm_s']} s ({record['size_bytes']} bytes, "
        f"{'baked' if record['baked'] else 'not baked'}), with the XLA cache too "
        f"{record['xla']['warm_s']} s ({'baked' if record['xla']['baked'] else 'not baked'})",
        flush=True,
    )
    return record | {
        "gpu_name": found.name,
        "compute_capability": found.compute_capability,
        "nvidia_driver": found.driver,
        "benchmark": {"steps": steps, "batch": batch, "precision": "fp16", "xla": "on"},
        "warmed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def record_jit(image_json: Path, record: Mapping, instance_type: str) -> None:
    document = load(image_json)
    document["jit_cache"] = {**record, "instance_type": instance_type}
    image_json.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def validate(image_json: Path) -> str:
    """image.json holds a JIT proof, and every cache it says was baked is in the image."""
    record = load(image_json).get("jit_cache") or {}
    if not record.get("warmed"):
        raise ProofError(f"{image_json} records no JIT proof")
    for name, entry in (("CUDA JIT", record), ("XLA", record.get("xla") or {})):
        if not entry.get("baked"):
            continue
        path = Path(str(entry.get("path")))
        if path.name != record.get("nvidia_driver"):
            raise ProofError(
                f"the {name} cache {path} is not named by the driver {record.get('nvidia_driver')}"
            )
        if not path.is_dir() or not any(path.iterdir()):
            raise ProofError(f"image.json says the {name} cache was baked, but {path} is empty")
    return (
        f"JIT proof on {record.get('instance_type')}: cold {record.get('cold_s')} s, warm "
        f"{record.get('warm_s')} s, CUDA cache {'baked' if record.get('baked') else 'not baked'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python3 -m bootstrap.image_proof.jit_cache")
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser("run", help="start ResNet-50 cold and warm, keep what helps")
    run_cmd.add_argument("--gpus", type=int, required=True, help="GPUs the instance type has")
    run_cmd.add_argument("--instance-type", required=True, help="the instance's type")
    run_cmd.add_argument(
        "--steps", type=int, default=JIT_STEPS, help="training steps of each start"
    )
    run_cmd.add_argument("--batch", type=int, default=BENCHMARK_BATCH, help="images per GPU")
    for command in (run_cmd, commands.add_parser("validate")):
        command.add_argument(
            "--image-json",
            type=Path,
            default=Path("/opt/horovod-fleet/image.json"),
            help="the image's record",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            record = prove(Tools(), gpus=args.gpus, steps=args.steps, batch=args.batch)
            record_jit(args.image_json, record, args.instance_type)
            print(f"jit: recorded in {args.image_json}", flush=True)
        else:
            print(f"jit: {validate(args.image_json)}")
    except (ProofError, ImageError) as exc:
        print(f"error: JIT proof failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
