"""bootstrap/image_proof/jit_cache.py, the JIT proof of the optional third image stage: which GPU it
warms for, the three starts and what each decides, the record in image.json, its validation, and
the AMI tags. The starts are fakes that fill the cache directories as the driver and XLA would;
the real ones need an H100."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.image_proof import jit_cache, proof
from bootstrap.image_proof.jit_cache import CACHE_MAXSIZE, ProofError, Tools

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3, 9.0, 580.95.05"


def nvidia_smi(tmp_path: Path, *rows: str) -> Tools:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{row}'\n" for row in rows))
    script.chmod(0o755)
    return Tools(nvidia_smi=str(script))


def test_the_proof_warms_for_compute_capability_9_and_names_another_gpu(tmp_path):
    assert jit_cache.gpu(nvidia_smi(tmp_path, H100), 1) == jit_cache.Gpu(
        "NVIDIA H100 80GB HBM3", "9.0", "580.95.05"
    )
    with pytest.raises(ProofError, match=r"NVIDIA A10G is 8\.6"):
        jit_cache.gpu(nvidia_smi(tmp_path, "NVIDIA A10G, 8.6, 580.95.05"), 1)
    with pytest.raises(ProofError, match="nvidia-smi sees 1 GPU\\(s\\), the instance has 8"):
        jit_cache.gpu(nvidia_smi(tmp_path, H100), 8)


class FakeStarts:
    """Starts that take `seconds` in turn and, like the driver and XLA, write what they compile
    into the cache directories their environment names."""

    def __init__(self, *seconds: float) -> None:
        self.seconds = list(seconds)
        self.environments: list[dict] = []

    def __call__(self, env) -> float:
        self.environments.append(dict(env))
        cache = Path(env["CUDA_CACHE_PATH"])
        (cache / "index").write_bytes(b"k" * 1000)
        flags = env.get("TF_XLA_FLAGS", "")
        if flags:
            xla = Path(flags.split("=", 1)[1])
            (xla / "cluster_0").write_bytes(b"x" * 10)
        return self.seconds.pop(0)


def test_both_caches_are_baked_when_each_makes_the_start_faster(tmp_path):
    starts = FakeStarts(900.0, 120.0, 60.0)
    record = jit_cache.warm(starts, "580.95.05", tmp_path / "cuda", tmp_path / "xla")
    assert record == {
        "warmed": True,
        "cold_s": 900.0,
        "warm_s": 120.0,
        "size_bytes": 1000,
        "maxsize_bytes": CACHE_MAXSIZE,
        "baked": True,
        "path": str(tmp_path / "cuda/580.95.05"),
        "xla": {
            "warm_s": 60.0,
            "size_bytes": 10,
            "baked": True,
            "path": str(tmp_path / "xla/580.95.05"),
        },
    }
    cold, warm_cuda, warm = starts.environments
    assert cold["CUDA_CACHE_PATH"] == warm_cuda["CUDA_CACHE_PATH"] == warm["CUDA_CACHE_PATH"]
    assert cold["CUDA_CACHE_MAXSIZE"] == str(4 * 1024**3)
    assert "TF_XLA_FLAGS" in cold and "TF_XLA_FLAGS" not in warm_cuda and "TF_XLA_FLAGS" in warm


def test_a_cache_that_does_not_make_the_start_faster_is_not_baked(tmp_path):
    (tmp_path / "cuda/580.95.05").mkdir(parents=True)
    (tmp_path / "cuda/580.95.05/stale").write_text("from an earlier bake")
    record = jit_cache.warm(
        FakeStarts(100.0, 95.0, 94.0), "580.95.05", tmp_path / "cuda", tmp_path / "xla"
    )
    assert (record["baked"], record["path"], record["size_bytes"]) == (False, None, 1000)
    assert (record["xla"]["baked"], record["xla"]["path"]) == (False, None)
    assert not (tmp_path / "cuda/580.95.05").exists() and not (tmp_path / "xla/580.95.05").exists()


def image_json(tmp_path: Path, jit: dict | None = None) -> Path:
    path = tmp_path / "image.json"
    document = {
        "format": "horovod-fleet/image/1",
        "proof": {
            "passed": True,
            "instance_type": "g5.xlarge",
            "resnet50_images_per_s": 800.0,
            "gpu_name": "NVIDIA A10G",
        },
        "jit_cache": {"warmed": False},
    }
    if jit is not None:
        document["jit_cache"] = jit
    path.write_text(json.dumps(document))
    return path


def baked_record(tmp_path: Path) -> dict:
    cache = tmp_path / "cuda/580.95.05"
    cache.mkdir(parents=True)
    (cache / "index").write_text("k")
    return {
        "warmed": True,
        "cold_s": 900.0,
        "warm_s": 120.0,
        "baked": True,
        "path": str(cache),
        "nvidia_driver": "580.95.05",
        "xla": {"baked": False, "path": None},
    }


def test_the_record_goes_into_image_json_validates_and_becomes_ami_tags(tmp_path):
    path = image_json(tmp_path)
    jit_cache.record_jit(path, baked_record(tmp_path), "p5.4xlarge")
    assert json.loads(path.read_text())["jit_cache"]["instance_type"] == "p5.4xlarge"
    assert "cold 900.0 s, warm 120.0 s, CUDA cache baked" in jit_cache.validate(path)
    tags = proof.ami_tags(path)
    assert tags["horovod-fleet:proof"] == "passed"
    assert tags["horovod-fleet:jit-cache"] == "baked"
    assert (tags["horovod-fleet:jit-cold-s"], tags["horovod-fleet:jit-warm-s"]) == (
        "900.0",
        "120.0",
    )
    other = tmp_path / "without-jit"
    other.mkdir()
    assert "horovod-fleet:jit-cache" not in proof.ami_tags(image_json(other))


def test_validate_refuses_a_missing_proof_and_a_baked_cache_that_is_not_there(tmp_path):
    with pytest.raises(ProofError, match="records no JIT proof"):
        jit_cache.validate(image_json(tmp_path))
    record = baked_record(tmp_path)
    for item in Path(record["path"]).iterdir():
        item.unlink()
    with pytest.raises(ProofError, match=r"says the CUDA JIT cache was baked, but .* is empty"):
        jit_cache.validate(image_json(tmp_path, record))
    record["path"] = str(tmp_path / "cuda/575.57.08")
    with pytest.raises(ProofError, match=r"is not named by the driver 580\.95\.05"):
        jit_cache.validate(image_json(tmp_path, record))


def test_validate_command_fails_in_one_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bootstrap.image_proof.jit_cache",
            "validate",
            "--image-json",
            str(image_json(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: JIT proof failed: {tmp_path}/image.json records no JIT proof"
    ]
