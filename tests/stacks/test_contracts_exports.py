"""docs/contracts.md names every export of TeardownStack (issue 50: it named 4 of 6), by the
logical id of what it exports, which the stacks that import it hold."""

import re
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"


def exported(template: dict) -> list[str]:
    """The logical id, without CDK's 8-hex-digit suffix, of what each export refers to."""
    found = []
    for output in template["Outputs"].values():
        if "Export" not in output:
            continue
        value = output["Value"]
        logical_id = value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0]
        found.append(re.sub(r"[0-9A-F]{8}$", "", logical_id))
    return found


def test_contracts_md_names_every_teardown_stack_export(default):
    exports = exported(default["TeardownStack"].to_json())
    assert len(exports) == 6, exports
    names = " ".join(CONTRACTS.read_text().split())
    names = names[names.index("## Names") : names.index("## The training image")]
    missing = [e for e in exports if f"`{e}`" not in names]
    assert not missing, f"docs/contracts.md's Names does not name TeardownStack's exports {missing}"
