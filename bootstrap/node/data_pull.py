"""Pull the TFRecords with s5cmd and verify them against manifest.json.

Verification checks what the manifest promises: every shard present with its byte size, its
record count (TFRecord framing, read without TensorFlow) and its sha256 when given; the split
totals add up. A verified pull leaves a marker holding the manifest's digest and the attempt it
was verified in, so the same attempt's bootstrap restarted in place skips the pull, and a node
that comes back in place for a new attempt (rebooted: its instance store kept) verifies every
shard it holds again. The pull copies the manifest's shards by name (no listing that could fail
silently) and only those that are missing or fail their check, so a rerun repairs a shard that
was corrupt, even one of the right size, and fetches nothing for a dataset that is whole.

The pull takes this node's own shards first (what its ranks read first), and verifies each shard
as it arrives, beside the downloads still running: a shard is downloaded under .partial/ and
renamed into the data dir only once it matches the manifest, so a file present under its own
name is whole (docs/contracts.md). bootstrap/node/dataset.py runs it beside the node's start-up.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bootstrap import aws, causes, transfer
from bootstrap.aws import poll_until

WAIT_NOTE_EVERY_S = 600  # how often a waiting node says what it waits for

VERIFIED_MARKER = ".verified-manifest-sha256"


class VerificationError(RuntimeError):
    """The dataset here or in S3 differs from its manifest."""

    cause = causes.CORRUPT_SHARD


def count_records(path: Path) -> int:
    """Records in a TFRecord file: 8-byte length, 4-byte CRC, data, 4-byte CRC per record."""
    count, size = 0, path.stat().st_size
    with path.open("rb") as f:
        offset = 0
        while offset < size:
            header = f.read(8)
            if len(header) < 8:
                raise VerificationError(f"{path.name}: truncated record header at byte {offset}")
            (length,) = struct.unpack("<Q", header)
            offset += 12 + length + 4
            if offset > size:
                raise VerificationError(f"{path.name}: truncated record at byte {offset}")
            f.seek(offset)
            count += 1
    return count


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def check_shard(data_dir: Path, shard: dict) -> str | None:
    """One problem with a shard, or None."""
    path = data_dir / shard["file"]
    if not path.is_file():
        return f"{shard['file']}: missing"
    if "bytes" in shard and path.stat().st_size != shard["bytes"]:
        return f"{shard['file']}: {path.stat().st_size} bytes, manifest says {shard['bytes']}"
    try:
        records = count_records(path)
    except VerificationError as exc:
        return str(exc)
    if records != shard["records"]:
        return f"{shard['file']}: {records} records, manifest says {shard['records']}"
    if shard.get("sha256") and sha256_of(path) != shard["sha256"]:
        return f"{shard['file']}: sha256 differs from the manifest"
    return None


def check_shards(data_dir: Path, shards: list[dict], workers: int | None = None) -> list[str]:
    """The problems of every shard ([] when all are fine), hashing in threads: hashlib releases
    the GIL on large updates, and threads fork nothing from a bootstrap that runs several."""
    with ThreadPoolExecutor(workers or os.cpu_count()) as pool:
        return [p for p in pool.map(check_shard, [data_dir] * len(shards), shards) if p]


# Downloads land here and move to <data-dir>/<file> only once verified: a shard present under
# its own name is whole. Hidden, so a trainer listing the data dir never sees one half there.
PARTIAL_DIR = ".partial"


@dataclass
class Pulled:
    """What a pull did: its manifest, the bytes it downloaded, and when it began, held this
    node's own shards, and ended."""

    manifest: dict
    bytes: int
    started: float
    own_at: float
    finished: float


def own_files(manifest: dict, node_index: int, nodes: int, slots: int) -> set[str]:
    """The shards node `node_index`'s ranks read first: in the fleet's first world its ranks
    are node_index*slots .. +slots-1 of nodes*slots, and rank r of S reads, of each split's
    files sorted by name, files[r::S], or with fewer files than ranks file r % F (the trainer's
    rule, trainer/data.py shard_for_rank; docs/contracts.md)."""
    size = nodes * slots
    ranks = range(node_index * slots, (node_index + 1) * slots)
    by_split: dict[str, list[str]] = {}
    for shard in manifest.get("shards") or []:
        by_split.setdefault(shard["split"], []).append(shard["file"])
    own: set[str] = set()
    for files in by_split.values():
        files.sort()
        for rank in ranks:
            own.update(files[rank::size] if len(files) >= size else [files[rank % len(files)]])
    return own


