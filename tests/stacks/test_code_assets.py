"""The code assets carry the packages their code imports from outside its folder (contract/),
where that code finds them once the asset is unzipped as it is deployed: a node's
/opt/horovod-fleet/<asset>/ (user-data unzips each asset into its own folder), a function's
/var/task. Each is checked in a fresh Python that sees the unzipped asset and nothing of the
checkout."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from aws_cdk import App, Stack

from stacks.node_code import NodeCode
from stacks.teardown.functions import ANSWERS_CODE, CONTROLLER_CODE

# boto3 and botocore, as an instance's venv and Lambda's runtime have them; not the checkout,
# which the editable install (site's .pth) would put on the path: Python runs with -S.
SITE_PACKAGES = sysconfig.get_paths()["purelib"]


def fresh_python(code: str, cwd: Path, path: list[Path]) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": ":".join([*map(str, path), SITE_PACKAGES]), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def instance(tmp_path_factory) -> Path:
    """/opt/horovod-fleet as user-data leaves it: each node asset unzipped in its folder."""
    work = tmp_path_factory.mktemp("node")
    app = App(outdir=str(work / "cdk.out"))
    code = NodeCode(Stack(app, "Stack"), "Code")
    install = work / "opt" / "horovod-fleet"
    for name, asset in code.assets.items():
        shutil.copytree(work / "cdk.out" / asset.asset_path, install / name)
    return install


def test_the_bootstrap_asset_carries_contract_and_the_trainer_s_nothing_else(instance):
    assert (instance / "bootstrap" / "packages" / "contract" / "names.py").is_file()
    assert not (instance / "trainer" / "packages").exists()
    assert not (instance / "contract").exists()  # until lib.sh links it


def test_lib_sh_links_contract_where_every_process_started_from_the_app_finds_it(instance):
    """The head runs `cd /opt/horovod-fleet && python3 -m bootstrap.X` over ssh, without the
    PYTHONPATH lib.sh exports: contract/ must be next to bootstrap/ for it too."""
    sourced = subprocess.run(
        ["bash", "-c", f"source {instance}/bootstrap/lib.sh && trap - ERR"],
        capture_output=True,
        text=True,
    )
    assert sourced.returncode == 0, sourced.stderr
    assert (instance / "contract").is_symlink()
    imported = fresh_python(
        "import contract.causes, bootstrap.fleet.rendezvous, bootstrap.steps; "
        "print(contract.causes.__file__)",
        cwd=instance,
        path=[],
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(str(instance / "contract" / "causes.py"))
    # lib.sh again (systemd's restart of the bootstrap): the link stays one link.
    again = subprocess.run(["bash", "-c", f"source {instance}/bootstrap/lib.sh && trap - ERR"])
    assert again.returncode == 0
    assert sorted(p.name for p in instance.iterdir()) == ["bootstrap", "contract", "trainer"]


@pytest.fixture(scope="module")
def lambda_assets(tmp_path_factory) -> dict[str, Path]:
    """Each function asset's directory, as Lambda unzips it into /var/task."""
    work = tmp_path_factory.mktemp("lambda")
    stack = Stack(App(outdir=str(work / "cdk.out")), "Stack")
    return {code.name: Path(code.asset(stack).path) for code in (CONTROLLER_CODE, ANSWERS_CODE)}


def test_each_function_s_handler_imports_from_its_asset_alone(default, lambda_assets):
    """Lambda imports `<module>` of handler `<module>.<function>` from /var/task, and with it
    the controller package and contract/, which the asset must hold."""
    functions = default["TeardownStack"].find_resources("AWS::Lambda::Function").values()
    handlers = [f["Properties"]["Handler"] for f in functions
                if f["Properties"]["Runtime"].startswith("python")]  # fmt: skip
    assert len(handlers) == 11
    for handler in handlers:
        module, function = handler.split(".")
        task = lambda_assets["answers" if module == "answers" else "controller"]
        check = (
            f"import {module}, controller.{module} as package; "
            f"assert {module}.{function} is package.{function} and callable(package.{function})"
        )
        imported = fresh_python(check, cwd=task, path=[task])
        assert imported.returncode == 0, (handler, imported.stderr)


def test_the_answers_asset_holds_the_answers_alone(lambda_assets):
    """A read-only function's code: none of the controller's modules that act."""
    package = sorted(p.name for p in (lambda_assets["answers"] / "controller").glob("*.py"))
    assert package == ["__init__.py", "answer_kit.py", "answers.py", "run_answers.py"]
    assert (lambda_assets["answers"] / "contract" / "names.py").is_file()
