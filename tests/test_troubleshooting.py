"""docs/troubleshooting.md has an entry for every cause code, every context key's one-line error
(and each rule between keys), and every deploy-time answer (issue 50). A new code, key, rule or
answer fails here until the page says what it means and what to do."""

import json
import re
from pathlib import Path

import pytest

from stacks.config import KEYS, ConfigError, FleetConfig

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
DEFAULTS = json.loads((ROOT / "cdk.json").read_text())["context"]


def cause_codes() -> tuple[str, ...]:
    """Every cause code (contract/causes.py)."""
    from contract.causes import CAUSES

    return CAUSES


def section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def first_cells(title: str) -> list[str]:
    """The first cell of each row of the section's table (header and rule left out)."""
    rows = re.findall(r"^\| (.+?) \|", section(title), re.M)
    return [row for row in rows if row not in ("code", "key", "resource", "---")]


def test_every_cause_code_has_an_entry():
    cells = first_cells("Why a run ended")
    listed = {c.strip("`") for c in cells}
    assert listed == set(cause_codes()), set(cause_codes()) ^ listed


# A context that breaks each rule between keys (stacks/config.py's other raise sites), the key
# its line names, and what that key's row must mention.
RULES = {
    "vpcId without subnetId": ({"vpcId": "vpc-0123abcd"}, "vpcId", "subnetId"),
    "a JIT proof with your AMI": (
        {"imageJitInstanceType": "p5.4xlarge", "ami": "ami-0123456789abcdef0"},
        "imageJitInstanceType",
        "ami",
    ),
    "Spot into a reservation": (
        {"market": "spot", "capacityReservationId": "cr-0123456789abcdef0", "az": "us-east-1a"},
        "market",
        "capacityReservationId",
    ),
    "a subnet without its zone": (
        {"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd"},
        "az",
        "subnetId",
    ),
    "a batch the GPU cannot hold": ({"batchPerGpu": 4096}, "batchPerGpu", "fits the GPU"),
    "an unknown key": ({"node": 8}, "node", "suggests the closest"),
    "a drill on a P-family type": (
        {"drill": "true", "instanceType": "p4d.24xlarge"},
        "instanceType",
        "drillConfirmCost",
    ),
}


def error_line(overrides: dict) -> str:
    with pytest.raises(ConfigError) as raised:
        FleetConfig.from_context(DEFAULTS | overrides)
    line = str(raised.value)
    assert "\n" not in line
    return line


def key_rows() -> dict[str, str]:
    """{key: its row} of the context-value section; a row may name several keys."""
    rows = {}
    for line in section("A deploy refused by a context value").splitlines():
        if match := re.match(r"^\| (.+?) \|", line):
            for key in re.findall(r"`(\w+)`", match[1]):
                rows[key] = line
            if match[1] == "any other key":
                rows["any other key"] = line
    return rows


@pytest.mark.parametrize("key", KEYS)
def test_every_context_key_s_error_has_an_entry(key):
    line = error_line({key: "!"})
    assert line.startswith(f"error: context key {key}='!' is invalid; allowed: ")
    assert key in key_rows(), f"docs/troubleshooting.md has no row for {key}: {line}"


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_between_keys_has_an_entry(rule):
    overrides, key, mentions = RULES[rule]
    line = error_line(overrides)
    assert line.startswith(f"error: context key {key}="), line
    rows = key_rows()
    row = rows.get(key) or rows["any other key"]
    assert mentions in row, (rule, row)


def test_the_rules_listed_are_every_raise_of_the_configuration():
    """Each `raise ConfigError(` of stacks/config.py and config_values.py is a parser's (one per key, above), the
    unknown key's, or one of RULES': a new rule fails here until it is added, with its entry."""
    source = "".join((ROOT / "stacks" / f).read_text() for f in ("config.py", "config_values.py"))
    raises = source.count("raise ConfigError(")
    generic = 2  # _Getter: a parser's complaint about one key; a drill's (stacks/drill_plan.py)
    assert raises == generic + len(RULES) - 1, "a new rule of stacks/config.py: add it to RULES"


def test_every_deploy_time_answer_has_an_entry():
    from controller import answers

    cells = {c.strip("`") for c in first_cells("A deploy refused at deploy time")}
    assert set(answers.ANSWERS) <= cells, set(answers.ANSWERS) - cells
