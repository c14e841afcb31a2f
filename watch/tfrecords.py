"""TFRecord files and tf.train.Example records, read without TensorFlow or a protobuf library.

A TFRecord file is a sequence of records, each "uint64 length, uint32 masked_crc32_of_length,
byte data[length], uint32 masked_crc32_of_data", little-endian, the CRC being CRC-32C
(Castagnoli) masked as ((crc >> 15) | (crc << 17)) + 0xa282ead8
(https://www.tensorflow.org/tutorials/load_data/tfrecord#tfrecords_format_details).

A record of an image dataset is a serialized tf.train.Example, read here at the protobuf wire
format (https://protobuf.dev/programming-guides/encoding/) with the field numbers of
tensorflow/core/example/example.proto and feature.proto
(https://github.com/tensorflow/tensorflow/blob/master/tensorflow/core/example/feature.proto):
Example.features = 1; Features.feature = 1, a map whose entries are key = 1, value = 2;
Feature is one of bytes_list = 1, float_list = 2, int64_list = 3; each list's values are its
field 1 (int64 and float packed, but a parser must take them unpacked too).

`horovod-fleet dataset index` (watch/dataset.py) reads shards with it; the tests prove it
against the protobuf library and, in the slow tier, against TensorFlow's own writer.
Tested by: .venv/bin/python -m pytest tests/watch/test_tfrecords.py
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
BYTES_LIST, FLOAT_LIST, INT64_LIST = 1, 2, 3
KINDS = {BYTES_LIST: "bytes_list", FLOAT_LIST: "float_list", INT64_LIST: "int64_list"}


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c_python(data: bytes) -> int:
    """CRC-32C in plain Python, for a machine without google-crc32c's C code: about 2.4 MB/s on
    the development machine, most of a day for ImageNet's 150 GB (the index says so)."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _fast_crc32c() -> Callable[[bytes], int] | None:
    """google-crc32c's C implementation (make setup installs it, trainer/requirements.txt)."""
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value if google_crc32c.implementation == "c" else None


crc32c = _fast_crc32c() or crc32c_python
CRC_IS_FAST = crc32c is not crc32c_python


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class RecordError(ValueError):
    """The file is not a whole, intact TFRecord file; the message says where."""


def records(read: Callable[[int], bytes]) -> Iterator[bytes]:
    """Each record's data, its framing and both CRCs checked, from a stream's `read(n)` (which
    returns fewer than n bytes only at the end)."""
    offset = 0
    while header := read(12):
        if len(header) < 12:
            raise RecordError(f"truncated: {len(header)} bytes of a record header at byte {offset}")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc32c(header[:8]) != length_crc:
            raise RecordError(f"not a TFRecord file: bad length CRC at byte {offset}")
        data = read(length)
        footer = read(4)
        if len(data) < length or len(footer) < 4:
            raise RecordError(
                f"truncated: the record at byte {offset} needs {length + 16} bytes, "
                f"{12 + len(data) + len(footer)} are left"
            )
        if masked_crc32c(data) != struct.unpack("<I", footer)[0]:
            raise RecordError(f"corrupt: bad data CRC in the record at byte {offset}")
        yield data
        offset += length + 16


# --- tf.train.Example at the wire format -------------------------------------------------------


class ExampleError(ValueError):
    """The record is not a tf.train.Example."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ExampleError("a varint runs past the end")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ExampleError("a varint is longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of a message: an int for varints and fixed widths, the
    bytes of a length-delimited field as a view (nothing copied)."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ExampleError(f"field {number} runs past the end of its message")
            value, pos = buf[pos : pos + length], pos + length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise ExampleError(f"field {number} runs past the end of its message")
            value, pos = int.from_bytes(buf[pos : pos + width], "little"), pos + width
        else:
            raise ExampleError(f"field {number} has wire type {wire}, which Example never uses")
        if number == 0:
            raise ExampleError("field number 0")
        yield number, wire, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _int64_values(body: memoryview) -> list[int]:
    values = []
    for number, wire, value in _fields(body):
        if number != 1:
            continue
        if wire == 0:
            values.append(_signed64(value))
        elif wire == 2:  # packed
            pos = 0
            while pos < len(value):
                item, pos = _varint(value, pos)
                values.append(_signed64(item))
        else:
            raise ExampleError(f"an int64_list value has wire type {wire}")
    return values


def _bytes_values(body: memoryview) -> list[bytes]:
    values = []
    for number, wire, value in _fields(body):
        if number == 1:
            if wire != 2:
                raise ExampleError(f"a bytes_list value has wire type {wire}")
            values.append(bytes(value))
    return values


@dataclass(frozen=True)
class Feature:
    """One feature of an Example: its kind and, when it was asked for, its values."""

    kind: str  # "bytes_list", "float_list", "int64_list"; "" when the feature sets none
    count: int  # how many values (bytes values are not copied unless asked for)
    values: tuple = ()
    head: bytes = b""  # a bytes_list's first value's first HEAD_BYTES bytes (what format it is)


HEAD_BYTES = 8


def _feature(body: memoryview, wanted: bool) -> Feature:
    kind, count, values, head = "", 0, (), b""
    for number, wire, value in _fields(body):
        if number not in KINDS or wire != 2:
            continue  # unknown fields are skipped, as protobuf parsers do
        kind = KINDS[number]
        if number == INT64_LIST:
            values = tuple(_int64_values(value))
            count = len(values)
        elif number == BYTES_LIST:
            items = [v for n, w, v in _fields(value) if n == 1 and w == 2]
            count = len(items)
            values = tuple(_bytes_values(value)) if wanted else ()
            head = bytes(items[0][:HEAD_BYTES]) if items else b""
        else:  # floats: counted, never needed here
            floats = [(w, v) for n, w, v in _fields(value) if n == 1]
            count = sum(len(v) // 4 if w == 2 else 1 for w, v in floats)
    return Feature(kind, count, values, head)


def parse_example(data: bytes, wanted: frozenset[str] = frozenset()) -> dict[str, Feature]:
    """Every feature of a serialized tf.train.Example by name; the bytes values of the names in
    `wanted` are copied out, the others only counted (an image is never copied)."""
    features: dict[str, Feature] = {}
    for number, wire, value in _fields(memoryview(data)):
        if number != 1 or wire != 2:
            continue
        for entry_number, entry_wire, entry in _fields(value):
            if entry_number != 1 or entry_wire != 2:
                continue
            key, body = None, memoryview(b"")
            for part, part_wire, content in _fields(entry):
                if part == 1 and part_wire == 2:
                    try:
                        key = bytes(content).decode()
                    except UnicodeDecodeError:
                        raise ExampleError("a feature name is not UTF-8") from None
                elif part == 2 and part_wire == 2:
                    body = content
            if key is None:
                raise ExampleError("a feature without a name")
            features[key] = _feature(body, key in wanted)  # a later entry wins, as in protobuf
    return features
