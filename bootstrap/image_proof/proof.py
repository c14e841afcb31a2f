"""The training image's GPU proof: on one GPU instance booted from the freshly baked image, before
any fleet may use it, check that the driver, efa_nv_peermem, TensorFlow, Horovod, NCCL and the EFA
plugin work together, and measure ResNet-50 on one GPU with the project's own trainer.

    python3 -m bootstrap.image_proof.proof run --gpus 1 --image-json /opt/horovod-fleet/image.json
    python3 -m bootstrap.image_proof.proof validate --image-json /opt/horovod-fleet/image.json

`run` records what it measured in image.json's `proof` object and fails (exit 1, one line naming
the check) at the first check that does not hold, so Image Builder marks the image failed and no
fleet can boot from it. Every check runs the real program it proves (nvidia-smi, lsmod,
TensorFlow, horovodrun, the trainer) as a process; the tests run the same code on CPU with Gloo.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.cli import OneLineErrorParser
from bootstrap.image.manifest import ImageError, horovod_build, load

BENCHMARK_STEPS = 200
BENCHMARK_BATCH = 256  # the fleet's default batch per GPU (cdk.json batchPerGpu)
# aws-ofi-nccl announces itself when NCCL loads it ("NET/OFI Initializing aws-ofi-nccl 1.18.0"),
# before it looks for the efa provider; NCCL then names the network it chose for the
# communicator, for every communicator, one rank included ("Using network Libfabric", "AWS
# Libfabric" before plugin 1.13, or "Socket" when the plugin found no EFA and NCCL fell back).
#   https://github.com/aws/aws-ofi-nccl/issues/715   https://github.com/NVIDIA/nccl/issues/1597
#   NCCL v2.23.4-1 src/init.cc: INFO(NCCL_INIT, "Using network %s", ...)
_PLUGIN_LOADED = re.compile(
    r"NET/OFI (Initializing|Using) aws-ofi-nccl|NET/Plugin: Loaded net plugin"
)
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$", re.MULTILINE)


EFA_LIBRARY_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib")
# Where the recipe's step 3 (bootstrap/image/03-efa.sh) has efa_nv_peermem loaded at boot.
PEERMEM_CONF = "/etc/modules-load.d/horovod-fleet-gpudirect.conf"


class ProofError(RuntimeError):
    """A check of the GPU proof failed; str() names the check and what was seen."""


@dataclass(frozen=True)
class Tools:
    """The programs the proof runs, so tests can point them at a CPU venv."""

    python: str = "/opt/horovod-fleet/venv/bin/python"
    horovodrun: str = "/opt/horovod-fleet/venv/bin/horovodrun"
    nvidia_smi: str = "nvidia-smi"
    lsmod: str = "lsmod"
    modprobe: str = "modprobe"
    code_root: str = "/opt/horovod-fleet/src"
    controller: str = "--mpi"
    env: Mapping[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        path = f"{Path(self.horovodrun).parent}:/opt/amazon/openmpi/bin:{os.environ['PATH']}"
        # What train_node.sh gives the fleet's ranks: EFA's libfabric, Open MPI, aws-ofi-nccl.
        libraries = ":".join(
            [*EFA_LIBRARY_DIRS, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        )
        return {
            **os.environ,
            "PATH": path,
            "LD_LIBRARY_PATH": libraries,
            "PYTHONPATH": self.code_root,
            "TF_CPP_MIN_LOG_LEVEL": "1",
            **self.env,
        }


def run_program(argv: Sequence[str], tools: Tools, timeout: float, what: str, **env: str) -> str:
    try:
        result = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**tools.environment(), **env},
        )
    except FileNotFoundError:
        raise ProofError(f"{what}: {argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise ProofError(f"{what}: no result within {timeout:.0f} s") from None
    output = result.stdout + result.stderr
    if result.returncode != 0:
        errors = [line for line in output.splitlines() if "error" in line.lower()]
        detail = errors[-1] if errors else (output.strip().splitlines() or ["no output"])[-1]
        raise ProofError(f"{what}: exit {result.returncode}: {' '.join(detail.split())[:300]}")
    return output


def gpus_seen_by_driver(tools: Tools, expected: int) -> list[str]:
    names = run_program(
        [tools.nvidia_smi, "--query-gpu=name", "--format=csv,noheader"],
        tools,
        120,
        "nvidia-smi",
    ).split("\n")
    names = [name.strip() for name in names if name.strip()]
    if len(names) != expected:
        raise ProofError(f"nvidia-smi sees {len(names)} GPU(s), the instance has {expected}")
    return names


def efa_nv_peermem_loaded(tools: Tools) -> None:
    """efa_nv_peermem in lsmod after boot, beside the nvidia module: the module GPUDirect RDMA over
    EFA goes through on p4d and p5 (bootstrap/image/03-efa.sh says why). The proof's g5.xlarge has
    no EFA device, and needs none for this: the EFA driver takes the module's nvidia_p2p wrappers
    with symbol_get and asks for it with request_module (efa_nvmem_impl.h in
    https://github.com/amzn/amzn-drivers/tree/master/kernel/linux/efa), so the module serves the
    driver, not the device. Its own source is in no public repository (the EFA installer carries
    it), so that it loads without an EFA device is what this check proves. When it is missing,
    modprobe tells a module that cannot load (its error) from one the boot did not load."""
    listed = run_program([tools.lsmod], tools, 60, "lsmod").splitlines()[1:]
    modules = {line.split()[0] for line in listed if line.strip()}
    if "nvidia" not in modules:
        raise ProofError("lsmod lists no nvidia module")
    if "efa_nv_peermem" in modules:
        return
    try:
        run_program([tools.modprobe, "efa_nv_peermem"], tools, 120, "modprobe efa_nv_peermem")
    except ProofError as exc:
        raise ProofError(
            f"efa_nv_peermem is not loaded beside nvidia and cannot be: {exc}"
        ) from None
    raise ProofError(
        f"efa_nv_peermem was not loaded at boot, though modprobe loads it: check {PEERMEM_CONF} "
        "and systemd-modules-load"
    )


def gpus_seen_by_tensorflow(tools: Tools) -> int:
    output = run_program(
        [
            tools.python,
            "-c",
            "import tensorflow as tf; print('gpus', len(tf.config.list_physical_devices('GPU')))",
        ],
        tools,
        600,
        "TensorFlow",
    )
    match = re.search(r"^gpus (\d+)$", output, re.MULTILINE)
    if not match:
        raise ProofError(f"TensorFlow printed no GPU count: {output.strip()[-200:]}")
    return int(match.group(1))


def horovod_frameworks(tools: Tools, required: Sequence[str]) -> dict[str, bool]:
    built = horovod_build(
        run_program([tools.horovodrun, "--check-build"], tools, 300, "horovodrun")
    )
    missing = [name for name in required if not built.get(name)]
    if missing:
        raise ProofError(f"Horovod was built without {', '.join(missing)}")
    return built


def allreduce(tools: Tools, ranks: int) -> tuple[str, str]:
    """horovodrun over every GPU of the instance; returns the probe's line and the full log."""
    argv = [
        tools.horovodrun,
        tools.controller,
        "-np",
        str(ranks),
        "-H",
        f"localhost:{ranks}",
        tools.python,
        "-m",
        "bootstrap.image_proof.allreduce_probe",
    ]
    output = run_program(
        argv, tools, 900, "allreduce", NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,ENV"
    )
    line = next((x for x in output.splitlines() if "allreduce probe:" in x), None)
    if line is None:
        raise ProofError("allreduce: the probe printed no result")
    summary = line[line.index("allreduce probe:") :]
    if not summary.endswith(" 0 wrong element(s)"):
        raise ProofError(f"allreduce: {summary}")
    return summary, output


def net_plugin(nccl_log: str, efa: bool) -> str:
    """NCCL must load the EFA installer's aws-ofi-nccl; on an instance with EFA it must also use
    it. Without EFA the plugin finds no provider and NCCL falls back to its sockets, which is all
    the check can ask there (the fleet's own allreduce check asks for Libfabric across nodes)."""
    networks = sorted(set(_NETWORK.findall(nccl_log)))
    if not networks:
        raise ProofError("NCCL named no network (no 'Using network' line with NCCL_DEBUG=INFO)")
    if not _PLUGIN_LOADED.search(nccl_log):
        raise ProofError(
            f"NCCL did not load the aws-ofi-nccl plugin (network {', '.join(networks)}): check "
            "LD_LIBRARY_PATH and /opt/amazon/ofi-nccl"
        )
    uses_libfabric = all(network.endswith("Libfabric") for network in networks)
    if efa and not uses_libfabric:
        raise ProofError(
            f"this instance has EFA but NCCL used {', '.join(networks)}, not Libfabric"
        )
    return f"loaded; NCCL network {', '.join(networks)}"


def benchmark(tools: Tools, steps: int, batch: int, precision: str, xla: str) -> dict:
    """The trainer's synthetic ResNet-50 on one GPU; returns its train.json figures."""
    with tempfile.TemporaryDirectory(prefix="gpu-proof-") as model_dir:
        argv = [
            tools.python,
            "-m",
            "trainer.train",
            "--synthetic",
            "--model-dir",
            model_dir,
            "--epochs",
            "1",
            "--steps-per-epoch",
            str(steps),
            "--batch-size",
            str(batch),
            "--precision",
            precision,
            "--xla",
            xla,
            "--log-every",
            str(max(1, steps // 4)),
        ]
        run_program(argv, tools, 3600, "ResNet-50 benchmark")
        record = json.loads(Path(model_dir, "train.json").read_text())
    images_per_s = record.get("images_per_s")
    if not images_per_s or images_per_s <= 0:
        raise ProofError(f"ResNet-50 benchmark: no throughput in train.json ({record})")
    return record


def prove(
    tools: Tools, *, gpus: int, efa: bool, steps: int, batch: int, precision: str, xla: str
) -> dict:
    """Every check in order; the first that fails raises ProofError."""
    started = time.time()
    names = gpus_seen_by_driver(tools, gpus)
    print(f"proof: nvidia-smi sees {gpus} GPU(s): {', '.join(sorted(set(names)))}", flush=True)
    efa_nv_peermem_loaded(tools)
    print("proof: efa_nv_peermem loaded beside nvidia", flush=True)
    seen = gpus_seen_by_tensorflow(tools)
    if seen != gpus:
        raise ProofError(f"TensorFlow sees {seen} GPU(s), nvidia-smi {gpus}")
    print(f"proof: TensorFlow sees {seen} GPU(s)", flush=True)
    built = horovod_frameworks(tools, ("TensorFlow", "NCCL", "MPI", "Gloo"))
    print(f"proof: Horovod built with {', '.join(n for n, ok in built.items() if ok)}", flush=True)
    summary, nccl_log = allreduce(tools, gpus)
    print(f"proof: {summary}", flush=True)
    plugin = net_plugin(nccl_log, efa)
    print(f"proof: aws-ofi-nccl {plugin}", flush=True)
    record = benchmark(tools, steps, batch, precision, xla)
    print(
        f"proof: ResNet-50 {precision} XLA {xla}, batch {batch}, {steps} steps: "
        f"{record['images_per_s']:.1f} img/s",
        flush=True,
    )
    return {
        "passed": True,
        "gpus": gpus,
        "gpu_name": names[0],
        "efa_nv_peermem_loaded": True,
        "allreduce": summary,
        "nccl_net_plugin": plugin,
        "resnet50_images_per_s": record["images_per_s"],
        "benchmark": {"steps": steps, "batch": batch, "precision": precision, "xla": xla},
        "duration_s": round(time.time() - started, 1),
        "proved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def record_proof(image_json: Path, proof: Mapping, instance_type: str) -> None:
    document = load(image_json)
    document["proof"] = {**proof, "instance_type": instance_type}
    image_json.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def ami_tags(image_json: Path) -> dict[str, str]:
    """The proof's figures as AMI tags (the stage that tags runs on the finished AMI), and the JIT
    proof's when it ran (its stage makes a new AMI, which needs the proof's tags again)."""
    proof = load(image_json).get("proof") or {}
    if not proof.get("passed"):
        raise ProofError(f"{image_json} has no passed GPU proof")
    tags = {
        "horovod-fleet:proof": "passed",
        "horovod-fleet:proof-instance-type": str(proof["instance_type"]),
        "horovod-fleet:proof-resnet50-img-per-s": f"{proof['resnet50_images_per_s']:.0f}",
        "horovod-fleet:proof-gpu": str(proof["gpu_name"]),
    }
    jit = load(image_json).get("jit_cache") or {}
    if jit.get("warmed"):
        tags |= {
            "horovod-fleet:jit-cache": "baked" if jit.get("baked") else "not-baked",
            "horovod-fleet:jit-instance-type": str(jit.get("instance_type")),
            "horovod-fleet:jit-cold-s": f"{jit.get('cold_s')}",
            "horovod-fleet:jit-warm-s": f"{jit.get('warm_s')}",
        }
    return tags


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python3 -m bootstrap.image_proof.proof")
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser("run", help="run every check and record the proof")
    run_cmd.add_argument("--gpus", type=int, required=True, help="GPUs the instance type has")
    run_cmd.add_argument("--instance-type", required=True, help="the instance's type")
    run_cmd.add_argument("--efa", action="store_true", help="the type has EFA: NCCL must use it")
    run_cmd.add_argument(
        "--steps", type=int, default=BENCHMARK_STEPS, help="timed training steps, at least this"
    )
    run_cmd.add_argument("--batch", type=int, default=BENCHMARK_BATCH, help="images per GPU")
    run_cmd.add_argument("--precision", default="fp16", help="the trainer's --precision")
    run_cmd.add_argument("--xla", default="on", help="the trainer's --xla")
    for command in (run_cmd, commands.add_parser("validate"), commands.add_parser("tags")):
        command.add_argument(
            "--image-json",
            type=Path,
            default=Path("/opt/horovod-fleet/image.json"),
            help="the image's record",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            if args.steps < BENCHMARK_STEPS:
                raise ProofError(f"--steps {args.steps}: the proof runs at least {BENCHMARK_STEPS}")
            proof = prove(
                Tools(),
                gpus=args.gpus,
                efa=args.efa,
                steps=args.steps,
                batch=args.batch,
                precision=args.precision,
                xla=args.xla,
            )
            record_proof(args.image_json, proof, args.instance_type)
            print(f"proof: passed, recorded in {args.image_json}", flush=True)
        elif args.command == "validate":
            ami_tags(args.image_json)
            print(f"proof: {args.image_json} holds a passed GPU proof")
        else:
            for key, value in ami_tags(args.image_json).items():
                print(f"Key={key},Value={value}")
    except (ProofError, ImageError) as exc:
        print(f"error: GPU proof failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
