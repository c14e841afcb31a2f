"""ILSVRC-shaped sample archives with photographic-looking content, deterministic for a seed.

    python -m trainer.preprocess.sample --output DIR --classes 10 --train-per-class 20 \
        --val-images 50 [--quirks]

Writes DIR/ILSVRC2012_img_train.tar (one <synset>.tar per class inside),
DIR/ILSVRC2012_img_val.tar (flat ILSVRC2012_val_%08d.JPEG) and
DIR/ILSVRC2012_validation_ground_truth.txt (one synset per line, in file-name order). Sizes follow
ImageNet's spread (mostly 500 on the long side, mean about 400x350) and JPEG quality is about 90.
Each class has its own hue, so a model can learn the sample and the rehearsal's accuracy means
something (chance is 1/classes). --quirks replaces the first four train images with ImageNet's
oddities: a CMYK JPEG, a PNG named .JPEG, a grayscale JPEG and a truncated JPEG.
"""

import colorsys
import io
import os
import tarfile
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from trainer.cli import OneLineErrorParser, fail, require_at_least

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
VAL_LABELS = "ILSVRC2012_validation_ground_truth.txt"
QUIRKS = ("cmyk", "png", "grayscale", "truncated")
ASPECTS = (4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9)
TEXTURE_CONTRAST = 0.4


@dataclass(frozen=True)
class Sample:
    train_tar: str
    val_tar: str
    val_labels: str
    synsets: list[str]
    train_names: dict[str, list[str]]  # synset -> image names in its tar, in order
    val_synsets: list[str]  # ground truth, in file-name order
    quirks: dict[str, str] = field(default_factory=dict)  # image name -> quirk kind


def synset_names(classes: int) -> list[str]:
    """Plausible WordNet ids, sorted the way the labels are: n01440764 + a stride."""
    return [f"n{1440764 + 7919 * i:08d}" for i in range(classes)]


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) drawn like ImageNet's: mostly 500 on the long side, some small, few large."""
    kind = rng.random()
    if kind < 0.5:
        long_side = 500
    elif kind < 0.92:
        long_side = int(rng.integers(160, 500))
    else:
        long_side = int(rng.integers(500, 900))
    short_side = max(64, round(long_side / ASPECTS[rng.integers(len(ASPECTS))]))
    return (long_side, short_side) if rng.random() < 0.75 else (short_side, long_side)


def class_tint(class_index: int) -> np.ndarray:
    """The class's own RGB colour: hues a golden-ratio step apart stay distinct for any count."""
    hue = (class_index * 0.6180339887) % 1.0
    value = 0.85 if class_index % 2 == 0 else 0.6
    return np.array(colorsys.hsv_to_rgb(hue, 0.75, value)) * 255