def pull_dataset(
    bucket: str,
    prefix: str,
    data_dir: str | Path,
    log,
    workers: int | None = None,
    own: Callable[[dict], set[str]] = lambda manifest: set(),
    on_own: Callable[[float], None] = lambda at: None,
    verified_for: str = "",
) -> Pulled:
    """Copy the manifest's shards from s3://bucket/prefix to data_dir unless this manifest was
    verified there already for `verified_for` (the run and attempt: a node's bootstrap
    restarted in place within it); re-fetch any shard that fails its check. The shards
    own(manifest) names come first: on_own(at) is called once they are all verified here, while
    the rest still comes. Each shard is verified as it arrives and renamed into place only when
    whole."""
    started = time.time()
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    marker = data_dir / VERIFIED_MARKER
    new_manifest = data_dir / "manifest.json.new"
    new_manifest.unlink(missing_ok=True)
    log(
        f"reading s3://{bucket}/{prefix}manifest.json (S3 outages are retried for up to "
        f"{aws.STEP_POLICY.budget_s:.0f} s, each call times out)"
    )
    aws.with_retries(
        f"reading s3://{bucket}/{prefix}manifest.json",
        lambda: transfer.run_s5cmd("cp", f"s3://{bucket}/{prefix}manifest.json", str(new_manifest)),
    )
    if not new_manifest.is_file():
        raise VerificationError(f"s5cmd exited 0 but did not write {new_manifest}")
    digest = hashlib.sha256(new_manifest.read_bytes()).hexdigest()
    verified = f"{digest} {verified_for}".strip()
    if marker.exists() and marker.read_text() == verified:
        new_manifest.unlink()
        log(f"data already pulled and verified in {data_dir}: skipping the pull")
        now = time.time()
        on_own(now)
        return Pulled(json.loads((data_dir / "manifest.json").read_text()), 0, started, now, now)
    marker.unlink(missing_ok=True)
    manifest = json.loads(new_manifest.read_text())
    if problems := manifest_problems(manifest):
        raise VerificationError(
            "; ".join(problems[:5]) + f" (s3://{bucket}/{prefix}manifest.json: fix it there)"
        )
    shards = manifest["shards"]
    mine = own(manifest)
    present = [s for s in shards if (data_dir / s["file"]).is_file()]
    bad = {p.split(":", 1)[0] for p in check_shards(data_dir, present, workers)}
    for name in bad:
        (data_dir / name).unlink()
    # The trainer reads the manifest first (its shard list): in place before any shard is.
    new_manifest.replace(data_dir / "manifest.json")
    wanted = [s for s in shards if s["file"] in bad or s not in present]
    kept = len(shards) - len(wanted)
    log(
        f"pulling {len(wanted)} of {len(shards)} shards from s3://{bucket}/{prefix} to {data_dir}"
        + (f" ({kept} already here and verified" if kept else "")
        + (
            f", {len(bad)} re-fetched because they failed their check)"
            if bad
            else ")"
            if kept
            else ""
        )
        + (f", this node's own {len(mine)} first" if mine and wanted else "")
    )
    fetch = _Fetch(bucket, prefix, data_dir, workers)
    fetch.shards(
        [s for s in wanted if s["file"] in mine],
        f"pulling this node's shards of s3://{bucket}/{prefix}",
    )
    own_at = time.time()
    on_own(own_at)
    fetch.shards([s for s in wanted if s["file"] not in mine], f"pulling s3://{bucket}/{prefix}")
    shutil.rmtree(data_dir / PARTIAL_DIR, ignore_errors=True)
    marker.write_text(verified)
    total = sum(s["records"] for s in shards)
    log(
        f"pulled and verified {len(shards)} shards, {total} records in {data_dir}"
        f" ({fetch.bytes} bytes fetched)"
    )
    return Pulled(manifest, fetch.bytes, started, own_at, time.time())


class _Fetch:
    """Downloads shards into PARTIAL_DIR, verifies each as it arrives (beside the downloads
    still running) and renames it into the data dir only when it matches the manifest."""

    def __init__(self, bucket: str, prefix: str, data_dir: Path, workers: int | None):
        self.bucket, self.prefix, self.data_dir = bucket, prefix, data_dir
        self.partial = data_dir / PARTIAL_DIR
        self.workers = workers or os.cpu_count() or 1
        self.bytes = 0

    def shards(self, shards: list[dict], what: str) -> None:
        if not shards:
            return
        by_name = {s["file"]: s for s in shards}
        shutil.rmtree(self.partial, ignore_errors=True)  # a killed pull's leftovers
        self.partial.mkdir()
        with ThreadPoolExecutor(self.workers) as pool:
            checks = []
            transfer.download(
                self.bucket, self.prefix, {n: s["bytes"] for n, s in by_name.items()},
                self.partial, what,
                on_arrival=lambda name: checks.append(pool.submit(self.place, by_name[name])),
            )  # fmt: skip
            problems = [p for p in (c.result() for c in checks) if p]
        self.bytes += sum(s["bytes"] for s in shards)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise VerificationError(
                "; ".join(problems[:5]) + more + f" (the copy in s3://{self.bucket}/"
                f"{self.prefix} differs from its manifest: fix it there and rerun; a rerun "
                "fetches only what fails its check)"
            )

    def place(self, shard: dict) -> str | None:
        """Verify a downloaded shard; rename it into place, or delete it and say why."""
        problem = check_shard(self.partial, shard)
        if problem:
            (self.partial / shard["file"]).unlink(missing_ok=True)
            return problem
        os.replace(self.partial / shard["file"], self.data_dir / shard["file"])
        return None


