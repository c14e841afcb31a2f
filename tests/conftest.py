"""The test tiers (README, "Tests"), and the guard that keeps the default one fast.

    make test        every test without a tier marker, each within 120 s (TIMEOUT_S below)
    make test-slow   @pytest.mark.slow: training runs, Horovod ranks, benchmarks
    make test-e2e    @pytest.mark.e2e: the rehearsals (and, as root, the fault rehearsal)
    make test-all    all three

The guard: while a default-tier test runs, every process it starts carries TEST_ENV in its
environment, and a watcher thread reads /proc. A process with that mark that runs horovodrun
or has loaded TensorFlow fails the test, named: such a test belongs to a slower tier. The
pytest process itself may import TensorFlow (the trainer's pieces are tested in process); only
the processes it starts are judged. A process started with an environment built from nothing
escapes the mark: tests build theirs from os.environ.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import urllib.request
import uuid
from pathlib import Path

import botocore.loaders
import botocore.session
import pytest
from moto.server import ThreadedMotoServer
from tier_guard import TEST_ENV, ProcessWatcher
from xdist.scheduler import LoadFileScheduling

# pytester: tests/test_tiers.py runs the guard on tests of its own; synthesis: the `synth` fixture,
# the app's templates once per configuration for the session, in every folder.
pytest_plugins = ["pytester", "synthesis"]

TIERS = ("slow", "e2e")


@functools.cache
def shared_loader(data_path: str | None) -> botocore.loaders.Loader:
    return botocore.loaders.create_loader(data_path)


def register_shared_loader(session: botocore.session.Session) -> None:
    session._components.lazy_register_component(
        "data_loader", lambda: shared_loader(session.get_config_variable("data_path"))
    )


# Every botocore session of the test process reads the service models through one loader, which
# caches them: moto resets boto3's default session at each mock_aws, and each new session would
# parse the same JSON models again (most of a moto test's time).
botocore.session.Session._register_data_loader = register_shared_loader
# moto's EC2 makes about 1,300 public AMIs (each with a snapshot) for every new backend: seconds
# per test, for images no test asks for.
os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")


# The suite trains on this machine's CPUs, in its own process and in the trainers it starts: with
# oneDNN, as the head gives a CPU fleet's ranks (bootstrap/head/launch.py CPU_ENV, which says why).
# Read at TensorFlow's import, which comes later (tests/trainer/conftest.py).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


# Python's garbage collections walk the objects the process holds: TensorFlow's, jsii's and
# moto's modules, imported once and never freed (48 s of the default tier's 593 s of CPU, 30 s
# with this: docs/test-tiers.md). What is alive after collection, and again after each test
# module's teardown and a collection, is kept out of later collections (gc.freeze): a module's
# own garbage is collected first, so only what lives on is frozen.
def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    torn_down = yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()
    return torn_down


# `make test-e2e` collects only this folder (the whole suite's collection, its imports, cost 10 s
# of CI for three tests). A test marked e2e elsewhere would never run there: in every other run it
# is replaced by MisplacedE2E, which fails naming it, `make test` among them.
E2E_FOLDER = Path(__file__).parent / "rehearsal"


class MisplacedE2E(pytest.Item):
    """Stands for a test marked e2e outside E2E_FOLDER. It has no marker, so `-m` keeps it where
    the test itself would be deselected; an error raised at collection instead would name nothing
    under xdist (the worker dies, and its message with it)."""

    def runtest(self) -> None:
        where = os.path.relpath(E2E_FOLDER, self.config.rootpath)
        pytest.fail(
            f"{self.name}: marked e2e outside {where}/, which is all `make test-e2e` collects "
            "(Makefile): move it there, or mark it slow",
            pytrace=False,
        )

    def reportinfo(self) -> tuple[Path, None, str]:
        return self.path, None, self.name


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: whichever tier runs sees every test
def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    items[:] = [
        MisplacedE2E.from_parent(session, name=item.nodeid, nodeid=item.nodeid, path=item.path)
        if misplaced_e2e(item)
        else item
        for item in items
    ]


def misplaced_e2e(item: pytest.Item) -> bool:
    return item.get_closest_marker("e2e") is not None and not item.path.is_relative_to(E2E_FOLDER)


# The test files whose tests start several Horovod ranks: each such test keeps the 2 cores busy,
# and some wait on Gloo's 30 s timeouts. Under `--dist loadfile` (both tiers that use workers) they
# are one work unit: one after the other on one worker, while the other workers take the rest
# (syntheses and single processes; Makefile test-slow). Their session fixtures, the shared
# two-rank run among them, are then made once.
RANKS_FILES = ("tests/trainer/test_train_horovod.py", "tests/trainer/test_train_elastic.py")
RANKS_UNIT = "several Horovod ranks"


class RankFilesTogether(LoadFileScheduling):
    """xdist's loadfile, with RANKS_FILES one work unit. (An xdist_group mark with `--dist
    loadgroup` would say the same, but on pytest 9.2 it groups nothing:
    https://github.com/pytest-dev/pytest-xdist/issues/1386.) `_split_scope` is how xdist's own
    schedulers define their units."""

    def _split_scope(self, nodeid: str) -> str:
        path = super()._split_scope(nodeid)
        return RANKS_UNIT if path in RANKS_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadFileScheduling | None:
    return RankFilesTogether(config, log) if config.getvalue("dist") == "loadfile" else None


def tier(item: pytest.Item) -> str:
    return next((name for name in TIERS if item.get_closest_marker(name)), "default")


@pytest.fixture(autouse=True)
def tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    if tier(request.node) != "default" or not Path("/proc/self/environ").exists():
        yield
        return
    token = uuid.uuid4().hex
    monkeypatch.setenv(TEST_ENV, token)
    watcher = ProcessWatcher(token)
    watcher.start()
    yield
    if started := watcher.stop():
        more = f" and {len(started) - 3} more" if len(started) > 3 else ""
        pytest.fail(
            f"a default-tier test started {'; '.join(started[:3])}{more}: mark it "
            "@pytest.mark.slow "
            "(training, Horovod ranks, benchmarks) or @pytest.mark.e2e (rehearsals), or test "
            "the piece in process",
            pytrace=False,
        )


# A suite started in the background by a shell without job control (`make test &` in a script,
# nohup) inherits SIGINT ignored (POSIX: such commands ignore SIGINT), and Python keeps it so:
# the tests of Ctrl-C would send theirs into nothing. Python's own handler, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The handlers a test may set only for its own time: a SIGINT handler left behind makes a later
# Ctrl-C test in the same worker (tests/watch/test_drill_command.py) see another terminal.
RESTORED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def signal_handlers_restored(request: pytest.FixtureRequest):
    before = {signum: signal.getsignal(signum) for signum in RESTORED_SIGNALS}
    yield
    left = [
        f"{signal.Signals(signum).name} handler {signal.getsignal(signum)!r} (was {handler!r})"
        for signum, handler in before.items()
        if signal.getsignal(signum) != handler
    ]
    for signum, handler in before.items():
        signal.signal(signum, handler)
    if left:
        pytest.fail(f"{request.node.nodeid} left {'; '.join(left)}: restore it", pytrace=False)


@pytest.fixture(scope="session")
def moto_server():
    """One moto server for the worker's session: a server's start and stop cost about 0.5 s
    (its poll interval), and moto keeps its state per process, across servers and mock_aws."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_endpoint(moto_server: str):
    """A moto server for processes the test starts (s5cmd, node scripts, the rehearsal's proxy),
    on an empty account."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"))
    return moto_server
