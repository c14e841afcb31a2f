"""`python -m rehearsal --drill`: the drill's list played offline (rehearsal/drill.py), its
table in docs/rehearsal.md, and, as root, one experiment of it end to end (the whole drill
takes longer than CI allows: docs/test-tiers.md)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contract import drill
from rehearsal import drill as rehearsal_drill
from rehearsal.__main__ import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def test_docs_rehearsal_md_holds_the_drill_s_table():
    text = (REPO / "docs" / "rehearsal.md").read_text()
    assert rehearsal_drill.markdown_table() in text


def test_each_template_aims_each_action_at_its_target_with_fis_s_parameters():
    [head] = [e for e in drill.EXPERIMENTS if e.name == "head-terminated"]
    template = rehearsal_drill.fis_template(head, "us-east-1a")
    assert template["actions"]["no-capacity"] == {
        "actionId": drill.INSUFFICIENT_CAPACITY,
        "parameters": {"availabilityZoneIdentifiers": "us-east-1a", "percentage": "100",
                       "duration": "PT5M"},
        "targets": {"Roles": drill.CONTROLLER_ROLE},
    }  # fmt: skip
    assert template["targets"][drill.HEAD]["resourceTags"]["horovod-fleet:node"] == "head"
    assert template["targets"][drill.HEAD]["selectionMode"] == "COUNT(1)"
    assert template["targets"][drill.CONTROLLER_ROLE]["resourceArns"] == [
        rehearsal_drill.CONTROLLER_ROLE
    ]
    assert template["tags"] == {"Name": "horovod-fleet-drill-head-terminated"}


def test_the_head_s_plan_names_each_template_in_the_plan_s_order():
    experiments = drill.plan("spot")
    document = rehearsal_drill.document(experiments, {e.name: f"EXT{e.name}" for e in experiments})
    assert [e["name"] for e in document["experiments"]] == [e.name for e in experiments]
    assert document["experiments"][0]["template_id"] == f"EXT{experiments[0].name}"
    assert document["start_after_epoch"] == drill.START_AFTER_EPOCH


def test_an_unknown_experiment_is_one_line_and_exit_2(capsys, tmp_path):
    args = ["--drill", "--experiment", "melt", "--workdir", str(tmp_path / "w")]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "drill: --experiment: unknown experiment 'melt': allowed node-terminated" in out
    assert not (tmp_path / "w").exists()  # nothing set up


def test_a_spot_only_experiment_on_an_on_demand_drill_is_refused(capsys, tmp_path):
    args = ["--drill", "--experiment", "spot-notice", "--workdir", str(tmp_path / "w")]
    assert main(args) == 2
    assert "none of spot-notice is played on on-demand" in capsys.readouterr().out


def test_the_drill_s_flags_default_to_the_on_demand_plan():
    args = build_parser().parse_args(["--drill"])
    assert args.market == "on-demand" and args.experiment is None


@pytest.mark.e2e
@pytest.mark.skipif(os.geteuid() != 0, reason="the drill needs root: a network namespace a node")
def test_the_ci_experiment_of_the_drill_passes_end_to_end(tmp_path):
    """The head starts the experiment through moto's FIS after epoch 1, the rehearsal's
    executor plays it, the head judges it from the records, asks the stop, and the run
    succeeds; the table names the experiment's FIS actions and its row passes."""
    workdir = tmp_path / "drill"
    command = [sys.executable, "-m", "rehearsal", "--drill", "--experiment",
               rehearsal_drill.CI_EXPERIMENT, "--workdir", str(workdir)]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    out = result.stdout
    assert result.returncode == 0, out[-6000:] + result.stderr[-2000:]
    [experiment] = [e for e in drill.EXPERIMENTS if e.name == rehearsal_drill.CI_EXPERIMENT]
    [line] = [line for line in out.splitlines() if line.startswith(f"{experiment.name} ")]
    assert all(action in line for action in experiment.action_ids)
    assert re.search(r"\|\s*pass$", line), line
    run = workdir / "s3" / "runs" / "rehearsal"
    record = json.loads((run / "drill" / f"{experiment.name}.json").read_text())
    assert record["verdict"] == "pass" and set(record["observed"]) == set(experiment.observe)
    assert record["client_token"] == f"rehearsal-{experiment.name}"
    assert json.loads((run / "stop.json").read_text())["by"] == "drill"
    done = json.loads((run / "DONE.json").read_text())
    assert done["status"] == "succeeded" and done["attempt"] == 1
    assert done["epochs"] < rehearsal_drill.MAX_EPOCHS  # the agreed stop, not the bound
    assert "drill rehearsal: 1 of 1 experiments passed" in out
