"""Each configuration of the app synthesized once per test session, shared by the xdist workers
(tests/conftest.py offers `synth` to every folder): tests read the templates."""

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest


def synthesize(tmp: Path, overrides: dict[str, Any] | None = None) -> dict[str, dict]:
    """The app's stacks for cdk.json's context plus overrides, without the cdk-nag plugin
    (test_app.py runs it on the real app) so each test fails for its own reason:
    {stack name: template}."""
    # Imported here: most tests of the session need none of this.
    from aws_cdk import App

    import app as fleet_app
    from stacks.composition import compose
    from stacks.config import FleetConfig

    app = App(context={**fleet_app.default_context(), **(overrides or {})}, outdir=str(tmp))
    compose(app, FleetConfig.from_context(app.node.get_all_context()))
    assembly = app.synth()
    return {s.stack_name: s.template for s in assembly.stacks}


class Templates(Mapping[str, Any]):
    """{stack name: aws_cdk.assertions.Template}, each made on first use: most tests read one or
    two stacks of a configuration, and each Template is a round trip to jsii's Node process."""

    def __init__(self, documents: dict[str, dict]) -> None:
        self.documents = documents
        self.made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.made:
            from aws_cdk.assertions import Template

            self.made[name] = Template.from_json(self.documents[name])
        return self.made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.documents)

    def __len__(self) -> int:
        return len(self.documents)


def shared_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The directory every xdist worker of this session shares."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def made_once(record: Path, make: Callable[[], Any]) -> Any:
    """make()'s JSON value, made by the first xdist worker to ask (under a lock beside `record`)
    and read from `record` by every other."""
    import fcntl

    with record.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            record.write_text(json.dumps(make()))
    return json.loads(record.read_text())


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Callable[..., Templates]:
    """synth(**overrides) -> Templates, synthesized once per distinct configuration for the whole
    session: the first worker to ask makes it under a lock and the others read it (the suite is
    CPU-bound, and a synthesis is about 3 s)."""
    shared = shared_root(tmp_path_factory, worker_id)
    cache: dict[str, Templates] = {}

    def run(**overrides: Any) -> Templates:
        key = json.dumps(overrides, sort_keys=True)
        if key not in cache:
            record = shared / f"synth-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
            cache[key] = Templates(
                made_once(record, lambda: synthesize(tmp_path_factory.mktemp("cdk.out"), overrides))
            )
        return cache[key]

    return run
