"""docs/faults-and-recovery.md, docs/benchmark.md, docs/rehearsal.md and docs/layout.md read
against the code, as tests/test_docs.py reads the README (issue 50): the timeouts and who applies
them, who measures the benchmark and what synthesis prints for it, the rehearsal's defaults, what
the layout promises. Each figure is taken from the module that decides it."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def prose(name: str) -> str:
    """A page as one line of words: wrapping never splits what a test looks for."""
    return " ".join((DOCS / name).read_text().split())


# --- docs/faults-and-recovery.md ------------------------------------------------------------


def test_a_silent_peer_costs_the_head_s_elastic_timeout_and_a_reset():
    from bootstrap.head.elastic import ELASTIC_COLLECTIVE_TIMEOUT_S
    from bootstrap.node_config import COLLECTIVE_TIMEOUT_S

    text = prose("faults-and-recovery.md")
    ssh = (ROOT / "bootstrap" / "head" / "ssh.sh").read_text()
    interval = int(re.search(r"ServerAliveInterval=(\d+)", ssh)[1])
    missed = int(re.search(r"ServerAliveCountMax=(\d+)", ssh)[1])
    # The lost-node table: a node's network cut silently.
    assert (
        f"Gloo's collectives wait at most {ELASTIC_COLLECTIVE_TIMEOUT_S} s "
        f"(`HOROVOD_GLOO_TIMEOUT_SECONDS`), the head's ssh to it at most {interval * missed} s "
        f"more (keep-alives every {interval} s, {missed} missed), then the same reset"
    ) in text
    # The three clocks: the training's timeout costs a reset, node.json's a relaunch, outside it.
    clock = text[
        text.index("**The collective timeout**") : text.index("**Horovod's stall inspector**")
    ]
    assert f"waits at most {ELASTIC_COLLECTIVE_TIMEOUT_S} s on a silent peer" in clock
    assert "the nodes left reset" in clock and "not an attempt" in clock
    assert f"`collective_timeout_s` (default {COLLECTIVE_TIMEOUT_S} s" in clock
    assert "the fleet's allreduce check and the benchmark" in clock
    assert not re.search(r"120 s collective timeout and a relaunch", text)


def test_the_lost_node_table_s_figures_are_the_code_s():
    from bootstrap.head.watchdog import MIN_STALL_S, STALL_FACTOR
    from contract.names import REPLACEMENTS_PER_NODE
    from stacks.train.node_document import HEARTBEAT_TIMEOUT_S
    from stacks.train.stack import ELASTIC_TIMEOUT_S

    text = prose("faults-and-recovery.md")
    assert f"waits `elastic_timeout_s` ({ELASTIC_TIMEOUT_S} s) for `minNodes` nodes" in text
    assert f"more resets than `reset_limit` (`nodes` x {2 * REPLACEMENTS_PER_NODE + 1}:" in text
    assert f"`heartbeat_timeout_s` ({HEARTBEAT_TIMEOUT_S} s)" in text
    assert (
        f"for {STALL_FACTOR:g} times the longest gap the run has shown between two log steps "
        f"(at least {MIN_STALL_S / 60:g} minutes" in text
    )


# --- docs/benchmark.md ----------------------------------------------------------------------


def test_the_head_measures_the_benchmark_and_prints_the_table():
    text = prose("benchmark.md")
    assert "the head (the fleet's CPU instance, which runs horovodrun and no rank" in text
    assert "The head's log prints the table as each row completes" in text
    assert not re.search(r"node 0 (measures|'s log)|Node 0's log", text)
    source = (ROOT / "bootstrap" / "head" / "benchmark.py").read_text()
    assert "Benchmark mode on the head" in source and 'log("benchmark table:' in source


def test_benchmark_md_quotes_what_synthesis_prints():
    from app import estimates
    from stacks import benchmark
    from stacks.config import FleetConfig
    from stacks.instance_types import GPU_TYPES

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    printed = estimates(FleetConfig.from_context(context | {"benchmark": "true"}))
    page = (DOCS / "benchmark.md").read_text()
    quoted = re.findall(r"^      ((?:TrainStack|Benchmark) .*)$", page, re.M)
    assert quoted and all(line in printed for line in quoted), (quoted, printed)
    assert any(line.startswith("Benchmark (synthetic images)") for line in quoted)
    # The estimate's parts, as the page gives them for 8 p4d nodes.
    p4d = GPU_TYPES["p4d.24xlarge"]
    text = prose("benchmark.md")
    assert (
        f"{benchmark.boot_s('synthetic', p4d, 8) / 60:.1f} minutes to boot "
        f"({benchmark.boot_s('data', p4d, 8) / 60:.1f} with `benchmark=data`" in text
    )
    assert f"{benchmark.PER_SIZE_S / 60:g} minutes per size" in text
    assert f"and {benchmark.TEARDOWN_S / 60:g} to tear down" in text
    assert f"`maxHours` defaults to {benchmark.MAX_HOURS:g} in this mode" in text
    assert (
        f"for {benchmark.WARMUP_STEPS} warm-up steps, then times {benchmark.TIMED_STEPS} steps"
        in text
    )


# --- docs/rehearsal.md ----------------------------------------------------------------------


def test_the_rehearsal_s_synopsis_has_every_option_and_its_default():
    from rehearsal.__main__ import build_parser

    text = prose("rehearsal.md")
    synopsis = re.search(r"`python -m rehearsal (.*?)`, each number its default", text)[1]
    numbers = {o: float(v) for o, v in re.findall(r"\[(--[\w-]+) (\d+(?:\.\d+)?)\]", synopsis)}
    checked = []
    for action in build_parser()._actions:
        option = next((o for o in action.option_strings if o.startswith("--")), None)
        if option in (None, "--help"):
            continue
        assert option in synopsis, f"docs/rehearsal.md's synopsis lacks {option}"
        if option in numbers:
            assert numbers[option] == action.default, (option, numbers[option], action.default)
            checked.append(option)
        else:  # a switch, or a value shown by its metavar (a path, a rate whose 0 means none)
            number = isinstance(action.default, int) and not isinstance(action.default, bool)
            assert action.metavar or not number, f"the synopsis lacks {option}'s default"
    assert {"--nodes", "--epochs", "--max-restarts", "--timeout"} <= set(checked), checked
    assert "--max-restarts 2" not in text


# --- docs/layout.md -------------------------------------------------------------------------


def test_layout_md_says_it_lists_folders_not_every_module():
    """It names the modules to read first; a page that promised every module left out 47."""
    intro = prose("layout.md").split("| path |")[0]
    assert "Every folder of code" in intro and "not every module" in intro
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "every folder and module" not in readme.lower()
    assert "Every module:" not in readme


# --- the README's first screen: what stays billed -------------------------------------------


def test_the_readme_s_monthly_figures_are_docs_cost_md_s():
    """Line 5's "back to a bill of ..." and line 15's figures, from cost.md's summary of what
    stays billed after a run (a page said "a few dollars a month" where the next said $30)."""
    readme = " ".join((ROOT / "README.md").read_text().splitlines()[:20])
    cost = prose("cost.md")
    summary = cost[cost.index("So a finished ImageNet run left as it is") :][:400]
    said = re.findall(r"\$(\d+) a month", readme)
    assert len(said) >= 2 and "a few dollars" not in readme, said
    for figure in said:
        assert f"about ${figure}" in summary, (figure, summary)
