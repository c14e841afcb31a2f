"""The preprocessing benchmark's arithmetic and its command line (the figures are docs/benchmark.md's)."""

import re
import subprocess
import sys

import pytest

from trainer.preprocess.bench import MIN_IMAGES, SMALL_IMAGES, MeasurementError, Timing

FIXED_CPU_S, FIXED_WALL_S, PER_IMAGE_S = 0.5, 0.4, 0.002


def linear_run(images: int) -> Timing:
    """A run whose cost is a start-up plus the same cost for every image."""
    return Timing(
        images, FIXED_WALL_S + images * PER_IMAGE_S / 2, FIXED_CPU_S + images * PER_IMAGE_S, 2
    )


def test_steady_state_cancels_start_up():
    steady = linear_run(2000).minus(linear_run(SMALL_IMAGES))
    assert steady.images == 2000 - SMALL_IMAGES
    assert steady.per_cpu_second() == pytest.approx(1 / PER_IMAGE_S)
    assert steady.per_core_wall() == pytest.approx(1 / PER_IMAGE_S)
    assert linear_run(2000).per_cpu_second() < steady.per_cpu_second()


def test_steady_state_needs_the_larger_run_on_the_same_cores():
    with pytest.raises(AssertionError):
        linear_run(SMALL_IMAGES).minus(linear_run(2000))
    with pytest.raises(AssertionError):
        linear_run(2000).minus(Timing(SMALL_IMAGES, 1.0, 1.0, 1))


def test_a_steady_state_drowned_in_noise_is_refused():
    """A larger run that cost no more than the small one (a busy machine) gives no figure."""
    small = Timing(SMALL_IMAGES, 1.0, 0.9, 2)
    with pytest.raises(MeasurementError, match="too busy to measure"):
        Timing(MIN_IMAGES, 0.9, 1.5, 2).steady_state(small)
    with pytest.raises(MeasurementError, match="too busy to measure"):
        Timing(MIN_IMAGES, 1.5, 0.8, 2).steady_state(small)
    assert Timing(MIN_IMAGES, 1.5, 1.4, 2).steady_state(small).images == MIN_IMAGES - SMALL_IMAGES


def test_too_small_a_sample_is_one_line_and_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "trainer.preprocess.bench", "--images", str(MIN_IMAGES - 1)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: --images must be at least {MIN_IMAGES} (steady state is measured "
        f"against a {SMALL_IMAGES}-image run), got {MIN_IMAGES - 1}"
    ]


def test_too_many_workers_is_one_line_before_any_work():
    result = subprocess.run(
        [sys.executable, "-m", "trainer.preprocess.bench", "--workers", "600"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: --workers must be between 1 and 512, got 600"
    ]


@pytest.mark.slow
def test_benchmark_prints_every_figure():
    result = subprocess.run(
        [sys.executable, "-m", "trainer.preprocess.bench", "--images", str(MIN_IMAGES)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert re.search(r"steady state: \d+ images per CPU-second.*start-up [\d.]+ CPU-s", out)
    assert re.search(r"tool, steady state: decode \+ resize [\d.]+ \+ encode [\d.]+", out)
    assert re.search(r"ceiling: .* at most \d+\.\dx the reference", out)
    assert re.search(r"PSNR mean \d+\.\d dB", out)
    ratios = re.findall(
        r"^(steady state|start-up included), per (?:CPU-second|core by wall clock): "
        r"tool (\d+), reference (\d+), (\d+\.\d)x -> (meets|misses)",
        out,
        re.MULTILINE,
    )
    assert [basis for basis, *_ in ratios] == ["steady state"] * 2 + ["start-up included"] * 2
    for _, tool, reference, ratio, _ in ratios:
        assert int(tool) > 0 and int(reference) > 0
        assert float(ratio) == pytest.approx(int(tool) / int(reference), abs=0.06)
