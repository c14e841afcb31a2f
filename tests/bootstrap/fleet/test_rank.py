"""bootstrap.fleet.rank: a rank's program in its node's own environment."""

import signal
import subprocess
import sys

from bootstrap.fleet import rank
from bootstrap.fleet.rank import NODE_ENV, node_env


def test_the_nodes_own_settings_go_over_the_launchers(tmp_path):
    path = tmp_path / "node.env"
    path.write_text(
        "# from bootstrap.image.jit_env\nCUDA_CACHE_PATH=/opt/cache/535\nTF_XLA_FLAGS=--a=b\n\n"
    )
    env = {NODE_ENV: str(path), "CUDA_CACHE_PATH": "/head/none", "PATH": "/bin"}
    assert node_env(env) == {
        NODE_ENV: str(path), "CUDA_CACHE_PATH": "/opt/cache/535", "TF_XLA_FLAGS": "--a=b",
        "PATH": "/bin",
    }  # fmt: skip
    assert node_env({NODE_ENV: str(tmp_path / "none"), "A": "1"}) == {
        NODE_ENV: str(tmp_path / "none"),
        "A": "1",
    }
    assert node_env({"A": "1"}) == {"A": "1"}


def test_the_program_sees_them(tmp_path):
    path = tmp_path / "node.env"
    path.write_text("CUDA_CACHE_MAXSIZE=4294967296\n")
    program = [sys.executable, "-c", "import os; print(os.environ['CUDA_CACHE_MAXSIZE'])"]
    result = subprocess.run(
        [sys.executable, "-m", "bootstrap.fleet.rank", *program],
        env={NODE_ENV: str(path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    assert result.stdout == "4294967296\n"


def test_main_gives_its_caller_its_signal_handlers_back():
    # It once left its SIGINT handler (pass it on to a child long gone) in the test process,
    # and a later Ctrl-C test in the same worker saw no KeyboardInterrupt.
    watched = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = {signum: signal.getsignal(signum) for signum in watched}
    assert rank.main(["bash", "-c", "exit 0"]) == 0
    assert {signum: signal.getsignal(signum) for signum in watched} == before
