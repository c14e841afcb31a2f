"""The per-image work of trainer.preprocess, run in worker processes: decode, resize, re-encode.

Formats and colour modes are detected from the bytes, never from the file name, so the CMYK
JPEGs, the PNG named .JPEG and the grayscale images in ImageNet all come out as RGB JPEGs.
Sequential YCbCr JPEGs, nearly all of ImageNet, take the fast path of jpeg.py; Pillow converts
the rest.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_local.py tests/trainer/test_preprocess_jpeg.py
"""

import io
import os
import signal
import threading
import time

from PIL import Image, UnidentifiedImageError

from trainer.preprocess.records import encode_example, frame_record

# The modes convert("RGB") maps faithfully; 16-bit and float images are rejected, not guessed.
_CONVERTIBLE_MODES = {"RGB", "L", "CMYK", "YCbCr", "P", "RGBA", "LA", "1"}


def init_worker() -> None:
    """Ctrl-C is the main process's to handle; a worker whose main process died exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()


def _exit_when_orphaned(parent: int) -> None:
    # The pool's queues keep both pipe ends open in the worker, so it never sees EOF by itself.
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


class SkippedImage(Exception):
    """An input image that cannot be converted; its message is the reason in the manifest."""


def target_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """The size whose shorter side is short_side, keeping the aspect ratio; never larger."""
    shorter = min(width, height)
    if shorter <= short_side:
        return width, height
    scale = short_side / shorter
    return max(1, round(width * scale)), max(1, round(height * scale))


def convert_image(data: bytes, short_side: int, quality: int) -> tuple[bytes, int, int]:
    """RGB JPEG bytes of the image with its shorter side at most short_side, and its height, width."""
    # Imported here: the main process imports this module but never converts, and OpenCV with
    # NumPy would add a quarter of a CPU-second to its start-up.
    from trainer.preprocess import jpeg

    original = jpeg.fast_path_size(data)
    if original is not None:
        size = target_size(*original, short_side)
        pixels = jpeg.decode_resized(data, original, size)
        if pixels is not None:
            return jpeg.encode(pixels, quality), size[1], size[0]
    try:
        with Image.open(io.BytesIO(data)) as image:
            size = target_size(*image.size, short_side)
            if image.mode not in _CONVERTIBLE_MODES:
                raise SkippedImage(f"unsupported colour mode {image.mode} ({image.format})")
            # libjpeg scales by 1/2, 1/4 or 1/8 while decoding, never below the requested size.
            image.draft(image.mode, size)
            image.load()
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            if rgb.size != size:
                # Antialiased bilinear: as sharp as bicubic at ImageNet's mild ratios, and cheaper.
                rgb = rgb.resize(size, Image.Resampling.BILINEAR)
            out = io.BytesIO()
            rgb.save(out, "JPEG", quality=quality)
    except UnidentifiedImageError:
        raise SkippedImage("not an image: unknown format") from None
    except OSError as exc:
        reason = "truncated image" if "truncated" in str(exc) else f"undecodable image: {exc}"
        raise SkippedImage(reason) from None
    except (ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise SkippedImage(f"undecodable image: {exc}") from None
    return out.getvalue(), size[1], size[0]


def image_record(
    data: bytes, filename: str, synset: str, label: int, short_side: int, quality: int
) -> bytes:
    """One framed TFRecord in the standard ImageNet schema (docs/contracts.md)."""
    jpeg, height, width = convert_image(data, short_side, quality)
    example = encode_example(
        {
            "image/encoded": jpeg,
            "image/format": b"JPEG",
            "image/class/label": label,
            "image/class/synset": synset.encode(),
            "image/height": height,
            "image/width": width,
            "image/filename": filename.encode(),
            "image/colorspace": b"RGB",
            "image/channels": 3,
        }
    )
    return frame_record(example)


def encode_batch(
    items: list[tuple[bytes, str, str, int]], short_side: int, quality: int
) -> list[tuple[bytes | None, str | None]]:
    """(record, None) or (None, reason) for each (data, filename, synset, label), in order."""
    results: list[tuple[bytes | None, str | None]] = []
    for data, filename, synset, label in items:
        try:
            results.append((image_record(data, filename, synset, label, short_side, quality), None))
        except SkippedImage as skipped:
            results.append((None, str(skipped)))
    return results
