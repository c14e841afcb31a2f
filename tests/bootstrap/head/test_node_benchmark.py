"""Node 0's benchmark: the schedule, rows, efficiency from the timed steps, and the three files.

.venv/bin/python -m pytest tests/bootstrap/head/test_node_benchmark.py
"""

import json

import pytest
from bootstrap_helpers import train_doc

from bootstrap.head import benchmark
from bootstrap.node_config import Benchmark, BenchmarkSize, ConfigError, parse
from bootstrap.records import allreduce_summary

PLAN = {
    "mode": "synthetic",
    "sizes": [{"nodes": 1, "ranks": 1}, {"nodes": 1, "ranks": 8}, {"nodes": 2, "ranks": 16}],
    "warmup_steps": 10,
    "timed_steps": 100,
}


def trainer_output(ranks: int, step_rates: list[float]) -> str:
    """What horovodrun prints from rank 0 of trainer.benchmark (the summary is computed here
    the way trainer.benchmark.summarise does, from the per-step figures)."""
    mean = sum(step_rates) / len(step_rates)
    result = {
        "ranks": ranks,
        "images_per_s": mean,
        "images_per_s_spread": 1.0,
        "step_images_per_s": step_rates,
        "arch": "resnet50",
        "batch_per_rank": 256,
        "image_size": 224,
        "precision": "fp16",
        "xla": True,
        "input": "host",
        "device": "gpu",
        "warmup_steps": 10,
        "timed_steps": len(step_rates),
    }
    return f"[1,0]<stdout>:Total img/sec\n[1,0]<stdout>:{benchmark.RESULT_PREFIX}{json.dumps(result)}\n"


def test_node_json_benchmark_parses():
    cfg = parse(train_doc(benchmark=PLAN))
    assert cfg.benchmark == Benchmark(
        "synthetic", (BenchmarkSize(1, 1), BenchmarkSize(1, 8), BenchmarkSize(2, 16)), 10, 100
    )
    assert parse(train_doc()).benchmark is None
    assert parse(train_doc(benchmark=None)).benchmark is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sizes": [{"nodes": 3, "ranks": 24}]}, "'benchmark.sizes[0].nodes' must be <= 2"),
        ({"sizes": [{"nodes": 1, "ranks": 16}]}, "at most 8 per node (one per GPU)"),
        ({"sizes": [{"nodes": 2, "ranks": 3}]}, "must be a multiple of nodes (2)"),
        ({"sizes": []}, "must list at least one size"),
        ({"mode": "true"}, "'benchmark.mode' must be 'synthetic' or 'data'"),
        ({"timed_steps": 1}, "'benchmark.timed_steps' must be >= 2"),
    ],
)
def test_a_size_beyond_the_fleet_or_its_gpus_is_refused(change, message):
    with pytest.raises(ConfigError) as error:
        parse(train_doc(benchmark={**PLAN, **change}))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_parse_result_reads_rank_zeros_last_line():
    assert benchmark.parse_result(trainer_output(8, [10.0, 20.0]))["images_per_s"] == 15.0
    assert benchmark.parse_result("Traceback ...\nerror: out of memory\n") is None
    assert benchmark.parse_result(f"{benchmark.RESULT_PREFIX}{{not json") is None


def test_result_prefix_mirrors_the_trainer():
    from trainer.benchmark import RESULT_PREFIX  # only the test may import trainer/

    assert benchmark.RESULT_PREFIX == RESULT_PREFIX


def test_hostfiles_take_the_first_nodes_and_merge_shared_addresses():
    hosts = ["10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8"]
    assert benchmark.hostfile_for(hosts, BenchmarkSize(1, 1)) == "10.0.0.5 slots=1\n"
    assert benchmark.hostfile_for(hosts, BenchmarkSize(2, 16)) == (
        "10.0.0.5 slots=8\n10.0.0.6 slots=8\n"
    )
    assert benchmark.hostfile_for(["127.0.0.1"] * 2, BenchmarkSize(2, 4)) == "127.0.0.1 slots=4\n"
    with pytest.raises(benchmark.BenchmarkError, match="2 node"):
        benchmark.hostfile_for(hosts[:1], BenchmarkSize(2, 2))


def run_fake_schedule(tmp_path, step_rates: dict[int, list[float]], busbw: dict[int, float]):
    measured, checked, logged = [], [], []

    def measure(size, hostfile):
        measured.append((size, hostfile.read_text()))
        return trainer_output(size.ranks, step_rates[size.ranks])

    def check(size, hostfile):
        checked.append(size.ranks)
        return (
            allreduce_summary.summary_line(size.ranks, size.nodes, busbw[size.ranks], 256, 10)
            + "\n"
        )

    cfg = parse(train_doc(benchmark=PLAN))
    hosts = ["10.0.0.5", "10.0.0.6"]
    rows, result = benchmark.run_schedule(
        cfg.benchmark, hosts, tmp_path, measure, check, 3.0, logged.append
    )
    return rows, result, measured, checked, logged


