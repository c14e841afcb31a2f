"""trainer.preprocess.jpeg, the libjpeg-turbo fast path, and how trainer.preprocess.images routes to it.

.venv/bin/python -m pytest tests/trainer/test_preprocess_jpeg.py
"""

import io
import math

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from trainer.preprocess import jpeg as fast_path
from trainer.preprocess.images import SkippedImage, convert_image, target_size
from trainer.preprocess.sample import make_image

SHORT_SIDE = 256


def noisy_photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth colour field with sensor-like noise: the high frequencies a resize must handle."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8))
    pixels = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    pixels = pixels + rng.normal(0, 7, size=(height, width, 1)).astype(np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, **options)
    return out.getvalue()


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    mse = np.mean((image.astype(np.float64) - reference) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


SIZES = [(500, 375), (375, 500), (500, 333), (300, 260), (900, 600), (1600, 1200), (2500, 2100)]


@pytest.mark.parametrize(("width", "height"), [*SIZES, (4400, 4200)])
def test_decodes_at_the_smallest_simd_scale_covering_the_target(width, height, monkeypatch):
    target = target_size(width, height, SHORT_SIDE)
    m = fast_path.scale_eighths(width, height, target)

    def covers(k: int) -> bool:
        return math.ceil(width * k / 8) >= target[0] and math.ceil(height * k / 8) >= target[1]

    assert m in (1, 2, 4, 8) and covers(m)
    assert not any(covers(k) for k in (1, 2, 4) if k < m)
    decoded = []
    real_decode = simplejpeg.decode_jpeg

    def recording_decode(*args, **kwargs):
        pixels = real_decode(*args, **kwargs)
        decoded.append(pixels.shape[:2])
        return pixels

    monkeypatch.setattr(fast_path.simplejpeg, "decode_jpeg", recording_decode)
    data = jpeg(noisy_photo(width, height))
    pixels = fast_path.decode_resized(data, (width, height), target)
    assert decoded == [(math.ceil(height * m / 8), math.ceil(width * m / 8))]
    assert pixels.shape == (target[1], target[0], 3)


@pytest.mark.parametrize(("width", "height"), [*SIZES, (200, 150), (256, 400), (257, 257)])
def test_output_has_the_exact_short_side_and_is_never_upscaled(width, height):
    data = jpeg(noisy_photo(width, height))
    assert fast_path.fast_path_size(data) == (width, height)
    encoded, out_height, out_width = convert_image(data, SHORT_SIDE, 90)
    with Image.open(io.BytesIO(encoded)) as image:
        assert image.format == "JPEG" and image.mode == "RGB"
        assert image.size == (out_width, out_height) == target_size(width, height, SHORT_SIDE)
    assert min(out_width, out_height) == min(width, height, SHORT_SIDE)


def recipe_resize(data: bytes, target: tuple[int, int]) -> np.ndarray:
    """What the replaced recipe's resizer does: full TF decode, bilinear without antialiasing."""
    import tensorflow as tf

    full = tf.io.decode_jpeg(data, channels=3)
    resized = tf.image.resize(full, (target[1], target[0]), method="bilinear", antialias=False)
    return tf.cast(tf.round(resized), tf.uint8).numpy()


def test_at_least_as_faithful_as_the_recipe_it_replaces():
    """Against an exact Pillow decode + antialiased resize, the fast path (DCT scaling, then
    bilinear) must stay at least as close as the recipe's TensorFlow resize of the full image."""
    images = [make_image(1, 0, index, index % 10) for index in range(40)]
    images += [jpeg(noisy_photo(w, h, seed)) for seed, (w, h) in enumerate(SIZES)]
    fast, recipe = [], []
    for data in images:
        original = fast_path.fast_path_size(data)
        target = target_size(*original, SHORT_SIDE)
        if target == original:
            continue
        with Image.open(io.BytesIO(data)) as image:
            exact = np.asarray(image.convert("RGB").resize(target, Image.Resampling.BILINEAR))
        fast.append(psnr(fast_path.decode_resized(data, original, target), exact))
        recipe.append(psnr(recipe_resize(data, target), exact))
    assert len(fast) >= 30
    assert np.mean(fast) >= np.mean(recipe), (np.mean(fast), np.mean(recipe))
    assert min(fast) >= min(recipe), (min(fast), min(recipe))
    assert min(fast) >= 28, sorted(fast)[:5]


def quirk(kind: str) -> bytes:
    image = noisy_photo(500, 375)
    out = io.BytesIO()
    if kind == "png":
        image.save(out, "PNG")
    elif kind == "cmyk":
        image.convert("CMYK").save(out, "JPEG", quality=90)
    elif kind == "grayscale":
        image.convert("L").save(out, "JPEG", quality=90)
    elif kind == "progressive":
        image.save(out, "JPEG", quality=90, progressive=True)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["png", "cmyk", "grayscale", "progressive"])
def test_other_images_take_pillows_path(kind):
    data = quirk(kind)
    assert fast_path.fast_path_size(data) is None
    encoded, height, width = convert_image(data, SHORT_SIDE, 90)
    with Image.open(io.BytesIO(encoded)) as image:
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (341, 256))
    assert (width, height) == (341, 256)


def test_frame_markers_are_found_past_other_segments():
    plain = noisy_photo(64, 48)
    exif = Image.Exif()
    exif[0x010E] = "a description long enough to make a real APP1 segment"
    assert fast_path.frame_marker(jpeg(plain, exif=exif.tobytes())) == 0xC0
    assert fast_path.frame_marker(jpeg(plain, progressive=True)) == 0xC2
    assert fast_path.frame_marker(b"\x89PNG\r\n\x1a\n") is None
    assert fast_path.frame_marker(b"\xff\xd8\xff") is None


def test_a_truncated_jpeg_is_left_to_pillow_which_skips_it():
    data = jpeg(noisy_photo(500, 375))
    truncated = data[: len(data) // 2]
    assert fast_path.fast_path_size(truncated) == (500, 375)
    assert fast_path.decode_resized(truncated, (500, 375), (341, 256)) is None
    with pytest.raises(SkippedImage, match="truncated image"):
        convert_image(truncated, SHORT_SIDE, 90)