def photo_like(rng: np.random.Generator, width: int, height: int, tint: np.ndarray) -> Image.Image:
    """Smooth colour fields around the class tint, a few soft shapes and sensor-like noise:
    compresses like a photo, and a random crop of it still carries the class."""
    coarse = np.clip(tint + rng.normal(0, 40, size=(4, 5, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = (
            x0 + int(rng.integers(10, width // 2 + 11)),
            y0 + int(rng.integers(10, height // 2 + 11)),
        )
        colour = tuple(int(c) for c in np.clip(tint + rng.normal(0, 70, 3), 0, 255))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    # Fine texture at half resolution plus sensor noise: without them a JPEG of this is half the
    # size of a photo of that size (~85 KiB here at ~420x365), and decode/encode cost follows size.
    texture = rng.integers(0, 256, (height // 2 + 1, width // 2 + 1), dtype=np.uint8)
    texture = Image.fromarray(texture).resize((width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.float32)
    pixels += (np.asarray(texture, dtype=np.float32)[..., None] - 128) * TEXTURE_CONTRAST
    pixels += rng.normal(0, 12, size=(height, width, 1))  # luma noise
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def encode(image: Image.Image, kind: str | None, rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    quality = int(rng.integers(85, 96))
    if kind == "cmyk":
        image.convert("CMYK").save(out, "JPEG", quality=quality)
    elif kind == "png":
        image.save(out, "PNG", compress_level=1)
    elif kind == "grayscale":
        image.convert("L").save(out, "JPEG", quality=quality)
    else:
        image.save(out, "JPEG", quality=quality)
    data = out.getvalue()
    return data[: len(data) // 2] if kind == "truncated" else data


def make_image(
    seed: int, split: int, index: int, class_index: int, kind: str | None = None
) -> bytes:
    rng = np.random.default_rng([seed, split, index])
    return encode(photo_like(rng, *image_size(rng), class_tint(class_index)), kind, rng)


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 1325376000, 0o644  # fixed: same bytes every run
    archive.addfile(info, io.BytesIO(data))


def make_sample(
    output: str,
    classes: int,
    train_per_class: int,
    val_images: int,
    quirks: bool = False,
    seed: int = 0,
) -> Sample:
    """Writes the three ILSVRC files into output and describes what is in them."""
    os.makedirs(output, exist_ok=True)
    synsets = synset_names(classes)
    quirk_kinds = list(QUIRKS) if quirks else []
    train_names, quirk_of = {}, {}
    paths = {name: os.path.join(output, name) for name in (TRAIN_TAR, VAL_TAR, VAL_LABELS)}
    with tarfile.open(paths[TRAIN_TAR], "w", format=tarfile.GNU_FORMAT) as train:
        counter = 0
        for class_index, synset in enumerate(synsets):
            inner_bytes = io.BytesIO()
            with tarfile.open(fileobj=inner_bytes, mode="w", format=tarfile.GNU_FORMAT) as inner:
                names = [f"{synset}_{j + 1}.JPEG" for j in range(train_per_class)]
                for name in names:
                    kind = quirk_kinds[counter] if counter < len(quirk_kinds) else None
                    if kind:
                        quirk_of[name] = kind
                    _add(inner, name, make_image(seed, 0, counter, class_index, kind))
                    counter += 1
            train_names[synset] = names
            _add(train, f"{synset}.tar", inner_bytes.getvalue())
    rng = np.random.default_rng([seed, 2])
    val_classes = rng.integers(0, classes, size=val_images)
    val_synsets = [synsets[i] for i in val_classes]
    with tarfile.open(paths[VAL_TAR], "w", format=tarfile.GNU_FORMAT) as val:
        for index, class_index in enumerate(val_classes):
            image = make_image(seed, 1, index, int(class_index))
            _add(val, f"ILSVRC2012_val_{index + 1:08d}.JPEG", image)
    with open(paths[VAL_LABELS], "w") as f:
        f.write("".join(f"{synset}\n" for synset in val_synsets))
    return Sample(
        paths[TRAIN_TAR],
        paths[VAL_TAR],
        paths[VAL_LABELS],
        synsets,
        train_names,
        val_synsets,
        quirk_of,
    )


def main(argv: list[str] | None = None) -> None:
    parser = OneLineErrorParser(
        prog="python -m trainer.preprocess.sample", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--output", required=True, help="directory for the three ILSVRC files")
    parser.add_argument("--classes", type=int, default=10, help="synsets")
    parser.add_argument("--train-per-class", type=int, default=20, help="train images per synset")
    parser.add_argument("--val-images", type=int, default=50, help="validation images")
    parser.add_argument(
        "--quirks", action="store_true", help="add CMYK, PNG-as-JPEG, grayscale, truncated"
    )
    parser.add_argument("--seed", type=int, default=0, help="same seed, same bytes")
    args = parser.parse_args(argv)
    require_at_least(
        ("--classes", args.classes, 1),
        ("--train-per-class", args.train_per_class, 1),
        ("--val-images", args.val_images, 1),
        ("--seed", args.seed, 0),
    )
    if args.quirks and args.classes * args.train_per_class < len(QUIRKS):
        fail(f"--quirks needs at least {len(QUIRKS)} train images")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        fail(f"--output: {args.output} is a file; expected a directory")
    try:
        sample = make_sample(
            args.output, args.classes, args.train_per_class, args.val_images, args.quirks, args.seed
        )
    except OSError as exc:
        fail(f"--output: cannot write {exc.filename or args.output}: {exc.strerror or exc}")
    total = args.classes * args.train_per_class
    print(
        f"wrote {sample.train_tar} ({total} images), {sample.val_tar} ({args.val_images}), {sample.val_labels}"
    )


if __name__ == "__main__":
    main()
