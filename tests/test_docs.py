"""The README and docs/ say what the code does: a newcomer's first screen, the cost it quotes, the
commands CI runs, every link, the layout. Each test reads the page and checks it against the code
or the tree, so a change that makes a page lie fails here until the page is fixed."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# What a terminal shows before the first scroll: the README's first screen.
FIRST_SCREEN_LINES = 40
README_MAX_LINES = 350


# The average adult's silent reading of English non-fiction: 238 words a minute (Brysbaert, "How
# many words do we read per minute? A review and meta-analysis of reading rate", Journal of
# Memory and Language 109, 2019, https://doi.org/10.1016/j.jml.2019.104047).
WORDS_PER_MINUTE = 238
# A newcomer's path through the README: what it is and costs, the offline try, a real run step by
# step and how to watch it; the rest (stopping, recovery, recipes, the tables) is looked up.
NEWCOMERS_PATH_ENDS = "## Stop a run"


def test_a_newcomer_s_path_through_the_readme_reads_in_five_minutes():
    readme = README.read_text()
    words = len(readme[: readme.index(NEWCOMERS_PATH_ENDS)].split())
    assert words / WORDS_PER_MINUTE <= 5, f"{words} words: {words / WORDS_PER_MINUTE:.1f} minutes"


def test_the_readme_stays_within_its_length():
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def first_screen() -> str:
    return "\n".join(README.read_text().splitlines()[:FIRST_SCREEN_LINES])


def test_the_first_screen_has_the_offline_and_test_commands():
    screen = first_screen()
    for command in ("make setup", "make rehearsal", "make test"):
        assert re.search(rf"^    {command}\b", screen, re.M), f"{command} not on the first screen"


def test_ci_runs_the_readme_s_test_command():
    ci = [line.removeprefix("timed ") for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci
    assert re.search(r"^    make test\b", first_screen(), re.M)


def synthesis_lines(**overrides) -> list[str]:
    """What `npx cdk synth` prints before it synthesizes, for cdk.json's context and `overrides`
    (app.estimates, the function the app prints from)."""
    from app import estimates
    from stacks.config import FleetConfig

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    return estimates(FleetConfig.from_context({**context, **overrides}))


def test_the_first_screen_s_cost_is_what_synthesis_prints():
    """The hourly rate, the hard cap's worst case and the fast and default recipes' estimates of
    8 p4d nodes, as `npx cdk synth -c recipe=fast` and `npx cdk synth` print them."""
    fast = "\n".join(synthesis_lines(recipe="fast"))
    goyal = "\n".join(synthesis_lines())
    rate = re.search(r"^TrainStack: 8 x p4d\.24xlarge .*= (\$[\d,.]+)/h;", fast, re.M)
    cap = re.search(r"^TrainStack: .*capped at 4 h -> at most (\$[\d,.]+)", fast, re.M)
    estimate = r"^TrainStack training estimate: .* = (~\d+ min, ~\$[\d,.]+)"
    shown = {
        "the fleet's rate": f"{rate[1]}/h",
        "the hard cap's worst case": f"at most {cap[1]}",
        "recipe=fast": re.search(estimate, fast, re.M)[1],
        "recipe=goyal": re.search(estimate, goyal, re.M)[1],
    }
    screen = " ".join(first_screen().split())
    missing = {what: figure for what, figure in shown.items() if figure not in screen}
    assert not missing, f"the README's first screen lacks what synthesis prints: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def links(page: Path) -> list[tuple[str, str]]:
    """(target, anchor) of every relative Markdown link of the page, code blocks left out."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found.append((path, anchor))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for path, anchor in links(page):
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{path}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{path}#{anchor}: no such heading")
    assert not broken, broken


CODE_FOLDERS = ("contract", "controller", "bootstrap", "stacks", "trainer", "watch", "rehearsal")


def layout_rows() -> dict[str, str]:
    """docs/layout.md's table: {folder/: its cell}."""
    rows = {}
    for line in (ROOT / "docs" / "layout.md").read_text().splitlines():
        if match := re.match(r"^\| `([\w/]+/)` \| (.*) \|$", line):
            rows[match[1]] = match[2]
    return rows


def code_folders() -> list[Path]:
    return sorted(
        path
        for top in CODE_FOLDERS
        for path in [ROOT / top, *(ROOT / top).rglob("*")]
        if path.is_dir() and path.name != "__pycache__" and any(path.glob("*.py"))
    )


def test_the_layout_has_every_folder_and_only_folders_that_exist():
    """A folder of code two levels deep has its row; a deeper one is named in its parent's."""
    rows = layout_rows()
    for folder in code_folders():
        name = f"{folder.relative_to(ROOT)}/"
        if name.count("/") <= 2:
            assert name in rows, f"docs/layout.md has no row for {name}"
        else:
            parent = f"{folder.parent.relative_to(ROOT)}/"
            assert f"`{folder.name}/" in rows[parent], f"{parent}'s row does not name {name}"
    gone = [row for row in rows if not (ROOT / row).is_dir()]
    assert not gone, f"docs/layout.md lists folders that do not exist: {gone}"


