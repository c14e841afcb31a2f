"""Pull the TFRecords with s5cmd and verify them against manifest.json.

Verification checks what the manifest promises: every shard present with its byte size, its
record count (TFRecord framing, read without TensorFlow) and its sha256 when given; the split
totals add up. A verified pull leaves a marker holding the manifest's digest, so a rerun with the
same manifest skips the pull.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bootstrap.aws import S5CMD_RETRIES, poll_until, run_s5cmd

WAIT_NOTE_EVERY_S = 600  # how often a waiting node says what it waits for

VERIFIED_MARKER = ".verified-manifest-sha256"


class VerificationError(RuntimeError):
    pass


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


def verify_data_dir(data_dir: str | Path, workers: int | None = None) -> dict:
    """Raise VerificationError listing the first problems; returns the manifest."""
    data_dir = Path(data_dir)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    shards = manifest.get("shards") or []
    if not shards:
        raise VerificationError("manifest.json lists no shards")
    problems = []
    for split, totals in manifest.get("splits", {}).items():
        in_split = [s for s in shards if s["split"] == split]
        records = sum(s["records"] for s in in_split)
        if len(in_split) != totals["shards"] or records != totals["records"]:
            problems.append(
                f"split {split}: manifest lists {len(in_split)} shards / {records} records, "
                f"its totals say {totals['shards']} / {totals['records']}"
            )
    with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
        problems += [p for p in pool.map(check_shard, [data_dir] * len(shards), shards) if p]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise VerificationError("; ".join(problems[:5]) + more)
    return manifest


def pull_dataset(bucket: str, prefix: str, data_dir: str | Path, log) -> dict:
    """Copy s3://bucket/prefix to data_dir unless this manifest was verified there already."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    marker = data_dir / VERIFIED_MARKER
    log(
        f"reading s3://{bucket}/{prefix}manifest.json with s5cmd "
        f"(it retries each request up to {S5CMD_RETRIES} times)"
    )
    run_s5cmd("cp", f"s3://{bucket}/{prefix}manifest.json", str(data_dir / "manifest.json.new"))
    new_manifest = data_dir / "manifest.json.new"
    digest = hashlib.sha256(new_manifest.read_bytes()).hexdigest()
    if marker.exists() and marker.read_text() == digest:
        new_manifest.unlink()
        log(f"data already pulled and verified in {data_dir}: skipping the pull")
        return json.loads((data_dir / "manifest.json").read_text())
    marker.unlink(missing_ok=True)
    log(f"pulling s3://{bucket}/{prefix} to {data_dir}")
    # sync copies only what differs, so a pull interrupted by a reboot continues. The
    # preprocessor's resume sidecars under _progress/ are of no use to a training node
    # (s5cmd matches --exclude against the whole key, prefix included).
    run_s5cmd(
        "sync",
        "--size-only",
        "--exclude",
        f"{prefix}_progress/*",
        f"s3://{bucket}/{prefix}*",
        f"{data_dir}/",
    )
    new_manifest.replace(data_dir / "manifest.json")
    manifest = verify_data_dir(data_dir)
    marker.write_text(digest)
    total = sum(s["records"] for s in manifest["shards"])
    log(f"pulled and verified {len(manifest['shards'])} shards, {total} records in {data_dir}")
    return manifest


def verify_s3_dataset(s3, bucket: str, prefix: str) -> dict:
    """Preprocessing's final check, without downloading: manifest present, every shard in S3
    with its size, split totals consistent."""
    raw = s3.get_object(Bucket=bucket, Key=f"{prefix}manifest.json")["Body"].read()
    manifest = json.loads(raw)
    sizes = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        sizes.update({o["Key"][len(prefix) :]: o["Size"] for o in page.get("Contents", [])})
    problems = []
    for shard in manifest.get("shards", []):
        if shard["file"] not in sizes:
            problems.append(f"{shard['file']}: missing")
        elif sizes[shard["file"]] != shard.get("bytes", sizes[shard["file"]]):
            problems.append(
                f"{shard['file']}: {sizes[shard['file']]} bytes in S3, manifest says {shard['bytes']}"
            )
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
    names: list[str],
    timeout_s: float,
    interval_s: float,
    log,
    clock=time.time,
    sleep=time.sleep,
) -> None:
    """Wait until s3://bucket/prefix holds every name, saying what is missing now and then.

    `cdk deploy PreprocessStack` creates the bucket and the node in one go, so the archives are
    usually uploaded after the node boots. Listing, not HEAD: the node may list only its
    prefixes, and a HEAD of a missing key without bucket-wide ListBucket answers 403, not 404.
    """
    last_note = -math.inf

    def all_present() -> bool:
        nonlocal last_note
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        present = {o["Key"] for page in pages for o in page.get("Contents", [])}
        missing = [name for name in names if prefix + name not in present]
        if missing and clock() - last_note >= WAIT_NOTE_EVERY_S:
            log(
                f"waiting for {', '.join(missing)} in s3://{bucket}/{prefix} (upload them with: "
                f"s5cmd cp {' '.join(missing)} s3://{bucket}/{prefix})"
            )
            last_note = clock()
        return not missing

    if not poll_until(all_present, timeout_s, interval_s, clock, sleep):
        raise VerificationError(
            f"s3://{bucket}/{prefix} still lacks raw archives after {timeout_s / 3600:g} h"
        )
