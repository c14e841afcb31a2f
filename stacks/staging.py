"""Code assets assembled at synthesis. An asset is one directory, unzipped as one folder (a
node's /opt/horovod-fleet/<name>, a function's /var/task), while the checkout keeps each package
once: so each asset's directory is put together here, under the cloud assembly's output
directory, with the packages its code imports laid out where that code finds them. CDK then
hashes and copies it like any directory asset.
"""

import shutil
from collections.abc import Mapping
from pathlib import Path

from aws_cdk import Stage
from constructs import Construct

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contract"  # what every room agrees on: in every asset whose code imports it
EXCLUDE = ("__pycache__", "*.pyc", "tests")
STAGING = "staged-code"  # <outdir>/staged-code/<asset>/


def staged(scope: Construct, name: str, parts: Mapping[str, Path], modules=None) -> Path:
    """The directory of asset `name`: each of `parts` (a path in the asset: the folder or file
    copied there; "." for its top) and each of `modules` (a path in the asset: the text written
    there). The same name and parts give the same directory, whichever construct asks."""
    root = Path(Stage.of(scope).outdir).resolve() / STAGING / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for target, source in parts.items():
        if source.is_dir():
            shutil.copytree(
                source, root / target, ignore=shutil.ignore_patterns(*EXCLUDE), dirs_exist_ok=True
            )
        else:
            (root / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, root / target)
    for target, text in (modules or {}).items():
        (root / target).write_text(text)
    return root
