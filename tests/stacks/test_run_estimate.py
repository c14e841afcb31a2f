"""The training estimate synthesis prints: the published per-GPU rate through the formula."""

import re

import pytest
from conftest import fleet_nodes, node_document

from stacks import startup_estimate
from stacks.config import RECIPES
from stacks.instance_types import GPU_TYPES
from stacks.run_estimate import (
    RunPlan,
    checkpoint_every_s,
    estimated_seconds,
    recipe_plan,
    training_estimate,
)

P4D = GPU_TYPES["p4d.24xlarge"]


def estimate(
    gpu=P4D,
    nodes=8,
    epochs=90,
    eval_every=10,
    arch="resnet50",
    image_size=224,
    pixels=1.0,
    recipe="goyal",
) -> str:
    timed = estimated_seconds(
        gpu, nodes, epochs=epochs, pixel_fraction=pixels, eval_every=eval_every, arch=arch,
        image_size=image_size,
    )  # fmt: skip
    plan = RunPlan(epochs, pixels, timed)
    return training_estimate(gpu, nodes, recipe=recipe, arch=arch, plan=plan)


def figures(line: str) -> tuple[float, float, float]:
    training = float(re.search(r"= ([\d.]+) min training", line)[1])
    total = float(re.search(r"= ~(\d+) min", line)[1])
    dollars = float(re.search(r"~\$([\d,.]+) with", line)[1].replace(",", ""))
    return training, total, dollars


def test_the_estimate_follows_the_formula():
    line = estimate()
    # 64 A100 x 2,375 img/s x 90% = 136,800 img/s; 90 x 1,281,167 / 136,800 = 842.9 s.
    rate = 64 * 2375 * 0.9
    training_s = 90 * 1_281_167 / rate
    evaluation_s = 9 * 50_000 / rate
    startup_s = startup_estimate.startup_s(startup_estimate.startup_phases(P4D, 8, init_rate=300))
    total_s = training_s + evaluation_s + startup_s
    assert "estimate" in line and "~136,800 img/s" in line
    training, total, dollars = figures(line)
    assert training == pytest.approx(training_s / 60, abs=0.05)
    assert total == pytest.approx(total_s / 60, abs=0.5)
    # The fleet's hours (its head's too), the root volumes' one-time initialization and their
    # throughput.
    volumes = 8 * 60 * 300 * 0.0036 / 300 + 8 * (500 - 125) * 0.04 / 730 * total_s / 3600
    assert dollars == pytest.approx((8 * 21.958 + 0.17) * total_s / 3600 + volumes, abs=0.01)
    assert "root volumes initialized at 300 MiB/s (at most $1.73 once)" in line


def test_half_the_epochs_half_the_training_minutes():
    full, _, _ = figures(estimate(epochs=90))
    half, _, _ = figures(estimate(epochs=45))
    assert full / half == pytest.approx(2, rel=0.02)


def test_fewer_pixels_more_images_a_second():
    assert figures(estimate(image_size=160))[0] == pytest.approx(
        figures(estimate())[0] * (160 / 224) ** 2, rel=0.02
    )


@pytest.mark.parametrize(
    ("gpu", "arch"), [("p5.48xlarge", "resnet50"), ("p4d.24xlarge", "resnet18")]
)
def test_no_published_figure_says_so_and_points_at_the_benchmark(gpu, arch):
    line = estimate(gpu=GPU_TYPES[gpu], arch=arch)
    assert line.startswith("TrainStack training estimate: none, no published TensorFlow figure")
    assert line.endswith("measure the fleet with -c benchmark=true")


def test_the_recipe_s_epochs_come_from_the_trainer_s_own_table():
    """Synthesis asks `python -m trainer.recipes`, so the estimate and the run agree."""
    from trainer import recipes  # the test may import both sides; stacks/ never does

    assert RECIPES == recipes.RECIPES
    assert recipe_plan("goyal", 16384, None, 224) == (90, 1.0)
    epochs, pixels = recipe_plan("fast", 16384, None, 224)
    assert epochs == recipes.fast(16384).epochs == 48
    # 38 epochs at 160 px and 10 at 192, over 48 at 224.
    assert pixels == pytest.approx((38 * 160**2 + 10 * 192**2) / (48 * 224**2))
    assert recipe_plan("fast", 8192, None, 224)[0] == 44
    assert recipe_plan("fast", 8192, 30, 224)[0] == 30  # -c epochs wins


def test_the_fast_recipe_s_estimate_is_the_shorter_run():
    """8 p4d nodes x 8 x 256 = 16,384: MLPerf's 48 epochs, mostly at 160 px, instead of 90."""
    epochs, pixel_fraction = recipe_plan("fast", 16384, None, 224)
    fast = estimate(epochs=epochs, pixels=pixel_fraction, recipe="fast")
    goyal = estimate(epochs=recipe_plan("goyal", 16384, None, 224)[0])
    pixels = (38 * 160**2 + 10 * 192**2) / (48 * 224**2)
    assert figures(goyal)[0] / figures(fast)[0] == pytest.approx(90 / (48 * pixels), rel=0.02)
    assert "48 epochs (recipe fast, 56% of the pixels)" in fast


# --- the checkpoint interval from the estimate --------------------------------------------------


@pytest.mark.parametrize(
    ("training_s", "expected"),
    [
        (None, 600),  # no estimate: the longest interval
        (3.8 * 60, 100),  # the fast recipe's few minutes: two checkpoints, and the last
        (14.1 * 60, 100),  # a tenth would be 84 s: its saves would cost 1.2%
        (40 * 60, 240),
        (3 * 3600, 600),  # a long run: at most 600 s
        (50, 100),  # never so often that saving costs more than 1%
    ],
)
def test_the_checkpoint_interval_is_a_tenth_of_the_estimate_within_its_bounds(training_s, expected):
    assert checkpoint_every_s(training_s) == expected


def test_the_default_interval_pays_for_itself():
    """Issue 47: saving costs at most 1% of the estimated training, from a save's pause (the
    p4d estimate of docs/trainer.md): the saves an interval makes, times the pause."""
    from stacks.run_estimate import CHECKPOINT_PAUSE_S

    for training_s in (3.8 * 60, 14.1 * 60, 3600, 10 * 3600):
        interval = checkpoint_every_s(training_s)
        assert (training_s // interval) * CHECKPOINT_PAUSE_S <= 0.01 * training_s


def test_node_json_carries_the_interval_from_the_estimate_or_its_key(synth):
    def interval(**context):
        [node, *_] = fleet_nodes(synth(**context)["TrainStack"]).values()
        return node_document(node)["trainer"].get("checkpoint_every_s")

    assert interval() == 100  # 90 epochs at ~136,800 img/s: ~14.1 min; a tenth would cost 1.2%
    assert interval(checkpointEveryS=300) == 300
    assert interval(benchmark="synthetic") is None  # a benchmark keeps no checkpoint


@pytest.mark.parametrize("value", ["5", "abc", "-1"])
def test_a_bad_checkpoint_interval_is_one_line(value):
    import app
    from stacks.config import ConfigError, FleetConfig

    with pytest.raises(ConfigError) as raised:
        FleetConfig.from_context({**app.default_context(), "checkpointEveryS": value})
    assert str(raised.value) == (
        f"error: context key checkpointEveryS={value!r} is invalid; allowed: an integer from 10 "
        "to 86400"
    )