def test_every_file_the_layout_names_exists():
    missing = []
    for folder, cell in layout_rows().items():
        for name in re.findall(r"`([\w./]+\.(?:py|sh|env|lock))`", cell):
            if "/" in name and ((ROOT / name).exists() or (ROOT / folder / name).exists()):
                continue
            if "/" not in name and next((ROOT / folder).rglob(name), None):
                continue
            missing.append(f"{folder}{name}")
    assert not missing, f"docs/layout.md names files that do not exist: {missing}"


def test_the_readme_s_folders_are_the_layout_s_top_level():
    readme = README.read_text()
    table = readme[readme.index("| folder | what it is |") :].split("\n\n")[0]
    listed = set(re.findall(r"^\| `(\w+)/` \|", table, re.M))
    assert set(CODE_FOLDERS) <= listed
    assert listed <= {row.split("/")[0] for row in layout_rows()} | {"docs"}


def test_trainer_md_s_fast_recipe_on_8_p4d_nodes_is_the_code_s():
    """docs/trainer.md's epochs of `fast` at 8 p4d nodes' global batch, and its resolutions."""
    from trainer.recipes import fast, train_resolution

    text = " ".join((ROOT / "docs" / "trainer.md").read_text().split())
    said = re.search(
        r"At (\d+) epochs \(8 p4d nodes, ([\d,]+) images a step\) that is (\d+) epochs at 160 px "
        r"and (\d+) at 192",
        text,
    )
    batch = 8 * 8 * 128  # 8 nodes x 8 A100s x fast's 128 images per GPU (stacks/config.py)
    epochs = fast(batch).epochs
    sizes = [train_resolution(epoch, epochs, 224) for epoch in range(epochs)]
    assert said, "docs/trainer.md no longer says fast's epochs at 8 p4d nodes"
    assert [int(g.replace(",", "")) for g in said.groups()] == [
        epochs, batch, sizes.count(160), sizes.count(192),
    ]  # fmt: skip
    assert f"its {epochs} epochs at 8k" in text


def test_trainer_md_s_epoch_at_8_p4d_nodes_is_the_estimate_s():
    from stacks.run_estimate import IMAGENET_TRAIN_IMAGES, PER_GPU_IMAGES_PER_S, SCALING

    text = " ".join((ROOT / "docs" / "trainer.md").read_text().split())
    said = re.search(r"At 64 GPUs x 256 an epoch is (\d+) steps, about ([\d.]+) s at the ~([\d,]+) img/s", text)  # fmt: skip
    rate = 64 * PER_GPU_IMAGES_PER_S["A100 40 GB"] * SCALING
    assert said, "docs/trainer.md no longer says an epoch's time at 8 p4d nodes"
    assert said.groups() == (
        str(IMAGENET_TRAIN_IMAGES // (64 * 256)), f"{IMAGENET_TRAIN_IMAGES / rate:.1f}", f"{rate:,.0f}",
    )  # fmt: skip


def test_the_readme_uploads_what_the_converter_waits_for_and_waits_for_the_manifest():
    """A real run's upload: the three files the preprocessing node waits for, the labels as the
    devkit image-net.org ships (the node's first choice), under the prefix DatasetStack's
    RawUpload names; then the wait for the dataset's manifest.json."""
    from bootstrap.preprocess.preprocessing_node import LABEL_FILES, RAW_FILES, raw_inputs
    from stacks.preprocess.preprocessor import RAW_PREFIX

    readme = README.read_text()
    bucket = "s3://horovod-fleet-<account>-<region>/"
    uploads = re.findall(rf"^ +aws s3 cp (\S+) {re.escape(bucket)}(\S+)$", readme, re.M)
    uploaded = [name for name, _ in uploads]
    assert raw_inputs(uploaded) == RAW_FILES | {"labels": LABEL_FILES[0]}, uploaded
    assert sorted(uploads) == sorted((name, RAW_PREFIX) for name in raw_inputs(uploaded).values())
    # The other label file the node takes is named as the devkit's stand-in.
    assert f"`{RAW_FILES['labels']}` of one synset per line works in its place" in " ".join(
        readme.split()
    )
    prefix = json.loads((ROOT / "cdk.json").read_text())["context"]["datasetPrefix"]
    assert f"until aws s3 ls {bucket}{prefix}manifest.json;" in readme
    steps = [readme.index(s) for s in ("aws s3 cp", "manifest.json; do", "cdk deploy TrainStack")]
    assert steps == sorted(steps), "the upload, the wait and TrainStack's deploy are out of order"


def test_the_recipe_table_and_the_spot_line_are_what_synthesis_prints():
    readme = README.read_text()
    for recipe in ("goyal", "fast"):
        printed = "\n".join(synthesis_lines(recipe=recipe))
        training = re.search(r"= ([\d.]+ min) training \+", printed)[1]
        total = re.search(r"^TrainStack training estimate: .* = (~\d+ min, ~\$[\d,.]+)", printed, re.M)[1]  # fmt: skip
        row = re.search(rf"^\| {recipe} \|.*\| ([\d.]+ min); (~\d+ min, ~\$[\d,.]+) \|", readme, re.M)  # fmt: skip
        assert row and row.groups() == (training, total), f"the README's {recipe} row"
    spot = next(line for line in synthesis_lines(market="spot") if "on Spot" in line)
    shown = re.search(r"^    (TrainStack on Spot .*), \.\.\.$", readme, re.M)[1]
    assert spot.startswith(shown)
