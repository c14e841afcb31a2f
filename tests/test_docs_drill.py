"""The drill's pages say what the code does: docs/faults-and-recovery.md's table of the drill's
experiments is contract/drill.py's list (a change to the list fails here until the page is
changed), and the README's drill step quotes what `npx cdk synth -c drill=true` prints."""

import dataclasses
import re
from pathlib import Path

from contract import drill

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "docs" / "faults-and-recovery.md"


def experiments_table(experiments: tuple[drill.Experiment, ...] = drill.EXPERIMENTS) -> str:
    """docs/faults-and-recovery.md's table of the drill: each experiment, its FIS action ids,
    what is done, what is expected and within how long."""
    lines = [
        "| experiment | FIS actions | what is done | expected | within |",
        "| --- | --- | --- | --- | --- |",
    ]
    for e in experiments:
        market = " (`--market spot` only)" if e.market else ""
        actions = ", ".join(f"`{a}`" for a in e.action_ids)
        lines.append(
            f"| {e.name}{market} | {actions} | {e.what} | {e.expect} | {e.within_s / 60:g} min |"
        )
    return "\n".join(lines) + "\n"


def test_the_faults_page_s_drill_table_is_the_contract_s_list():
    assert experiments_table() in FAULTS.read_text()


def test_a_changed_list_no_longer_matches_the_page():
    """The check can fail: one bound changed, one experiment gone, each is another table."""
    first, *rest = drill.EXPERIMENTS
    text = FAULTS.read_text()
    assert experiments_table((dataclasses.replace(first, within_s=1), *rest)) not in text
    assert experiments_table(tuple(rest)) not in text


def test_the_readme_s_drill_step_quotes_synthesis():
    """The fleet's life, the conversion before it and the cost, as `npx cdk synth -c drill=true`
    prints them (the same function app.py prints from)."""
    from test_docs import synthesis_lines

    printed = "\n".join(synthesis_lines(drill="true"))
    estimate = re.search(
        r"the fleet lives (~\d+ min) after (~\d+ min) of preprocessing .*cost (~\$[\d.]+) at list",
        printed,
    )
    quota = re.search(r"needs (\d+) vCPUs of the EC2 quota 'Running On-Demand G", printed)
    step = " ".join(readme_drill_step().split())
    assert f"the fleet lives {estimate[1]} after {estimate[2]} of conversion, {estimate[3]}" in step
    assert f"the quota ({quota[1]} vCPUs of G instances)" in step


def readme_drill_step() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("2. Drill first") : readme.index("3. Bake the training image")]


def test_the_drill_comes_before_the_imagenet_upload():
    readme = (ROOT / "README.md").read_text()
    assert readme.index("       horovod-fleet drill\n") < readme.index("aws s3 cp ILSVRC2012")
