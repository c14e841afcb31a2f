"""Benchmark mode on the head: the fleet's throughput and scaling table instead of a training run.

For each size of node.json's `benchmark.sizes` (1 GPU, 1 node, 2, 4, ... nodes), the head starts
`python -m trainer.benchmark` under horovodrun on the first nodes of the hostfile (warm-up steps,
then timed steps of the trainer's own step), then the pre-training allreduce check
(bootstrap.fleet.allreduce_check) on the same ranks, and prints the table row by row. It writes
benchmark.json, benchmark.md and benchmark.png, which go to runs/<run>/ beside the logs
(docs/contracts.md has their format). Scaling efficiency is computed from the timed steps:
img/s at N GPUs over N x the 1-GPU img/s.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from bootstrap import aws
from bootstrap.fleet import allreduce_check, rendezvous
from bootstrap.head import launch
from bootstrap.node.logs import upload_logs
from bootstrap.node_config import Benchmark, BenchmarkSize, TrainConfig
from bootstrap.records import allreduce_summary, results
from contract.runs import stamp_at

FORMAT = "horovod-fleet/benchmark/1"
# trainer/benchmark.py's RESULT_PREFIX (bootstrap never imports trainer/; a test keeps them equal).
RESULT_PREFIX = "benchmark result: "
# node.json mode -> trainer.benchmark --input: generated images copied host to device, or the
# local TFRecords through the real input pipeline.
TRAINER_INPUT = {"synthetic": "host", "data": "data"}
FILES = ("benchmark.json", "benchmark.md", "benchmark.png")
COLUMNS = (
    "GPUs",
    "nodes",
    "img/s",
    "+- (1.96 sd)",
    "img/s per GPU",
    "scaling efficiency",
    "allreduce bus GB/s",
)


class BenchmarkError(launch.TrainingFailed):
    pass


def parse_result(output: str) -> dict | None:
    """The last `benchmark result: {json}` line (after horovodrun's `[1,0]<stdout>:` prefix)."""
    for line in reversed(output.splitlines()):
        _, found, text = line.partition(RESULT_PREFIX)
        if found:
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                return None
    return None


def hostfile_for(hosts: list[str], size: BenchmarkSize) -> str:
    """The first `size.nodes` hosts (node addresses in index order), each with its share of the
    ranks."""
    if size.nodes > len(hosts):
        raise BenchmarkError(f"{size.nodes} node(s) asked for, the fleet has {len(hosts)}")
    return rendezvous.hostfile_text([(ip, size.ranks // size.nodes) for ip in hosts[: size.nodes]])


def make_row(size: BenchmarkSize, result: dict, busbw: float | None, floor: float) -> dict:
    if result.get("ranks") != size.ranks:
        raise BenchmarkError(
            f"trainer.benchmark ran {result.get('ranks')} rank(s), the size asked for {size.ranks}"
        )
    return {
        "gpus": size.ranks,
        "nodes": size.nodes,
        "images_per_s": result["images_per_s"],
        "images_per_s_spread": result["images_per_s_spread"],
        "images_per_s_per_gpu": round(result["images_per_s"] / size.ranks, 2),
        "scaling_efficiency": None,
        "allreduce_busbw_gbps": busbw,
        # The floor is for the network between nodes; inside one node it does not apply.
        "allreduce_below_floor": bool(
            busbw is not None and floor and size.nodes > 1 and busbw < floor
        ),
        "step_images_per_s": result["step_images_per_s"],
    }


def with_efficiency(rows: list[dict]) -> list[dict]:
    """Each row's img/s over (1-GPU img/s x its GPUs): 1.0 is perfect linear scaling."""
    single = next((r for r in rows if r["gpus"] == 1), None)
    for row in rows:
        if single:
            ideal = single["images_per_s"] * row["gpus"]
            row["scaling_efficiency"] = round(row["images_per_s"] / ideal, 4)
    return rows


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table_header() -> str:
    return "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)


def table_row(row: dict) -> str:
    efficiency = row["scaling_efficiency"]
    busbw = _cell(row["allreduce_busbw_gbps"], ".2f")
    if row["allreduce_below_floor"]:
        busbw += " (below floor)"
    cells = (
        str(row["gpus"]),
        str(row["nodes"]),
        _cell(row["images_per_s"], ",.1f"),
        _cell(row["images_per_s_spread"], ",.1f"),
        _cell(row["images_per_s_per_gpu"], ",.1f"),
        "-" if efficiency is None else f"{efficiency:.1%}",
        busbw,
    )
    return "| " + " | ".join(cells) + " |"


def document(cfg: TrainConfig, rows: list[dict], result: dict, versions: dict, now: float) -> dict:
    """benchmark.json (docs/contracts.md)."""
    return {
        "format": FORMAT,
        "run": cfg.run,
        "mode": cfg.benchmark.mode,
        "instance_type": cfg.instance_type,
        "gpus_per_node": cfg.gpus_per_node,
        "settings": {
            key: result.get(key)
            for key in (
                "arch",
                "batch_per_rank",
                "image_size",
                "precision",
                "xla",
                "input",
                "device",
                "warmup_steps",
                "timed_steps",
            )
        },
        "image": versions,
        "rows": rows,
        "finished_at": stamp_at(now),
    }


def markdown(doc: dict) -> str:
    s = doc["settings"]
    versions = ", ".join(f"{k} {v}" for k, v in doc["image"].items() if v)
    return "\n".join(
        [
            f"# Benchmark of run {doc['run']}: {doc['instance_type']}",
            "",
            f"{s['arch']}, batch {s['batch_per_rank']} per GPU, {s['image_size']} px, "
            f"{s['precision']}, XLA {'on' if s['xla'] else 'off'}, input: {doc['mode']} "
            f"({s['input']}); {s['warmup_steps']} warm-up step(s), then img/s is the mean over "
            f"{s['timed_steps']} timed steps, +- 1.96 standard deviations across them. Scaling "
            "efficiency: img/s over (1-GPU img/s x GPUs). Allreduce: bus bandwidth of "
            "bootstrap.fleet.allreduce_check on the same ranks.",
            "",
            table_header(),
            *(table_row(r) for r in doc["rows"]),
            "",
            f"Image: {versions or 'unknown'}. Finished {doc['finished_at']}.",
            "",
        ]
    )


def chart(doc: dict, path: Path) -> None:
    """img/s against GPUs beside ideal linear scaling, and the efficiency, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a node
    from matplotlib import pyplot

    rows = doc["rows"]
    gpus = [r["gpus"] for r in rows]
    figure, rate_axis = pyplot.subplots(figsize=(7, 4.5), dpi=100)
    rate_axis.errorbar(
        gpus,
        [r["images_per_s"] for r in rows],
        yerr=[r["images_per_s_spread"] for r in rows],
        marker="o",
        capsize=3,
        label="img/s (mean +- 1.96 sd)",
    )
    single = next((r for r in rows if r["gpus"] == 1), None)
    if single:
        rate_axis.plot(
            gpus,
            [single["images_per_s"] * g for g in gpus],
            linestyle="--",
            color="grey",
            label="linear from 1 GPU",
        )
    rate_axis.set_xscale("log", base=2)
    rate_axis.set_xticks(gpus, [str(g) for g in gpus])
    rate_axis.set_xlabel("GPUs")
    rate_axis.set_ylabel("images/s")
    efficiency_axis = rate_axis.twinx()
    efficiency_axis.plot(
        gpus,
        [100 * (r["scaling_efficiency"] or 0) for r in rows],
        marker="s",
        color="tab:orange",
        label="scaling efficiency",
    )
    efficiency_axis.set_ylabel("scaling efficiency (%)")
    efficiency_axis.set_ylim(0, 110)
    handles = rate_axis.get_legend_handles_labels()
    more = efficiency_axis.get_legend_handles_labels()
    rate_axis.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left", fontsize=8)
    s = doc["settings"]
    rate_axis.set_title(
        f"{doc['instance_type']}: {s['arch']}, batch {s['batch_per_rank']}/GPU, {s['precision']}, "
        f"{doc['mode']} input",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def write_outputs(doc: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "benchmark.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "benchmark.md").write_text(markdown(doc))
    chart(doc, out_dir / "benchmark.png")
    return [out_dir / name for name in FILES]


def image_versions(manifest: str) -> dict:
    """What the table is a measurement of: the training image's versions (image.json)."""
    try:
        versions = json.loads(Path(manifest).read_text()).get("versions", {})
    except (OSError, ValueError, AttributeError):
        return {}
    keys = ("tensorflow", "horovod", "nccl", "cuda", "cudnn", "nvidia_driver", "aws_ofi_nccl")
    return {k: versions[k] for k in keys if versions.get(k)}


def run_schedule(
    benchmark: Benchmark,
    hosts: list[str],
    work_dir: Path,
    measure: Callable[[BenchmarkSize, Path], str],
    check: Callable[[BenchmarkSize, Path], str],
    floor: float,
    log: Callable[[str], None],
) -> tuple[list[dict], dict]:
    """Every size in order: a hostfile of its first nodes, the timed steps, the allreduce check
    (not on one rank: nothing to reduce). Logs the table as each row completes; returns the
    rows and the last trainer result (its settings)."""
    rows: list[dict] = []
    result: dict = {}
    log("benchmark table:\n" + table_header())
    for size in benchmark.sizes:
        hostfile = work_dir / f"hostfile-{size.nodes}x{size.ranks // size.nodes}"
        hostfile.parent.mkdir(parents=True, exist_ok=True)
        hostfile.write_text(hostfile_for(hosts, size))
        result = parse_result(measure(size, hostfile)) or {}
        if not result:
            raise BenchmarkError(f"trainer.benchmark on {size.ranks} rank(s) printed no result")
        busbw = None
        if size.ranks > 1:
            summary = allreduce_summary.parse_summary(check(size, hostfile))
            busbw = summary["busbw_gbps"] if summary else None
        rows.append(make_row(size, result, busbw, floor))
        with_efficiency(rows)
        log(table_row(rows[-1]))
    return rows, result


def trainer_command(cfg: TrainConfig, data_dir: Path, work_dir: Path) -> list[str]:
    """trainer.benchmark with the run's trainer flags (arch, batch, size, precision, ...)."""
    b = cfg.benchmark
    command = ["python3", "-m", "trainer.benchmark", "--input", TRAINER_INPUT[b.mode]]
    command += ["--warmup-steps", str(b.warmup_steps), "--timed-steps", str(b.timed_steps)]
    command += [*cfg.trainer_flags(), "--model-dir", str(work_dir / "model")]
    if b.mode == "data":
        command += ["--data-dir", str(data_dir)]
    return command


def benchmark_node(
    cfg: TrainConfig,
    hosts: list[str],
    key: Path,
    data_dir: Path,
    log: Callable[[str], None],
    interface: str | None = None,
) -> tuple[dict, list[Path]]:
    """The head's benchmark: the schedule, then the three files in <mount_point>/benchmark/."""
    work_dir = Path(cfg.mount_point) / "benchmark"
    env = launch.launcher_env(cfg, dict(os.environ))
    # The check reports at every size here instead of failing below the floor: a benchmark
    # that stopped at its first slow size would not show where the scaling breaks.
    env.pop(allreduce_check.FLOOR_ENV, None)

    def horovod(size: BenchmarkSize, sized_hostfile: Path, program: list[str], name: str) -> str:
        # Unlike training's, a failure's reason names neither the ranks' hosts nor lost members.
        return launch.run_horovodrun(
            cfg, sized_hostfile, key, size.ranks, program, env, name,
            keep=1_000_000, interface=interface, name_hosts=False,
            details=False, error=BenchmarkError, log=log,
        )  # fmt: skip

    rows, result = run_schedule(
        cfg.benchmark,
        hosts,
        work_dir,
        lambda size, f: horovod(size, f, trainer_command(cfg, data_dir, work_dir), "train.log"),
        lambda size, f: horovod(
            size, f, ["python3", "-m", "bootstrap.fleet.allreduce_check"], "allreduce-check.log"
        ),
        cfg.allreduce_floor_gbps,
        log,
    )
    doc = document(cfg, rows, result, image_versions(cfg.image["manifest"]), time.time())
    return doc, write_outputs(doc, work_dir)


def upload(s3, cfg: TrainConfig, files: list[Path]) -> list[str]:
    """runs/<run>/benchmark.{json,md,png}, the names the stack outputs give."""
    types = {".json": "application/json", ".md": "text/markdown", ".png": "image/png"}
    keys = []
    for path in files:
        key = f"{cfg.runs_prefix}{path.name}"
        s3.put_object(
            Bucket=cfg.bucket, Key=key, Body=path.read_bytes(), ContentType=types[path.suffix]
        )
        keys.append(key)
    return keys


def lead(
    cfg: TrainConfig,
    s3,
    nodes: list[dict],
    key: Path,
    data_dir: Path,
    started: float,
    log,
    step,
    interface: str | None = None,
):
    """What the head does after the rendezvous in benchmark mode, each part a named bootstrap
    step: measure, upload the files and the logs, then DONE.json (the run controller's cue)."""
    hosts = [node["ip"] for node in sorted(nodes, key=lambda node: node["index"])]
    doc, files = step(
        "benchmark", lambda: benchmark_node(cfg, hosts, key, data_dir, log, interface)
    )
    keys = step("upload benchmark", lambda: upload(s3, cfg, files))
    log("benchmark written: " + ", ".join(f"s3://{cfg.bucket}/{k}" for k in keys))
    log("benchmark table:\n" + markdown(doc))
    done = results.done_document(
        cfg, "succeeded", None, None, time.time(), started, written_by="head"
    )
    largest = doc["rows"][-1]
    done |= {"benchmark": cfg.benchmark.mode, "images_per_s": largest["images_per_s"]}
    done["allreduce_busbw_gbps"] = largest["allreduce_busbw_gbps"]
    step("upload logs", lambda: upload_logs(s3, cfg, aws.UNTIL_DONE))
    step("write DONE.json", lambda: results.write_done(s3, cfg, done, started))
    log(f"wrote s3://{cfg.bucket}/{cfg.runs_prefix}DONE.json")
