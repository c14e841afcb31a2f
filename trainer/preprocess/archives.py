"""Reading the ILSVRC archives in place, from local files or s3:// objects.

Archives are listed once (headers only: seeks locally, ranged GETs on S3) and then read in
contiguous byte ranges with tarfile's stream mode, so nothing is extracted to disk and a resumed
run starts reading where its first unfinished block begins.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py tests/trainer/test_preprocess_s3.py
"""

import io
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

# One ranged GET per listing read: big enough to cover several small members' headers.
_S3_LISTING_BLOCK = 1 << 20


class InputError(Exception):
    """Bad or unreadable input; the message is printed as the one `error:` line."""


@dataclass(frozen=True)
class TarMember:
    name: str
    offset_data: int
    size: int


_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def split_s3_url(url: str, object_key: bool = False) -> tuple[str, str]:
    """(bucket, key) of s3://bucket/key; key may be empty or end with '/' for a prefix, unless
    object_key asks for one object."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    if not url.startswith("s3://") or not bucket or "*" in url:
        raise InputError(f"expected s3://BUCKET/KEY, got {url!r}")
    if not _BUCKET_NAME.match(bucket):
        raise InputError(
            f"{bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, '.' and '-')"
        )
    if object_key and (not key or key.endswith("/")):
        raise InputError(f"expected s3://BUCKET/KEY of one object, got {url!r}")
    return bucket, key


def s3_client():
    """A boto3 S3 client; AWS_ENDPOINT_URL (moto in tests and the rehearsal) is honoured by boto3."""
    import boto3  # only S3 runs need it; worker processes never import it

    return boto3.client("s3")


def check_input(flag: str, source: str, client) -> None:
    """Fails early, naming the flag, if an input file or s3:// object cannot be read."""
    if not source.startswith("s3://"):
        if os.path.isdir(source):
            raise InputError(f"{flag}: {source} is a directory; expected the archive file")
        if not os.path.isfile(source):
            raise InputError(f"{flag}: no such file: {source}")
        return
    from botocore.exceptions import ClientError

    bucket, key = split_s3_url(source)
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        raise InputError(f"{flag}: cannot read {source}: {_s3_code(exc)}") from None


def check_output_bucket(flag: str, url: str, client) -> None:
    """Fails early, naming the flag, if the output prefix cannot be listed.

    A listing under the prefix, not HeadBucket: S3 authorises HeadBucket as s3:ListBucket with
    no s3:prefix, which a role allowed to list only its own prefixes is denied.
    """
    from botocore.exceptions import ClientError

    bucket, key = split_s3_url(url)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except ClientError as exc:
        raise InputError(f"{flag}: cannot use {url}: {_s3_code(exc)}") from None


def _s3_code(exc: Exception) -> str:
    error = getattr(exc, "response", {}).get("Error", {})
    code = error.get("Code", type(exc).__name__)
    return {"404": "not found (404)", "403": "access denied (403)"}.get(code, code)


class _S3RangeReader(io.RawIOBase):
    """A seekable read-only view of an S3 object; every read is one ranged GET."""

    def __init__(self, client, url: str):
        self._client = client
        self._bucket, self._key = split_s3_url(url)
        self._size = client.head_object(Bucket=self._bucket, Key=self._key)["ContentLength"]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        end = min(self._pos + len(buffer), self._size)
        if end <= self._pos:
            return 0
        body = self._client.get_object(
            Bucket=self._bucket, Key=self._key, Range=f"bytes={self._pos}-{end - 1}"
        )["Body"].read()
        buffer[: len(body)] = body
        self._pos += len(body)
        return len(body)


class _BoundedReader(io.RawIOBase):
    """The bytes [start, end) of a local file, read sequentially."""

    def __init__(self, path: str, start: int, end: int):
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._file.seek(start)
        self._left = end - start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self._file.readinto(memoryview(buffer)[: min(len(buffer), self._left)])
        self._left -= count
        return count

    def close(self) -> None:
        self._file.close()
        super().close()


def open_range(source: str, start: int, end: int, client=None):
    """A readable stream of bytes [start, end) of a local file or an s3:// object."""
    assert 0 <= start <= end
    if not source.startswith("s3://"):
        return io.BufferedReader(_BoundedReader(source, start, end), 1 << 20)
    if start == end:
        return io.BytesIO(b"")
    bucket, key = split_s3_url(source)
    return client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]


def read_small(source: str, client=None) -> bytes:
    """The whole content of a small local file or s3:// object (the validation ground truth)."""
    if not source.startswith("s3://"):
        with open(source, "rb") as f:
            return f.read()
    bucket, key = split_s3_url(source)
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def list_tar(source: str, client=None) -> list[TarMember]:
    """The regular-file members of a tar archive, in archive order, reading only the headers."""
    if source.startswith("s3://"):
        fileobj = io.BufferedReader(_S3RangeReader(client, source), _S3_LISTING_BLOCK)
        opened = {"fileobj": fileobj}
    else:
        opened = {"name": source}
    with tarfile.open(mode="r:", **opened) as archive:
        return [TarMember(m.name, m.offset_data, m.size) for m in archive if m.isfile()]


def tar_images(stream) -> Iterator[tuple[str, bytes]]:
    """(base name, bytes) of each regular file in a tar stream (a per-synset tar)."""
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            if member.isfile():
                yield os.path.basename(member.name), archive.extractfile(member).read()


def members_in_range(stream, start: int, members: list[TarMember]) -> Iterator[tuple[str, bytes]]:
    """(base name, bytes) of members that lie in a stream beginning at archive offset start."""
    position = start
    for member in members:
        assert member.offset_data >= position, "members must be in archive order"
        _read_exact(stream, member.offset_data - position, member)  # the header in between
        yield os.path.basename(member.name), _read_exact(stream, member.size, member)
        position = member.offset_data + member.size


def _read_exact(stream, count: int, member: TarMember) -> bytes:
    chunks = []
    while count > 0:
        chunk = stream.read(count)
        if not chunk:
            raise InputError(f"archive ends inside {member.name}: the tar is truncated")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)