def manifest_problems(manifest: dict) -> list[str]:
    """What makes a manifest unusable before any shard is read: no shards, or split totals
    that its shards do not add up to."""
    shards = manifest.get("shards") or []
    if not shards:
        return ["manifest.json lists no shards"]
    problems = []
    for split, totals in manifest.get("splits", {}).items():
        in_split = [s for s in shards if s["split"] == split]
        records = sum(s["records"] for s in in_split)
        if len(in_split) != totals["shards"] or records != totals["records"]:
            problems.append(
                f"split {split}: manifest lists {len(in_split)} shards / {records} records, "
                f"its totals say {totals['shards']} / {totals['records']}"
            )
    return problems


def verify_s3_dataset(s3, bucket: str, prefix: str) -> dict:
    """Preprocessing's check, without downloading: manifest present, every shard in S3 with its
    size, split totals consistent, and each shard the one the manifest describes. A shard
    trainer.preprocess uploaded carries its sha256 as the object's `sha256` metadata (an object
    replaced by anything else loses or changes it); a shard `horovod-fleet dataset index` read
    has its ETag in the manifest, which the listing gives: "The ETag reflects changes only to
    the contents of an object" (https://docs.aws.amazon.com/AmazonS3/latest/API/API_Object.html).
    Either way the nodes check the sha256 of what they download (check_shard)."""
    raw = s3.get_object(Bucket=bucket, Key=f"{prefix}manifest.json")["Body"].read()
    manifest = json.loads(raw)
    listed = aws.list_objects(s3, bucket, prefix)
    problems = []
    hashed = []
    for shard in manifest.get("shards", []):
        entry = listed.get(shard["file"])
        if entry is None:
            problems.append(f"{shard['file']}: missing")
        elif entry["Size"] != shard.get("bytes", entry["Size"]):
            problems.append(
                f"{shard['file']}: {entry['Size']} bytes in S3, manifest says {shard['bytes']}"
            )
        elif shard.get("etag"):
            if entry.get("ETag", "").strip('"') != shard["etag"]:
                problems.append(
                    f"{shard['file']}: changed in S3 since it was indexed (its ETag differs "
                    "from the manifest's): run horovod-fleet dataset index again"
                )
        elif shard.get("sha256"):
            hashed.append(shard)

    def hash_problem(shard: dict) -> str | None:
        head = s3.head_object(Bucket=bucket, Key=f"{prefix}{shard['file']}")
        if head.get("Metadata", {}).get("sha256") != shard["sha256"]:
            return f"{shard['file']}: sha256 in S3 differs from the manifest"
        return None

    with ThreadPoolExecutor(16) as pool:
        problems += [p for p in pool.map(hash_problem, hashed) if p]
    for split, totals in manifest.get("splits", {}).items():
        records = sum(s["records"] for s in manifest["shards"] if s["split"] == split)
        if records != totals["records"]:
            problems.append(f"split {split}: shards hold {records}, totals say {totals['records']}")
    if not manifest.get("shards"):
        problems.append("manifest.json lists no shards")
    if problems:
        raise VerificationError("; ".join(problems[:5]))
    return manifest


def wait_for_objects(
    s3,
    bucket: str,
    prefix: str,
    names: list[str | tuple[str, ...]],
    timeout_s: float,
    interval_s: float,
    log,
    clock=time.time,
    sleep=time.sleep,
) -> dict[str, int]:
    """Wait until s3://bucket/prefix holds every name (a tuple: any one of its names), saying
    what is missing now and then; {name: size} of what is there then.

    `cdk deploy PreprocessStack` creates the bucket and the node in one go, so the archives are
    usually uploaded after the node boots. Listing, not HEAD: the node may list only its
    prefixes, and a HEAD of a missing key without bucket-wide ListBucket answers 403, not 404.
    """
    last_note = -math.inf
    present: dict[str, int] = {}

    def all_present() -> bool:
        nonlocal last_note, present
        present = aws.list_sizes(s3, bucket, prefix)
        missing = [
            name
            for name in names
            if not (name in present if isinstance(name, str) else set(name) & set(present))
        ]
        if missing and clock() - last_note >= WAIT_NOTE_EVERY_S:
            shown = [n if isinstance(n, str) else " (or ".join(n) + ")" for n in missing]
            uploads = [n if isinstance(n, str) else n[0] for n in missing]
            log(
                f"waiting for {', '.join(shown)} in s3://{bucket}/{prefix} (upload them with: "
                f"s5cmd cp {' '.join(uploads)} s3://{bucket}/{prefix})"
            )
            last_note = clock()
        return not missing

    if not poll_until(all_present, timeout_s, interval_s, clock, sleep):
        raise VerificationError(
            f"s3://{bucket}/{prefix} still lacks raw archives after {timeout_s / 3600:g} h"
        )
    return present
