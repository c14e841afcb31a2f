"""TFRecords for the index's tests, encoded by the protobuf library itself (no TensorFlow): the
messages of tensorflow/core/example/example.proto and feature.proto, declared here field for
field, in a descriptor pool of their own. test_tfrecords.py's slow test checks that TensorFlow
reads what this writes as the same tf.train.Example, and writes what the index reads.

Records look like TensorFlow models' build_imagenet_data.py's (`_convert_to_example`,
https://github.com/tensorflow/models/blob/master/research/inception/inception/data/build_imagenet_data.py):
labels 1..1000, "where 0 is not used".
"""

from __future__ import annotations

import hashlib

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from trainer.preprocess.records import frame_record

_LABEL = descriptor_pb2.FieldDescriptorProto


def _message(file, name: str, fields: list[tuple], oneof: str | None = None):
    message = file.message_type.add(name=name)
    if oneof:
        message.oneof_decl.add(name=oneof)
    for field_name, number, kind, label, type_name, packed in fields:
        added = message.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            added.type_name = type_name
        if packed:
            added.options.packed = True
        if oneof:
            added.oneof_index = 0
    return message


def _classes():
    file = descriptor_pb2.FileDescriptorProto(
        name="horovod_fleet_tests/example.proto", package="tensorflow", syntax="proto3"
    )
    repeated, optional = _LABEL.LABEL_REPEATED, _LABEL.LABEL_OPTIONAL
    kinds = descriptor_pb2.FieldDescriptorProto
    _message(file, "BytesList", [("value", 1, kinds.TYPE_BYTES, repeated, None, False)])
    _message(file, "FloatList", [("value", 1, kinds.TYPE_FLOAT, repeated, None, True)])
    _message(file, "Int64List", [("value", 1, kinds.TYPE_INT64, repeated, None, True)])
    _message(
        file,
        "Feature",
        [
            ("bytes_list", 1, kinds.TYPE_MESSAGE, optional, ".tensorflow.BytesList", False),
            ("float_list", 2, kinds.TYPE_MESSAGE, optional, ".tensorflow.FloatList", False),
            ("int64_list", 3, kinds.TYPE_MESSAGE, optional, ".tensorflow.Int64List", False),
        ],
        oneof="kind",
    )
    features = _message(
        file,
        "Features",
        [("feature", 1, kinds.TYPE_MESSAGE, repeated, ".tensorflow.Features.FeatureEntry", False)],
    )
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=kinds.TYPE_STRING, label=optional)
    entry.field.add(
        name="value", number=2, type=kinds.TYPE_MESSAGE, label=optional,
        type_name=".tensorflow.Feature",
    )  # fmt: skip
    _message(
        file,
        "Example",
        [("features", 1, kinds.TYPE_MESSAGE, optional, ".tensorflow.Features", False)],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


Example = _classes()


def encode(features: dict) -> bytes:
    """A serialized tf.train.Example: bytes and str values become bytes_list, ints int64_list,
    floats float_list; a list holds several values of one kind (an empty list is an empty
    float_list, as build_imagenet_data.py writes an image without boxes)."""
    example = Example()
    for key, value in features.items():
        values = value if isinstance(value, list) else [value]
        feature = example.features.feature[key]
        if values and isinstance(values[0], str | bytes):
            feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in values)
        elif values and isinstance(values[0], int):
            feature.int64_list.value.extend(values)
        else:
            feature.float_list.SetInParent()  # set, though empty, as TensorFlow's would be
            feature.float_list.value.extend(values)
    return example.SerializeToString()


def imagenet_record(label: int, synset: str, index: int, boxes: int = 0) -> dict:
    """The features build_imagenet_data.py's _convert_to_example writes for one image."""
    image = hashlib.sha256(f"{synset}-{index}".encode()).digest() * (8 + index % 5)
    return {
        "image/height": 32, "image/width": 48, "image/colorspace": "RGB", "image/channels": 3,
        "image/class/label": label, "image/class/synset": synset, "image/class/text": "a thing",
        "image/object/bbox/xmin": [0.1] * boxes, "image/object/bbox/xmax": [0.9] * boxes,
        "image/object/bbox/ymin": [0.2] * boxes, "image/object/bbox/ymax": [0.8] * boxes,
        "image/object/bbox/label": [label] * boxes, "image/format": "JPEG",
        "image/filename": f"{synset}_{index}.JPEG", "image/encoded": b"\xff\xd8\xff\xe0" + image,
    }  # fmt: skip


def shard_bytes(features: list[dict]) -> bytes:
    return b"".join(frame_record(encode(f)) for f in features)


def synset(label: int) -> str:
    return f"n{1440764 + 7919 * label:08d}"


def imagenet_shards(train: int, validation: int, classes: int, per_shard: int) -> dict[str, bytes]:
    """build_imagenet_data.py's file names and records: labels 1..classes, each shard a mix."""
    shards, index = {}, 0
    for split, count in (("train", train), ("validation", validation)):
        for shard in range(count):
            features = []
            for _ in range(per_shard):
                label = 1 + index % classes
                features.append(imagenet_record(label, synset(label), index, boxes=index % 3))
                index += 1
            shards[f"{split}-{shard:05d}-of-{count:05d}"] = shard_bytes(features)
    return shards
