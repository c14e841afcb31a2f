"""The fast path of trainer.preprocess.images: libjpeg-turbo scaling while it decodes, then OpenCV.

Nearly every ImageNet image is a sequential YCbCr JPEG. For those, libjpeg-turbo (bundled in
simplejpeg) decodes straight to the smallest of 1/8, 1/4, 1/2 and 1 whose size still covers the
target, an OpenCV bilinear resize covers the remaining ratio (over 1/2), and libjpeg-turbo
re-encodes. libjpeg-turbo can also scale by 3/8, 5/8, 6/8 and 7/8, but those IDCTs are plain C
where the four above are SIMD: on sample.py's ImageNet-like images a 6/8 or 7/8 decode
cost 0.2-0.35 ms more than a full decode plus the bilinear resize, and landed further from an
antialiased resize of the full image (PSNR down to 33 dB instead of 37: ringing at sharp edges).
Anything else (PNG, CMYK, grayscale, progressive or arithmetic-coded JPEGs, and any JPEG that
libjpeg-turbo warns about, such as a truncated one) gets None here and takes Pillow's path, which
decides what to convert and what to skip.
Tested by: .venv/bin/python -m pytest tests/trainer/test_preprocess_jpeg.py
"""

import math

import cv2
import numpy as np
import simplejpeg
from PIL import Image

# One worker process per core: OpenCV's own thread pool would only oversubscribe the cores.
cv2.setNumThreads(1)

_SEQUENTIAL_HUFFMAN = {0xC0, 0xC1}  # SOF0 baseline, SOF1 extended sequential
_NOT_FRAMES = {0xC4, 0xC8, 0xCC}  # DHT, JPG (reserved) and DAC share the SOFn range
_START_OF_SCAN = 0xDA
_SIMD_EIGHTHS = (1, 2, 4, 8)  # the scales libjpeg-turbo has SIMD IDCTs for, in eighths


def frame_marker(data: bytes) -> int | None:
    """The start-of-frame marker (0xC0 baseline, 0xC2 progressive, ...), None if not a JPEG."""
    if data[:2] != b"\xff\xd8":
        return None
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
        elif 0xC0 <= marker <= 0xCF and marker not in _NOT_FRAMES:
            return marker
        elif marker == _START_OF_SCAN:
            return None
        else:
            position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return None


def scale_eighths(width: int, height: int, target: tuple[int, int]) -> int:
    """The smallest SIMD scale M/8 whose decode (libjpeg-turbo rounds sizes up) covers target."""
    return next(
        m
        for m in _SIMD_EIGHTHS
        if math.ceil(width * m / 8) >= target[0] and math.ceil(height * m / 8) >= target[1]
    )


def fast_path_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a sequential YCbCr JPEG, which this path takes; None for anything else."""
    if frame_marker(data) not in _SEQUENTIAL_HUFFMAN:
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace != "YCbCr" or width * height > Image.MAX_IMAGE_PIXELS:
        return None  # Pillow converts the colour space or rejects the decompression bomb
    return width, height


def decode_resized(
    data: bytes, size: tuple[int, int], target: tuple[int, int]
) -> np.ndarray | None:
    """RGB pixels of a JPEG of size (width, height) resized to target, at most that size.

    None if libjpeg-turbo warns about the data (truncated, corrupt): Pillow then judges the image.
    """
    m = scale_eighths(*size, target)
    try:
        pixels = simplejpeg.decode_jpeg(
            data, min_width=math.ceil(size[0] * m / 8), min_height=math.ceil(size[1] * m / 8)
        )  # strict: warnings raise too
    except ValueError:
        return None
    if (pixels.shape[1], pixels.shape[0]) != target:
        # Bilinear without antialiasing, as the recipe's TensorFlow resizer does: it aliases fine
        # texture a little (PSNR ~37 dB mean vs an antialiased resize, the recipe's ~36), while
        # area averaging would cost ~1 ms more per image. Below 1/2 left over, area averaging.
        shrink = 2 * target[0] < pixels.shape[1]
        interpolation = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        pixels = cv2.resize(pixels, target, interpolation=interpolation)
    return pixels


def encode(pixels: np.ndarray, quality: int) -> bytes:
    """A JPEG with 4:2:0 chroma, as Pillow writes by default: the same size for the same quality."""
    return simplejpeg.encode_jpeg(pixels, quality, colorsubsampling="420")
