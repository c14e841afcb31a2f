"""The tier guard (tests/conftest.py) on tests of its own: a default-tier test whose process
runs horovodrun or loads TensorFlow fails, naming it; marked slow, the same test passes.

TensorFlow's library is recognised by name in a process's memory map, so a child that maps a
file of that name stands in for one that imported TensorFlow (seconds cheaper)."""

import signal
import sys
from pathlib import Path

import pytest
from tier_guard import TENSORFLOW_LIBRARY, TEST_ENV

TESTS = Path(__file__).parent
HELPERS = ("tier_guard", "synthesis")  # the modules tests/conftest.py imports


def with_this_conftest(pytester) -> None:
    """The inner suite gets tests/conftest.py and the modules it imports."""
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(**{name: (TESTS / f"{name}.py").read_text() for name in HELPERS})


GUARDED = f"""
import subprocess
import signal
import sys
from pathlib import Path
import pytest

# What the guard must see: a process that maps TensorFlow's library, and horovodrun's script.
MAPS_TENSORFLOW = '''
import mmap, sys, time
with open(sys.argv[1], "rb") as library:
    mapped = mmap.mmap(library.fileno(), 0, prot=mmap.PROT_READ)
    time.sleep(1)
'''
SLEEPS = "import time; time.sleep(1)"

def child(*args):
    subprocess.run([{sys.executable!r}, "-c", *args], check=True)

def test_tensorflow_in_the_default_tier(tmp_path):
    library = tmp_path / {TENSORFLOW_LIBRARY + ".2"!r}
    library.write_bytes(b"\\0" * 4096)
    child(MAPS_TENSORFLOW, str(library))

def horovodrun(tmp_path):
    # The installed horovodrun on the command line, as Python runs it; a sleep in its place.
    installed = Path({sys.executable!r}).parent / "horovodrun"
    child(SLEEPS, str(installed), "-np", "2")

def test_a_stub_named_horovodrun_in_the_default_tier(tmp_path):
    stub = tmp_path / "horovodrun"
    stub.write_text(SLEEPS)
    subprocess.run([{sys.executable!r}, str(stub), "-np", "2"], check=True)

def test_horovodrun_in_the_default_tier(tmp_path):
    horovodrun(tmp_path)

@pytest.mark.slow
def test_horovodrun_in_the_slow_tier(tmp_path):
    horovodrun(tmp_path)

def test_a_plain_child_process():
    child(SLEEPS)
"""


def test_the_default_tier_refuses_tensorflow_and_horovodrun_processes(pytester, monkeypatch):
    monkeypatch.delenv(TEST_ENV)  # the inner tests' processes are theirs to judge, not ours
    with_this_conftest(pytester)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    e2e: e2e\n")
    pytester.makepyfile(test_guarded=GUARDED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_tensorflow_in_the_default_tier*",
            "*started a process that loaded TensorFlow (pid *",
            "*ERROR at teardown of test_horovodrun_in_the_default_tier*",
            "*started horovodrun (pid *: * -c import time; time.sleep(1) */bin/horovodrun -np 2)*",
        ]
    )
    result.stdout.fnmatch_lines(["PASSED test_guarded.py::test_horovodrun_in_the_slow_tier"])
    result.stdout.fnmatch_lines(["PASSED test_guarded.py::test_a_plain_child_process"])
    result.stdout.fnmatch_lines(["PASSED test_guarded.py::test_a_stub_named_horovodrun_*"])


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_test_marked_e2e_outside_tests_rehearsal_fails_naming_itself(pytester, workers):
    """`make test-e2e` collects tests/rehearsal alone (Makefile): an e2e test elsewhere would go
    unrun there, so a run that deselects e2e tests (`make test`, on xdist's workers) fails it,
    named. Here the inner suite's conftest.py is at its root, so its e2e folder is rehearsal/."""
    with_this_conftest(pytester)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    e2e: e2e\n")
    marked = "import pytest\n\n\n@pytest.mark.e2e\ndef test_whole_run():\n    pass\n"
    (pytester.path / "rehearsal").mkdir()
    (pytester.path / "rehearsal" / "test_in_place.py").write_text(marked)
    stray = pytester.makepyfile(test_stray=marked + "\n\ndef test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not e2e", *workers)
    result.assert_outcomes(failed=1, passed=1)  # test_plain; rehearsal/'s test is deselected
    result.stdout.fnmatch_lines(
        ["test_stray.py::test_whole_run: marked e2e outside rehearsal/, which is all *"]
    )
    stray.unlink()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "e2e", "rehearsal")
    result.assert_outcomes(passed=1)


LEAVES_A_HANDLER = """
import signal

def test_leaves_sigint_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)

def test_restores_its_sigterm_handler():
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, previous)

def test_after_it_python_s_own_ctrl_c_again():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
"""


def test_a_test_that_leaves_a_signal_handler_behind_fails_and_the_next_sees_it_restored(pytester):
    with_this_conftest(pytester)
    pytester.makepyfile(test_handlers=LEAVES_A_HANDLER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_leaves_sigint_ignored left SIGINT handler <Handlers.SIG_IGN: 1> (was *: restore it*"
        ]
    )


def test_a_suite_started_with_sigint_ignored_has_python_s_ctrl_c(pytester):
    """A shell's background job without job control starts with SIGINT ignored, and so would
    every worker's Ctrl-C tests (tests/watch/test_drill_command.py) without conftest.py's reset."""
    with_this_conftest(pytester)
    pytester.makepyfile(
        test_ctrl_c="import signal\n\n\ndef test_ctrl_c():\n"
        "    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the child inherits
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    finally:
        signal.signal(signal.SIGINT, previous)
    result.assert_outcomes(passed=1)


RECORDS_ITS_WORKER = """
import os
import time
from pathlib import Path

def test_records_its_worker():
    Path({out!r}, {name!r}).write_text(os.environ["PYTEST_XDIST_WORKER"])
    time.sleep({busy_s})  # a file that keeps its worker busy: the next unit goes elsewhere
"""


@pytest.mark.slow  # the slow tier's scheduling (Makefile test-slow); xdist starts two workers
def test_the_files_that_start_ranks_are_one_work_unit_on_one_worker(pytester, tmp_path):
    """Under `--dist loadfile`, xdist's own scheduler sends these two files, collected one after
    the other and each keeping its worker busy, to two workers; conftest.py's sends them to one.
    The other files stay a unit each."""
    with_this_conftest(pytester)
    names = ["test_train_elastic.py", "test_train_horovod.py", "test_a.py", "test_b.py"]
    folder = pytester.path / "tests" / "trainer"
    folder.mkdir(parents=True)
    for name in names:
        busy_s = 1 if "train" in name else 0
        (folder / name).write_text(
            RECORDS_ITS_WORKER.format(out=str(tmp_path), name=name, busy_s=busy_s)
        )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"
    )
    result.assert_outcomes(passed=4)
    worker = {name: (tmp_path / name).read_text() for name in names}
    assert worker["test_train_elastic.py"] == worker["test_train_horovod.py"], worker
    assert len(set(worker.values())) == 2, worker  # the other files went to the other worker
