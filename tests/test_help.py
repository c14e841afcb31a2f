"""Every command's --help shows each option's default: a user reads what a run does without
reading the code. Each command runs in this process (`main([..., "--help"])`), and the parser it
printed is checked: every option with a default names it in its help line, once."""

import argparse
import contextlib
import importlib
import io
import signal

import pytest

# (the command as a user types it, its module, the arguments before --help)
COMMANDS = [
    ("python -m rehearsal", "rehearsal.__main__", []),
    ("python -m trainer.train", "trainer.train", []),
    ("python -m trainer.preprocess", "trainer.preprocess.__main__", []),
    ("python -m trainer.preprocess.sample", "trainer.preprocess.sample", []),
    ("python -m trainer.preprocess.bench", "trainer.preprocess.bench", []),
    ("python -m trainer.bench_input", "trainer.bench_input", []),
    ("python -m trainer.benchmark", "trainer.benchmark", []),
    ("python -m trainer.proxy", "trainer.proxy", []),
    ("python -m trainer.recipes", "trainer.recipes", []),
    ("python -m stacks.benchmark", "stacks.benchmark", []),
    ("horovod-fleet", "watch.cli", []),
    ("horovod-fleet status", "watch.cli", ["status"]),
    ("horovod-fleet logs", "watch.cli", ["logs"]),
    ("horovod-fleet runs", "watch.cli", ["runs"]),
    ("horovod-fleet leftovers", "watch.cli", ["leftovers"]),
    ("horovod-fleet enable-events", "watch.cli", ["enable-events"]),
    ("horovod-fleet hold", "watch.cli", ["hold"]),
    ("horovod-fleet release", "watch.cli", ["release"]),
    ("horovod-fleet drill", "watch.cli", ["drill"]),
    ("python3 -m bootstrap", "bootstrap.__main__", []),
    ("python3 -m bootstrap.node_config", "bootstrap.node_config", []),
    ("python3 -m bootstrap.preprocess.ready_signal", "bootstrap.preprocess.ready_signal", []),
    ("python3 -m bootstrap.image.jit_env", "bootstrap.image.jit_env", []),
    ("manifest.py write", "bootstrap.image.manifest", ["write"]),
    ("manifest.py validate", "bootstrap.image.manifest", ["validate"]),
    ("manifest.py check-node", "bootstrap.image.manifest", ["check-node"]),
    ("python3 -m bootstrap.image_proof.proof run", "bootstrap.image_proof.proof", ["run"]),
    ("python3 -m bootstrap.image_proof.jit_cache run", "bootstrap.image_proof.jit_cache", ["run"]),
]


def printed_help(module: str, argv: list[str]) -> tuple[argparse.ArgumentParser, str]:
    """Run the command's main with --help; the parser whose help it printed, and the text."""
    printed: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def record(parser, file=None):
        printed.append(parser)
        original(parser, file)

    out = io.StringIO()
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.redirect_stdout(out),
        contextlib.suppress(SystemExit),
    ):
        patch.setattr(argparse.ArgumentParser, "print_help", record)
        # A command's main may set its process's SIGTERM handler; this process keeps its own.
        handler = signal.getsignal(signal.SIGTERM)
        try:
            importlib.import_module(module).main([*argv, "--help"])
        finally:
            signal.signal(signal.SIGTERM, handler)
    assert len(printed) == 1, f"{module} {argv}: printed no help"
    return printed[0], out.getvalue()


def has_default(action: argparse.Action) -> bool:
    return (
        action.help is not argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        and action.default not in (None, argparse.SUPPRESS)
        and action.default is not False
        and (action.option_strings or action.nargs in ("?", "*"))
    )


@pytest.mark.parametrize(("command", "module", "argv"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_help_names_every_default(command, module, argv):
    parser, text = printed_help(module, argv)
    formatter = parser._get_formatter()
    missing = []
    for action in filter(has_default, parser._actions):
        # argparse prints no help line for an option without help, whatever its formatter.
        line = formatter._expand_help(action) if action.help else ""
        if line.count("default") != 1 or str(action.default) not in line:
            missing.append(f"{'/'.join(action.option_strings) or action.dest}={action.default!r}")
    assert not missing, f"`{command} --help` does not show the default of: {', '.join(missing)}"
    assert "(default: None)" not in text and "(default: False)" not in text
