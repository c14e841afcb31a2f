"""`python -m trainer.train`'s batch without --batch-size is the recipe's, as its --help says and
as the fleet deploys it (issue 50: --help showed 256 for the fast recipe too)."""

import contextlib
import io

import pytest

from stacks.config import DEFAULT_BATCH_PER_GPU
from trainer.config import parse_config
from trainer.recipes import DEFAULT_BATCH_SIZE
from trainer.train import main


@pytest.mark.parametrize("recipe", ["goyal", "fast"])
def test_the_default_batch_is_the_recipe_s(recipe):
    config = parse_config(["--synthetic", "--model-dir", "m", "--recipe", recipe])
    assert config.batch_size == DEFAULT_BATCH_SIZE[recipe] == DEFAULT_BATCH_PER_GPU[recipe]
    given = parse_config(
        ["--synthetic", "--model-dir", "m", "--recipe", recipe, "--batch-size", "7"]
    )
    assert given.batch_size == 7


def test_help_shows_each_recipe_s_batch():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["--help"])
    text = " ".join(out.getvalue().split())
    assert (
        "--batch-size BATCH_SIZE images per step per rank (default: the recipe's: 256 for goyal, 128 for fast)"
        in text
    )
    assert "(default: 256)" not in text
