"""watch/tfrecords.py: TFRecord framing and tf.train.Example read without TensorFlow, against the
protobuf library's own encoding (tfrecord_samples.py) and, in the slow tier, TensorFlow's.

.venv/bin/python -m pytest tests/watch/test_tfrecords.py
"""

import io
import os
import random
import struct

import google_crc32c
import pytest
from tfrecord_samples import encode, imagenet_record, shard_bytes

from trainer.preprocess.records import frame_record
from watch import tfrecords
from watch.tfrecords import ExampleError, RecordError, parse_example, records


def read_all(data: bytes) -> list[bytes]:
    return list(records(io.BytesIO(data).read))


def test_the_plain_crc32c_is_castagnolis():
    # RFC 3720's check value of CRC-32C over "123456789" (appendix B.4), and google-crc32c's.
    assert tfrecords.crc32c_python(b"123456789") == 0xE3069283
    rng = random.Random(5)
    for size in (0, 1, 7, 64, 1000):
        data = bytes(rng.randrange(256) for _ in range(size))
        assert tfrecords.crc32c_python(data) == google_crc32c.value(data)
    assert tfrecords.CRC_IS_FAST, "make setup installs google-crc32c's C implementation"


def test_records_come_back_whole_and_in_order():
    payloads = [b"", b"a", os.urandom(70_000), b"last"]
    assert read_all(b"".join(frame_record(p) for p in payloads)) == payloads
    assert read_all(b"") == []


def test_every_cut_of_a_file_is_refused_as_truncated():
    data = b"".join(frame_record(p) for p in (b"first record", b"second"))
    whole = len(frame_record(b"first record"))
    for cut in range(1, len(data)):
        if cut == whole:
            assert len(read_all(data[:cut])) == 1  # a cut between records is a shorter file
            continue
        with pytest.raises(RecordError, match=r"^truncated"):
            read_all(data[:cut])


def test_a_flipped_bit_fails_its_crc():
    data = bytearray(frame_record(b"payload of the record"))
    data[20] ^= 0x01
    with pytest.raises(RecordError, match="corrupt: bad data CRC in the record at byte 0"):
        read_all(bytes(data))
    data = bytearray(frame_record(b"x") + frame_record(b"payload"))
    data[len(frame_record(b"x"))] ^= 0x40  # the second record's length
    with pytest.raises(RecordError, match="bad length CRC at byte 17"):
        read_all(bytes(data))
    with pytest.raises(RecordError, match="not a TFRecord file"):
        read_all(b"PK\x03\x04 this is a zip file, not TFRecords")


def test_an_imagenet_example_parses_to_its_features():
    features = parse_example(
        encode(imagenet_record(417, "n02690373", 5, boxes=2)), frozenset({"image/class/synset"})
    )
    assert features["image/class/label"] == tfrecords.Feature("int64_list", 1, (417,))
    assert features["image/class/synset"].values == (b"n02690373",)
    assert features["image/encoded"].kind == "bytes_list" and features["image/encoded"].values == ()
    assert features["image/object/bbox/xmin"] == tfrecords.Feature("float_list", 2, ())
    assert features["image/object/bbox/label"].values == (417, 417)
    assert len(features) == 15


def test_negative_and_large_int64s_and_every_encoding_of_a_list():
    features = parse_example(encode({"a": [-1, 0, 2**63 - 1, -(2**63)], "f": [0.5, 1.5]}))
    assert features["a"].values == (-1, 0, 2**63 - 1, -(2**63))
    assert features["f"].count == 2
    # The same int64_list unpacked (wire type 0 per value), which parsers must accept too.
    unpacked = b"\x08\x05\x08\x07"
    feature = b"\x1a" + bytes([len(unpacked)]) + unpacked
    entry = b"\x0a\x01k\x12" + bytes([len(feature)]) + feature
    example = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert parse_example(example)["k"].values == (5, 7)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x0a\x05\x0a\x03\x0a", "runs past the end"),
        (b"\x0b", "wire type 3"),
        (b"\x0a\x02\x0a\x00", "a feature without a name"),
        (b"\x0a" + b"\xff" * 11, "longer than 10 bytes"),
    ],
)
def test_what_is_not_an_example_is_refused(data, message):
    with pytest.raises(ExampleError, match=message):
        parse_example(data)


def test_unknown_fields_are_skipped():
    known = encode({"image/class/label": 3})
    extra = b"\x10\x01" + b"\x1d" + struct.pack("<f", 1.0)  # field 2 varint, field 3 fixed32
    assert parse_example(known + extra)["image/class/label"].values == (3,)


@pytest.mark.slow
def test_tensorflow_reads_and_writes_what_the_reader_and_the_samples_do(tmp_path):
    """The samples' protobuf encoding is TensorFlow's tf.train.Example, and TensorFlow's own
    TFRecordWriter output is what the reader reads (the default tier trusts both)."""
    import tensorflow as tf

    features = [imagenet_record(label, f"n{label:08d}", label, boxes=label % 3) for label in (1, 9)]
    mine = tmp_path / "mine"
    mine.write_bytes(shard_bytes(features))
    theirs = tmp_path / "theirs"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in tf.data.TFRecordDataset(str(mine)):
            example = tf.train.Example.FromString(record.numpy())
            writer.write(example.SerializeToString())
    for ours, tf_record, wanted in zip(
        read_all(theirs.read_bytes()), tf.data.TFRecordDataset(str(mine)), features, strict=True
    ):
        assert tf.train.Example.FromString(ours) == tf.train.Example.FromString(tf_record.numpy())
        parsed = parse_example(ours, frozenset({"image/encoded", "image/class/synset"}))
        assert parsed["image/class/label"].values == (wanted["image/class/label"],)
        assert parsed["image/encoded"].values == (wanted["image/encoded"],)
        assert parsed["image/object/bbox/xmin"].count == len(wanted["image/object/bbox/xmin"])
