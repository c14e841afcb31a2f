"""What trainer.preprocess writes, and where: shards with their sidecars, then the manifest, in a
local directory or under an s3:// prefix.

A shard becomes visible only whole (local: written under _progress/, fsynced, renamed; S3: staged
locally and uploaded once finished), and then its sidecar _progress/<shard>.json records its
record count, size and sha256; a restart trusts a shard only if it still matches its sidecar.
The manifest (docs/contracts.md) is built from the sidecars.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py tests/trainer/test_preprocess_s3.py
"""

import hashlib
import json
import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone

from trainer.preprocess.archives import split_s3_url

PROGRESS_DIR = "_progress"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "horovod-fleet/imagenet-tfrecords/1"
LABEL_BASE = 1


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class ShardWriter:
    """Appends framed records to a staging file, counting and hashing them on the way."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - closed by finish()
        self._digest = hashlib.sha256()
        self.records = 0
        self.bytes = 0

    def write(self, record: bytes) -> None:
        self._file.write(record)
        self._digest.update(record)
        self.records += 1
        self.bytes += len(record)

    def finish(self) -> str:
        """Flushes the file to disk and returns its sha256."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._digest.hexdigest()


def build_manifest(
    label_map: dict[str, int], splits: dict[str, list[dict]], short_side: int, quality: int
) -> dict:
    """The manifest of every split's shards, from their sidecars, in shard order."""
    shards = [sidecar for sidecars in splits.values() for sidecar in sidecars]
    return {
        "format": MANIFEST_FORMAT,
        "num_classes": len(label_map),
        "label_base": LABEL_BASE,
        "splits": {
            split: {"shards": len(sidecars), "records": sum(s["records"] for s in sidecars)}
            for split, sidecars in splits.items()
        },
        "shards": [
            {key: s[key] for key in ("file", "split", "records", "bytes", "sha256")} for s in shards
        ],
        "label_map": label_map,
        "image": {"short_side": short_side, "quality": quality},
        "skipped": [entry for s in shards for entry in s["skipped"]],
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _write_atomically(path: str, data: bytes) -> None:
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _sync_directory(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class LocalOutput:
    def __init__(self, root: str):
        self.root = root
        self._progress = os.path.join(root, PROGRESS_DIR)
        os.makedirs(self._progress, exist_ok=True)

    def staging_path(self, shard: str) -> str:
        return os.path.join(self._progress, shard + ".partial")

    def completed(self, shard: str, fingerprint: str) -> dict | None:
        """The shard's sidecar if the shard is there, was made with these settings and matches."""
        try:
            with open(os.path.join(self._progress, shard + ".json"), "rb") as f:
                sidecar = json.load(f)
        except (OSError, ValueError):
            return None
        path = os.path.join(self.root, shard)
        matches = (
            sidecar.get("fingerprint") == fingerprint
            and os.path.isfile(path)
            and os.path.getsize(path) == sidecar["bytes"]
            and file_sha256(path) == sidecar["sha256"]
        )
        return sidecar if matches else None

    def publish(self, shard: str, staged: str, sidecar: dict) -> None:
        os.replace(staged, os.path.join(self.root, shard))
        _sync_directory(self.root)
        _write_atomically(
            os.path.join(self._progress, shard + ".json"), json.dumps(sidecar).encode()
        )

    def write_manifest(self, manifest: dict) -> None:
        _write_atomically(
            os.path.join(self.root, MANIFEST_NAME), json.dumps(manifest, indent=1).encode()
        )

    def close(self) -> None:
        _sync_directory(self.root)


class S3Output:
    """Shards staged in a local temporary directory ($TMPDIR) and uploaded in the background."""

    def __init__(self, url: str, client):
        self._client = client
        self._bucket, prefix = split_s3_url(url)
        self._prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        self._staging = tempfile.mkdtemp(prefix="horovod-fleet-shards-")
        self._uploader = ThreadPoolExecutor(max_workers=1)
        self._uploads: list[Future] = []

    def _key(self, *parts: str) -> str:
        return self._prefix + "/".join(parts)

    def staging_path(self, shard: str) -> str:
        return os.path.join(self._staging, shard)

    def completed(self, shard: str, fingerprint: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            body = self._client.get_object(
                Bucket=self._bucket, Key=self._key(PROGRESS_DIR, shard + ".json")
            )["Body"]
            sidecar = json.loads(body.read())
            head = self._client.head_object(Bucket=self._bucket, Key=self._key(shard))
        except (ClientError, ValueError):
            return None
        matches = (
            sidecar.get("fingerprint") == fingerprint
            and head["ContentLength"] == sidecar["bytes"]
            and head.get("Metadata", {}).get("sha256") == sidecar["sha256"]
        )
        return sidecar if matches else None

    def _upload(self, shard: str, staged: str, sidecar: dict) -> None:
        self._client.upload_file(
            staged,
            self._bucket,
            self._key(shard),
            ExtraArgs={"Metadata": {"sha256": sidecar["sha256"]}},
        )
        os.remove(staged)
        self._client.put_object(
            Bucket=self._bucket,
            Key=self._key(PROGRESS_DIR, shard + ".json"),
            Body=json.dumps(sidecar).encode(),
        )

    def publish(self, shard: str, staged: str, sidecar: dict) -> None:
        for upload in self._uploads:
            if upload.done():
                upload.result()  # an upload that failed stops the run now, not at the end
        self._uploads.append(self._uploader.submit(self._upload, shard, staged, sidecar))

    def write_manifest(self, manifest: dict) -> None:
        self._wait()
        self._client.put_object(
            Bucket=self._bucket,
            Key=self._key(MANIFEST_NAME),
            Body=json.dumps(manifest, indent=1).encode(),
            ContentType="application/json",
        )

    def _wait(self) -> None:
        for upload in self._uploads:
            upload.result()  # raises the first upload's error, if any
        self._uploads.clear()

    def close(self) -> None:
        self._uploader.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self._staging, ignore_errors=True)
