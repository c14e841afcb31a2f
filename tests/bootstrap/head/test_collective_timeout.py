"""A collective timeout names the rank that stopped answering, not the ones that waited for it;
the collective timeout is node.json's, in the launcher's environment.

The two fixtures are real horovodrun output (Horovod 0.28.1, Gloo), recorded once by hand:
`HOROVOD_GLOO_TIMEOUT_SECONDS=5 horovodrun -np N -H localhost:N --gloo python3 -m bootstrap.fleet.rank
python3 loop.py`, loop.py one `hvd.allreduce` per step under tf.function, and one rank's loop.py
SIGSTOPped for 10 s, then SIGCONTed. The tests give them a hostfile of two nodes.

.venv/bin/python -m pytest tests/bootstrap/head/test_collective_timeout.py
"""

from pathlib import Path

import pytest
from bootstrap_helpers import train_doc

from bootstrap.head import launch, watchdog
from bootstrap.head.failures import classify, missing_ranks
from bootstrap.node_config import ConfigError, parse

FIXTURES = Path(__file__).parent / "fixtures"
ONE_RANK_EACH = "10.0.0.5 slots=1\n10.0.0.6 slots=1\n"
TWO_RANKS_EACH = "10.0.0.5 slots=2\n10.0.0.6 slots=2\n"
GLOO = "/tmp/pip/third_party/compatible17_gloo/gloo/transport/tcp/unbound_buffer.cc:81"


def timed_out(rank: int, ms: int = 30000) -> str:
    """The line of a rank whose background loop timed out, as Horovod 0.28.1 prints it."""
    return (
        f"[{rank}]<stderr>:[2026-11-26 07:36:52. 75497: E /tmp/pip/horovod/common/operations.cc:"
        f"697] [{rank}]: Horovod background loop uncaught exception: [{GLOO}] Timed out waiting "
        f"{ms}ms for recv operation to complete"
    )


def test_a_paused_rank_is_named_not_the_rank_that_waited_for_it():
    """Rank 1 paused (SIGSTOP) for longer than the timeout: only rank 0 reports a timeout, and
    rank 1's own output is its wrapper's SIGTERM line."""
    tail = (FIXTURES / "gloo-2-ranks-rank-1-paused.log").read_text()
    failure = classify(tail, ONE_RANK_EACH)
    assert failure.cause == "collective_timeout"
    assert failure.reason == (
        "collective timeout: rank 1 on node 1 (10.0.0.6) stopped answering rank 0 on node 0 "
        "(10.0.0.5), which timed out: Timed out waiting 5000ms for recv operation to complete"
    )


def without_rank(tail: str, rank: int) -> str:
    """The tail as the leader sees it when that rank's ssh connection is cut: nothing from it."""
    return "\n".join(line for line in tail.splitlines() if not line.startswith(f"[{rank}]<"))


@pytest.mark.parametrize("cut_off", [False, True])
def test_a_paused_rank_among_four_is_the_one_that_reported_no_timeout(cut_off):
    """Rank 3 paused: ranks 0, 1 and 2 time out; rank 3, resumed, finds its peers gone
    ('Connection closed by peer'), or prints nothing the leader sees."""
    tail = (FIXTURES / "gloo-4-ranks-rank-3-paused.log").read_text()
    assert "Connection closed by peer" in tail
    failure = classify(without_rank(tail, 3) if cut_off else tail, TWO_RANKS_EACH)
    assert failure.cause == "collective_timeout"
    assert failure.reason == (
        "collective timeout: rank 3 on node 1 (10.0.0.6) stopped answering ranks 0, 1 on node 0 "
        "(10.0.0.5) and rank 2 on node 1 (10.0.0.6), which timed out: Timed out waiting 5000ms "
        "for send operation to complete"
    )


def test_a_partition_where_every_rank_timed_out_names_both_ends():
    tail = "\n".join(
        [timed_out(0), timed_out(1), "Process 0 exit with status code 1.", "Exit code: 1"]
    )
    failure = classify(tail, ONE_RANK_EACH)
    assert failure.cause == "collective_timeout"
    assert failure.reason.startswith(
        "collective timeout: every rank timed out waiting for another (rank 0 on node 0 "
        "(10.0.0.5) and rank 1 on node 1 (10.0.0.6)), so none stalled alone: their nodes "
        "stopped reaching each other (a network partition?): Timed out waiting 30000ms"
    )


STALL_WARNING = (
    "[1,0]<stderr>:[2026-11-26 08:00:00.000001: W /tmp/pip/horovod/common/stall_inspector.cc:107]"
    " One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks"
    " and are waiting for remainder of ranks for more than 60 seconds. This may indicate that "
    "different ranks are trying to submit different tensors or that only subset of ranks is "
    "submitting tensors, which will cause deadlock. "
)


def stall_warning(*listed: str) -> list[str]:
    """Horovod's stall inspector on rank 0 under horovodrun --mpi (Open MPI's tag-output)."""
    return [STALL_WARNING, "[1,0]<stderr>:Missing ranks:", *(f"[1,0]<stderr>:{x}" for x in listed)]


