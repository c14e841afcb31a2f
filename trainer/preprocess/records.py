"""TFRecord framing and tf.train.Example encoding without importing TensorFlow.

Worker processes encode records with this so they stay small and start fast; TensorFlow's own
reader (tf.data.TFRecordDataset + tf.io.parse_single_example) checks the result in the tests:
    .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py
"""

import struct

import google_crc32c

_CRC_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """The CRC-32C TFRecord stores: rotated right by 15 bits plus a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def frame_record(payload: bytes) -> bytes:
    """One TFRecord: length, CRC of the length, payload, CRC of the payload."""
    length = struct.pack("<Q", len(payload))
    return b"".join(
        (
            length,
            struct.pack("<I", masked_crc32c(length)),
            payload,
            struct.pack("<I", masked_crc32c(payload)),
        )
    )


def _varint(value: int) -> bytes:
    assert value >= 0, "only non-negative varints are encoded here"
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: bytes | int) -> bytes:
    # Feature: bytes_list = 1, int64_list = 3; each list's values are its field 1 (int64 packed).
    if isinstance(value, bytes):
        return _field(1, _field(1, value))
    return _field(3, _field(1, _varint(value)))


def encode_example(features: dict[str, bytes | int]) -> bytes:
    """A serialized tf.train.Example holding one bytes or non-negative int64 value per key."""
    entries = b"".join(
        _field(1, _field(1, key.encode()) + _field(2, _feature(value)))
        for key, value in sorted(features.items())
    )
    return _field(1, entries)
