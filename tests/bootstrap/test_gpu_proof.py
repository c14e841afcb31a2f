"""bootstrap/image_proof/proof.py, the training image's GPU proof, run here on CPU where it can
be: the allreduce over Gloo with real Horovod ranks, the trainer's synthetic steps, Horovod's
real --check-build, the NCCL plugin check on log excerpts from public issues; nvidia-smi is a
stub."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.image_proof import proof
from bootstrap.image_proof.proof import ProofError, Tools

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CPU = Tools(
    python=sys.executable,
    horovodrun=str(BIN / "horovodrun"),
    code_root=str(ROOT),
    controller="--gloo",
    env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
)

# NCCL_DEBUG=INFO excerpts. Plugin in use: aws/aws-ofi-nccl#715 and NVIDIA/nccl#1597.
OFI_LOG = """ip-10-0-0-1:1:1 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.11.0-aws
ip-10-0-0-1:1:1 [0] NCCL INFO NET/OFI Using CUDA driver version 12040
ip-10-0-0-1:1:1 [0] NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)
ip-10-0-0-1:1:1 [0] NCCL INFO Using network Libfabric
"""
# Fallback to sockets: NVIDIA/nccl#1126.
SOCKET_LOG = """host:1:1 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
host:1:1 [0] NCCL INFO NET/IB : No device found.
host:1:1 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
host:1:1 [0] NCCL INFO Using network Socket
"""


def stub_nvidia_smi(tmp_path: Path, names: list[str]) -> Tools:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{name}'\n" for name in names))
    script.chmod(0o755)
    return Tools(**{**CPU.__dict__, "nvidia_smi": str(script)})


def test_driver_must_see_every_gpu_of_the_type(tmp_path):
    tools = stub_nvidia_smi(tmp_path, ["Tesla V100-SXM2-16GB"])
    assert proof.gpus_seen_by_driver(tools, 1) == ["Tesla V100-SXM2-16GB"]
    with pytest.raises(ProofError, match="nvidia-smi sees 1 GPU\\(s\\), the instance has 4"):
        proof.gpus_seen_by_driver(tools, 4)


def test_a_missing_nvidia_smi_is_named(tmp_path):
    tools = Tools(**{**CPU.__dict__, "nvidia_smi": str(tmp_path / "nvidia-smi")})
    with pytest.raises(ProofError, match=r"nvidia-smi: .*not found"):
        proof.gpus_seen_by_driver(tools, 1)


@pytest.mark.slow
def test_tensorflow_gpu_count_comes_from_tensorflow():
    assert proof.gpus_seen_by_tensorflow(CPU) == 0


@pytest.mark.slow
def test_horovod_check_build_is_read_from_the_real_horovodrun():
    # The CPU build has Gloo but neither NCCL nor MPI: the proof must say so.
    assert proof.horovod_frameworks(CPU, ("TensorFlow", "Gloo"))["Gloo"] is True
    with pytest.raises(ProofError, match="Horovod was built without NCCL, MPI"):
        proof.horovod_frameworks(CPU, ("TensorFlow", "NCCL", "MPI", "Gloo"))


@pytest.mark.slow
def test_allreduce_over_every_rank_gives_the_right_sum():
    summary, log = proof.allreduce(CPU, 3)
    assert summary == "allreduce probe: 3 ranks on 0 GPU(s), sum 6, expected 6, 0 wrong element(s)"
    assert "allreduce probe:" in log


def test_a_wrong_sum_fails_the_proof(tmp_path, monkeypatch):
    def wrong(argv, tools, timeout, what, **env):
        return "[1,0]<stdout>:allreduce probe: 2 ranks on 2 GPU(s), sum 2, expected 3, 9 wrong element(s)"

    monkeypatch.setattr(proof, "_run", wrong)
    with pytest.raises(ProofError, match=r"allreduce: allreduce probe: .* 9 wrong element"):
        proof.allreduce(CPU, 2)


def test_nccl_using_the_plugin_passes():
    assert proof.net_plugin(OFI_LOG, efa=True) == "loaded; NCCL network Libfabric"
    old_name = OFI_LOG.replace("Using network Libfabric", "Using network AWS Libfabric")
    assert proof.net_plugin(old_name, efa=True) == "loaded; NCCL network AWS Libfabric"


def test_without_efa_a_loaded_plugin_may_fall_back_to_sockets():
    # aws-ofi-nccl loads, finds no efa provider, and NCCL uses its sockets (a g5.xlarge).
    fallback = OFI_LOG.splitlines()[0] + "\n" + SOCKET_LOG.splitlines()[-1] + "\n"
    assert proof.net_plugin(fallback, efa=False) == "loaded; NCCL network Socket"
    with pytest.raises(ProofError, match="has EFA but NCCL used Socket, not Libfabric"):
        proof.net_plugin(fallback, efa=True)


def test_nccl_without_the_plugin_fails_the_proof():
    with pytest.raises(ProofError, match="did not load the aws-ofi-nccl plugin"):
        proof.net_plugin(SOCKET_LOG, efa=False)


def test_a_log_without_nccl_fails_the_proof():
    with pytest.raises(ProofError, match="NCCL named no network"):
        proof.net_plugin("allreduce probe: 1 ranks\n", efa=False)


@pytest.mark.slow
def test_benchmark_runs_the_trainers_synthetic_steps_and_reads_its_rate():
    record = proof.benchmark(CPU, steps=3, batch=2, precision="fp32", xla="off")
    assert record["images_per_s"] > 0
    assert record["epochs"] == 1


def test_the_proof_is_recorded_in_image_json_and_becomes_ami_tags(tmp_path):
    image_json = tmp_path / "image.json"
    image_json.write_text(json.dumps({"format": "horovod-fleet/image/1", "versions": {}}))
    with pytest.raises(ProofError, match="no passed GPU proof"):
        proof.ami_tags(image_json)
    record = {"passed": True, "gpu_name": "Tesla V100-SXM2-16GB", "resnet50_images_per_s": 1301.4}
    proof.record_proof(image_json, record, "g5.xlarge")
    assert json.loads(image_json.read_text())["format"] == "horovod-fleet/image/1"
    assert proof.ami_tags(image_json) == {
        "horovod-fleet:proof": "passed",
        "horovod-fleet:proof-instance-type": "g5.xlarge",
        "horovod-fleet:proof-resnet50-img-per-s": "1301",
        "horovod-fleet:proof-gpu": "Tesla V100-SXM2-16GB",
    }


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bootstrap.image_proof.proof", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_proof_refuses_fewer_than_200_steps():
    result = run_cli("run", "--gpus", "1", "--instance-type", "g5.xlarge", "--steps", "50")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: GPU proof failed: --steps 50: the proof runs at least 200"
    )


def test_validate_fails_in_one_line_without_a_proof(tmp_path):
    image_json = tmp_path / "image.json"
    image_json.write_text("{}")
    result = run_cli("validate", "--image-json", str(image_json))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: GPU proof failed: {image_json} has no passed GPU proof"
