"""Named snapshots of the rehearsal's local S3: every object of the bucket with its metadata,
kept under <workdir>/snapshots/<name>/, so that each fault row starts from the same S3 whatever
ran before it (rehearsal/faults.py).

A restore empties the bucket first: what a row left (a DONE.json, attempts.json, a corrupt shard)
never reaches the next one.
"""

from __future__ import annotations

import json
from pathlib import Path

OBJECTS = "objects"
INDEX = "index.json"


def keys(s3, bucket: str) -> list[str]:
    found, token = [], None
    while True:
        page = s3.list_objects_v2(Bucket=bucket, **({"ContinuationToken": token} if token else {}))
        found += [o["Key"] for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated"):
            return found


def save(s3, bucket: str, where: Path, leave_out: tuple[str, ...] = ()) -> int:
    """Copy the bucket to `where` (emptied first), but the keys in leave_out; returns how many."""
    index = {}
    for number, key in enumerate(k for k in keys(s3, bucket) if k not in leave_out):
        got = s3.get_object(Bucket=bucket, Key=key)
        path = where / OBJECTS / str(number)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(got["Body"].read())
        index[key] = {"file": path.name, "metadata": got.get("Metadata", {}),
                      "content_type": got.get("ContentType")}  # fmt: skip
    (where / INDEX).write_text(json.dumps(index, indent=1))
    return len(index)


def restore(s3, bucket: str, where: Path) -> int:
    """Make the bucket hold exactly what `where` holds; returns how many objects."""
    present = keys(s3, bucket)
    for start in range(0, len(present), 1000):
        batch = [{"Key": key} for key in present[start : start + 1000]]
        s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
    index = json.loads((where / INDEX).read_text())
    for key, entry in index.items():
        extra = {"ContentType": entry["content_type"]} if entry["content_type"] else {}
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=(where / OBJECTS / entry["file"]).read_bytes(),
            Metadata=entry["metadata"],
            **extra,
        )
    return len(index)