def test_the_stall_inspector_s_last_list_is_read_past_other_ranks_lines():
    lines = [
        *stall_warning("2: [HorovodAllreduce_grads_0]"),
        *stall_warning("1: [HorovodAllreduce_grads_0]"),
        "[1,3]<stdout>:a line of rank 3 between two of rank 0's",
        "[1,0]<stderr>:3!: [HorovodAllreduce_grads_0, HorovodAllreduce_grads_1 ...]",
        '[1,0]<stderr>:One or more rank (marked by "!") is stalled for longer than 120 seconds.',
        "[1,0]<stderr>:4: [HorovodAllreduce_grads_0]",  # after the list ended: not in it
    ]
    assert missing_ranks(lines) == [1, 3]
    assert missing_ranks([timed_out(0)]) == []


def test_the_stall_inspector_s_missing_ranks_win_over_silence():
    """Rank 2 never submitted its tensor (the inspector says so); rank 3 printed nothing either,
    but only rank 2 is named."""
    tail = "\n".join([*stall_warning("2: [HorovodAllreduce_grads_0]"), timed_out(0), timed_out(1)])
    assert classify(tail, TWO_RANKS_EACH).reason.startswith(
        "collective timeout: rank 2 on node 1 (10.0.0.6) stopped answering ranks 0, 1 on node 0 "
        "(10.0.0.5), which timed out"
    )


def test_an_nccl_timeout_is_its_rank_s_not_a_silence_of_the_others():
    """NCCL's errors are per rank: the 15 ranks that printed none are not named as stalled."""
    tail = (
        "[1,3]<stderr>:ip-10-0-0-5:4242:4301 [3] NCCL WARN Net : Connect to 10.0.0.6<43211> "
        "failed : Connection timed out\n"
    )
    assert classify(tail, "10.0.0.5 slots=8\n10.0.0.6 slots=8\n").reason == (
        "collective timeout on rank 3 on node 0 (10.0.0.5): NCCL WARN Net : Connect to "
        "10.0.0.6<43211> failed : Connection timed out"
    )


def test_without_a_hostfile_the_first_rank_to_time_out_is_said():
    assert classify(timed_out(1, 120000)).reason == (
        "collective timeout on rank 1: Timed out waiting 120000ms for recv operation to complete"
    )


def test_a_stalled_training_names_the_ranks_the_stall_inspector_lists(train_config, monkeypatch):
    """A rank stuck in Python: Gloo never times out (the background threads still talk), the
    watchdog ends it, and the reason says which rank the stall inspector found missing."""
    cfg = train_config()
    hostfile = Path(cfg.state_dir) / "hostfile"
    hostfile.parent.mkdir(parents=True, exist_ok=True)
    hostfile.write_text(ONE_RANK_EACH)
    stall_reason = "training stalled: no progress for 601 s (bound 600 s) after global step 7"

    class Stalled:
        reason = stall_reason

        def __init__(self, progress, on_stall):
            pass

        def start(self):
            pass

        def stop(self):
            pass

    def horovodrun(command, env, log_path, keep, on_start=None):
        on_start(None)
        return 143, "\n".join(stall_warning("1: [HorovodAllreduce_grads_0]")) + "\n"

    monkeypatch.setattr(launch, "stream", horovodrun)
    monkeypatch.setattr(launch.watchdog, "ProgressWatchdog", Stalled)
    with pytest.raises(launch.TrainingFailed) as failed:
        launch.run_horovodrun(
            cfg, hostfile, Path("/k"), 2, ["t"], {}, "train.log",
            progress=Path("/p"), log=lambda line: None,
        )  # fmt: skip
    assert str(failed.value) == (
        f"{stall_reason}; Horovod's stall inspector lists rank 1 on node 1 (10.0.0.6) as missing "
        "(details in train.log)"
    )
    assert failed.value.cause == "stalled"


@pytest.mark.parametrize("gpus", [0, 8])
def test_the_collective_timeout_comes_from_node_json(gpus):
    efa = bool(gpus)
    default = launch.launcher_env(parse(train_doc(gpus_per_node=gpus, efa=efa)), {})
    assert default["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "120"
    short = parse(train_doc(gpus_per_node=gpus, efa=efa, collective_timeout_s=20))
    assert launch.launcher_env(short, {})["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "20"
    assert default["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "60"


@pytest.mark.parametrize("value", [0, 2.5, True, "30"])
def test_a_collective_timeout_is_a_whole_number_of_seconds(value):
    """Horovod reads whole seconds (strtol): 2.5 would be 2."""
    with pytest.raises(ConfigError, match="'collective_timeout_s'"):
        parse(train_doc(collective_timeout_s=value))


def test_the_timeout_and_the_stall_check_decide_before_the_progress_watchdog():
    """A timeout names the peer and a stall check the missing ranks; the watchdog knows neither,
    so both must come first."""
    cfg = parse(train_doc())
    assert cfg.collective_timeout_s < watchdog.MIN_STALL_S
    assert launch.STALL_CHECK_S < watchdog.MIN_STALL_S