def test_efficiency_is_computed_from_the_timed_steps(tmp_path):
    rates = {1: [1000.0, 1200.0], 8: [8000.0, 9600.0], 16: [14000.0, 15000.0]}
    rows, _, measured, checked, logged = run_fake_schedule(tmp_path, rates, {8: 90.0, 16: 2.5})
    assert [(r["gpus"], r["nodes"]) for r in rows] == [(1, 1), (8, 1), (16, 2)]
    assert [r["images_per_s"] for r in rows] == [1100.0, 8800.0, 14500.0]
    assert [r["scaling_efficiency"] for r in rows] == [1.0, 1.0, round(14500 / (1100 * 16), 4)]
    assert rows[2]["images_per_s_per_gpu"] == round(14500 / 16, 2)
    # The allreduce check runs where there is something to reduce, and its figure is parsed.
    assert checked == [8, 16]
    assert [r["allreduce_busbw_gbps"] for r in rows] == [None, 90.0, 2.5]
    # 2.5 GB/s across nodes is below the node document's 3 GB/s floor: marked, not fatal.
    assert [r["allreduce_below_floor"] for r in rows] == [False, False, True]
    assert [text for _, text in measured] == [
        "10.0.0.5 slots=1\n",
        "10.0.0.5 slots=8\n",
        "10.0.0.5 slots=8\n10.0.0.6 slots=8\n",
    ]
    # The log has the header, then one row as each size completes.
    assert logged[0].endswith(benchmark.table_header())
    assert logged[1].startswith("| 1 | 1 | 1,100.0 |") and "100.0%" in logged[1]
    assert logged[3].startswith("| 16 | 2 | 14,500.0 |") and "82.4%" in logged[3]
    assert "2.50 (below floor)" in logged[3]


def test_a_size_without_a_result_fails_the_benchmark(tmp_path):
    cfg = parse(train_doc(benchmark=PLAN))
    with pytest.raises(benchmark.BenchmarkError, match="on 1 rank"):
        benchmark.run_schedule(
            cfg.benchmark, ["10.0.0.5"], tmp_path, lambda s, f: "error: x", None, 0, print
        )


def test_a_result_for_other_ranks_is_refused():
    with pytest.raises(benchmark.BenchmarkError, match="ran 4 rank"):
        benchmark.make_row(BenchmarkSize(1, 8), {"ranks": 4}, None, 0)


def test_outputs_json_markdown_and_png(tmp_path):
    rates = {1: [100.0, 100.0], 8: [700.0, 740.0], 16: [1300.0, 1400.0]}
    rows, result, *_ = run_fake_schedule(tmp_path / "work", rates, {8: 50.0, 16: 8.0})
    image = tmp_path / "image.json"
    image.write_text(json.dumps({"versions": {"tensorflow": "2.15.1", "nccl": "2.23.4"}}))
    cfg = parse(train_doc(benchmark=PLAN))
    versions = benchmark.image_versions(str(image))
    doc = benchmark.document(cfg, rows, result, versions, 1_800_000_000.0)
    files = benchmark.write_outputs(doc, tmp_path / "out")
    assert [f.name for f in files] == ["benchmark.json", "benchmark.md", "benchmark.png"]
    written = json.loads(files[0].read_text())
    assert written["format"] == "horovod-fleet/benchmark/1"
    assert written["instance_type"] == "p4d.24xlarge"
    assert written["image"] == {"tensorflow": "2.15.1", "nccl": "2.23.4"}
    assert written["settings"]["precision"] == "fp16" and written["rows"] == rows
    table = files[1].read_text()
    assert "| GPUs | nodes | img/s |" in table
    assert "| 16 | 2 | 1,350.0 | 1.0 | 84.4 | 84.4% | 8.00 |" in table
    assert "tensorflow 2.15.1" in table
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert benchmark.image_versions(str(tmp_path / "missing.json")) == {}


def test_trainer_command_carries_the_run_settings(tmp_path):
    cfg = parse(train_doc(benchmark={**PLAN, "mode": "data"}))
    command = benchmark.trainer_command(cfg, tmp_path / "tfrecords", tmp_path / "b")
    assert command[:5] == ["python3", "-m", "trainer.benchmark", "--input", "data"]
    assert "--warmup-steps" in command and "--timed-steps" in command
    assert command[command.index("--batch-size") + 1] == "256"
    assert command[-2:] == ["--data-dir", str(tmp_path / "tfrecords")]
    synthetic = benchmark.trainer_command(parse(train_doc(benchmark=PLAN)), tmp_path, tmp_path)
    assert synthetic[4] == "host" and "--data-dir" not in synthetic
