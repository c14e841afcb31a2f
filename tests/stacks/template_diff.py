"""Whether a change moved what the app deploys: the app synthesized at a git ref and in this
checkout, for each configuration of CONFIGURATIONS, and every difference of their templates once
asset hashes are normalised. A refactor that changes nothing deployed prints `same` for each.

    .venv/bin/python tests/stacks/template_diff.py [REF]   (REF: main's merge base by default)

An asset's hash changes with any byte of its code, so it is replaced by `<asset N>`, N counted in
the order the template first names each asset: the same templates over other code compare equal,
and a function moved to another asset does not. Only the cloud assembly's own asset hashes (its
*.assets.json) are replaced: the image recipe's and proof's content hashes stay, since a change
of those bakes a new image. Exit status 1 when a template differs.
"""

import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATIONS = {
    "default": {},
    "spot": {"market": "spot"},
    "notify": {"notifyEmail": "ops@example.com"},
    "own-subnet": {"vpcId": "vpc-0123abcd", "subnetId": "subnet-0123abcd", "az": "use1-az4"},
    "drill": {"drill": "true"},
}
# Run in the tree being synthesized: its own app.py and stacks/, its context and cdk-nag.
SYNTH = (
    "import json, sys; import app; "
    "application, _, _ = app.build(json.loads(sys.argv[1]), outdir=sys.argv[2]); "
    "application.synth()"
)
HASH = re.compile(r"[0-9a-f]{64}")


def asset_hashes(assembly: Path) -> set[str]:
    """Every asset hash the cloud assembly publishes (its *.assets.json files' ids)."""
    found: set[str] = set()
    for manifest in assembly.glob("*.assets.json"):
        document = json.loads(manifest.read_text())
        found |= set(document.get("files", {})) | set(document.get("dockerImages", {}))
    return found


def normalised(template: dict, assets: set[str]) -> dict:
    """The template with each asset hash replaced by `<asset N>`, by order of first mention."""
    text = json.dumps(template, sort_keys=True)
    order: dict[str, str] = {}

    def placeholder(match: re.Match) -> str:
        digest = match.group(0)
        if digest not in assets:
            return digest
        return order.setdefault(digest, f"<asset {len(order) + 1}>")

    return json.loads(HASH.sub(placeholder, text))


def differences(before, after, path: str = "$") -> list[str]:
    """One line per difference of two JSON values: its path, the value before and after."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            if key not in after:
                found.append(f"{path}.{key}: removed ({shown(before[key])})")
            elif key not in before:
                found.append(f"{path}.{key}: added ({shown(after[key])})")
            else:
                found += differences(before[key], after[key], f"{path}.{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        pairs = enumerate(zip(before, after, strict=True))
        return [line for i, (b, a) in pairs for line in differences(b, a, f"{path}[{i}]")]
    if before != after:
        return [f"{path}: {shown(before)} -> {shown(after)}"]
    return []


def shown(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


def synthesize(tree: Path, overrides: dict, outdir: Path) -> dict[str, dict]:
    """{stack name: its template normalised} of the app in `tree`."""
    subprocess.run(
        [sys.executable, "-c", SYNTH, json.dumps(overrides), str(outdir)],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    assets = asset_hashes(outdir)
    return {
        path.name.removesuffix(".template.json"): normalised(json.loads(path.read_text()), assets)
        for path in sorted(outdir.glob("*.template.json"))
    }


def checkout(ref: str, into: Path) -> Path:
    """The files of `ref`, as git holds them, in `into`."""
    archive = into / "ref.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref], stdout=out, check=True)
    tree = into / "ref"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def compare(ref: str) -> list[str]:
    """The report's lines: per configuration and stack, `same` or each difference."""
    lines = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        tree = checkout(ref, work)
        for name, overrides in CONFIGURATIONS.items():
            before = synthesize(tree, overrides, work / f"before-{name}")
            after = synthesize(ROOT, overrides, work / f"after-{name}")
            for stack in sorted(set(before) | set(after)):
                if stack not in after or stack not in before:
                    lines.append(f"{name} {stack}: only {'before' if stack in before else 'after'}")
                    continue
                found = differences(before[stack], after[stack])
                lines += [f"{name} {stack}: {line}" for line in found] or [f"{name} {stack}: same"]
    return lines


def main(argv: list[str]) -> int:
    ref = argv[0] if argv else None
    if ref is None:
        ref = subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    print(f"templates at {ref} (before) and in {ROOT} (after), asset hashes normalised:")
    lines = compare(ref)
    print("\n".join(lines))
    return 0 if all(line.endswith(": same") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
