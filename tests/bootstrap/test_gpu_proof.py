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


# lsmod's form: a header, then a module a line with its size, use count and users. The users
# are made up; the proof reads only the names.
LSMOD = """Module                  Size  Used by
efa_nv_peermem         16384  0
nvidia_uvm           2113536  0
nvidia              14368768  2 nvidia_uvm,efa_nv_peermem
"""


def stub_modules(tmp_path: Path, lsmod: str, modprobe_exit: int, modprobe_says: str) -> Tools:
    """lsmod and modprobe as stubs; modprobe records its arguments in modprobe.log."""
    (tmp_path / "lsmod.out").write_text(lsmod)
    lsmod_stub = tmp_path / "lsmod"
    lsmod_stub.write_text(f"#!/bin/sh\ncat '{tmp_path}/lsmod.out'\n")
    modprobe = tmp_path / "modprobe"
    modprobe.write_text(
        f"#!/bin/sh\necho \"$*\" >>'{tmp_path}/modprobe.log'\n"
        f"echo '{modprobe_says}' >&2\nexit {modprobe_exit}\n"
    )
    for stub in (lsmod_stub, modprobe):
        stub.chmod(0o755)
    tools = stub_nvidia_smi(tmp_path, ["NVIDIA A10G"])
    return Tools(**{**tools.__dict__, "lsmod": str(lsmod_stub), "modprobe": str(modprobe)})


def test_efa_nv_peermem_loaded_after_boot_beside_nvidia_passes(tmp_path):
    tools = stub_modules(tmp_path, LSMOD, 0, "")
    proof.efa_nv_peermem_loaded(tools)
    assert not (tmp_path / "modprobe.log").exists()


def test_without_efa_nv_peermem_the_proof_fails_with_modprobes_reason(tmp_path):
    absent = "".join(line for line in LSMOD.splitlines(True) if "efa_nv_peermem " not in line)
    says = (
        "modprobe: FATAL: Module efa_nv_peermem not found in directory /lib/modules/6.8.0-1064-aws"
    )
    tools = stub_modules(tmp_path, absent, 1, says)
    # The whole proof stops there, right after nvidia-smi, before TensorFlow runs.
    with pytest.raises(ProofError) as error:
        proof.prove(tools, gpus=1, efa=False, steps=200, batch=256, precision="fp16", xla="on")
    assert str(error.value) == (
        "efa_nv_peermem is not loaded beside nvidia and cannot be: modprobe efa_nv_peermem: "
        f"exit 1: {says}"
    )
    assert (tmp_path / "modprobe.log").read_text() == "efa_nv_peermem\n"


def test_efa_nv_peermem_that_loads_only_by_hand_fails_the_proof(tmp_path):
    # The fleet's nodes get no modprobe from anyone: what the boot did not load, they lack.
    absent = "".join(line for line in LSMOD.splitlines(True) if "efa_nv_peermem " not in line)
    tools = stub_modules(tmp_path, absent, 0, "")
    with pytest.raises(
        ProofError, match="was not loaded at boot, though modprobe loads it: check "
    ):
        proof.efa_nv_peermem_loaded(tools)


def test_efa_nv_peermem_without_the_nvidia_module_fails_the_proof(tmp_path):
    tools = stub_modules(tmp_path, "Module  Size  Used by\nefa_nv_peermem 16384 0\n", 0, "")
    with pytest.raises(ProofError, match=r"^lsmod lists no nvidia module$"):
        proof.efa_nv_peermem_loaded(tools)


def test_a_missing_nvidia_smi_is_named(tmp_path):
    tools = Tools(**{**CPU.__dict__, "nvidia_smi": str(tmp_path / "nvidia-smi")})
    with pytest.raises(ProofError, match=r"nvidia-smi: .*not found"):
        proof.gpus_seen_by_driver(tools, 1)


@pytest.mark.slow
def test_tensorflow_gpu_count_comes_from_tensorflow():
    assert proof.gpus_seen_by_tensorflow(CPU) == 0


@pytest.mark.slow
def test_horovod_check_build_is_read_from_the_real_horovodrun(monkeypatch):
    # The CPU build has Gloo but neither NCCL nor MPI: the proof must say so. horovodrun runs
    # once (about 20 s of CPU: it imports TensorFlow); both requirements read its output.
    outputs = []

    def run_once(*args, **kwargs):
        outputs.append(outputs[0] if outputs else real_run(*args, **kwargs))
        return outputs[-1]

    real_run = proof.run_program
    monkeypatch.setattr(proof, "run_program", run_once)
    assert proof.horovod_frameworks(CPU, ("TensorFlow", "Gloo"))["Gloo"] is True
    with pytest.raises(ProofError, match="Horovod was built without NCCL, MPI"):
        proof.horovod_frameworks(CPU, ("TensorFlow", "NCCL", "MPI", "Gloo"))
    assert len(outputs) == 2 and "Available Frameworks" in outputs[0]


@pytest.mark.slow
def test_allreduce_over_every_rank_gives_the_right_sum():
    summary, log = proof.allreduce(CPU, 3)
    assert summary == "allreduce probe: 3 ranks on 0 GPU(s), sum 6, expected 6, 0 wrong element(s)"
    assert "allreduce probe:" in log


def test_a_wrong_sum_fails_the_proof(tmp_path, monkeypatch):
    def wrong(argv, tools, timeout, what, **env):
        return "[1,0]<stdout>:allreduce probe: 2 ranks on 2 GPU(s), sum 2, expected 3, 9 wrong element(s)"

    monkeypatch.setattr(proof, "run_program", wrong)
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
