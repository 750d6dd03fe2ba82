"""ImageNet-style image preprocessing, shared by the sample model, tests and calibration.

EfficientNet-Lite0 (and the sample model) expects **NCHW float32 RGB, 224x224**:
resize the shorter side to 256 (bilinear), centre-crop 224x224, then ``(pixel - 127) / 128``
per channel (the normalisation the Lite models were trained with).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp"}


@dataclass(frozen=True)
class ImagePreprocessing:
    """A declared preprocessing for image folders (calibration/evaluation sets)."""

    size: int = 224
    resize_shorter: int = 256
    mean: tuple[float, float, float] = (127.0, 127.0, 127.0)
    std: tuple[float, float, float] = (128.0, 128.0, 128.0)
    layout: str = "NCHW"

    def __call__(self, image: Image.Image) -> np.ndarray:
        image = image.convert("RGB")
        w, h = image.size
        scale = self.resize_shorter / min(w, h)
        image = image.resize((max(1, round(w * scale)), max(1, round(h * scale))),
                             Image.Resampling.BILINEAR)
        w, h = image.size
        left, top = (w - self.size) // 2, (h - self.size) // 2
        image = image.crop((left, top, left + self.size, top + self.size))
        pixels: np.ndarray = np.asarray(image, dtype=np.float32)
        pixels = np.subtract(pixels, np.asarray(self.mean, np.float32))
        pixels = np.divide(pixels, np.asarray(self.std, np.float32))
        if self.layout == "NCHW":
            pixels = pixels.transpose(2, 0, 1)
        return np.ascontiguousarray(pixels, dtype=np.float32)


EFFICIENTNET_LITE = ImagePreprocessing()
# torchvision's ImageNet normalisation, in 0-255 pixel units
IMAGENET = ImagePreprocessing(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
PREPROCESSING_PRESETS = {"efficientnet-lite": EFFICIENTNET_LITE, "imagenet": IMAGENET}


def preprocessing_from_text(text: str) -> ImagePreprocessing:
    """A preset name (``efficientnet-lite``, ``imagenet``) or a JSON object of fields."""
    if text in PREPROCESSING_PRESETS:
        return PREPROCESSING_PRESETS[text]
    try:
        fields: dict[str, Any] = json.loads(text)
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()
        }
        return ImagePreprocessing(**values)
    except (json.JSONDecodeError, TypeError) as exc:
        raise ValueError(
            f"unknown image preprocessing {text!r}: use one of "
            f"{', '.join(PREPROCESSING_PRESETS)} or a JSON object of ImagePreprocessing fields "
            f"({exc})"
        ) from None


def load_image(path: str | os.PathLike[str]) -> Image.Image:
    with Image.open(path) as image:
        return image.convert("RGB")


def sample_photo(name: str = "chelsea") -> Path:
    """Path of a photograph bundled inside scikit-image (no download): 'chelsea' is a cat.
    Some are PNG, some JPEG ('rocket', 'retina')."""
    import skimage

    folder = Path(skimage.__file__).parent / "data"
    for suffix in (".png", ".jpg"):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"bundled photo {name} missing from {folder}: is scikit-image installed?")


SAMPLE_PHOTOS = ("chelsea", "astronaut", "coffee", "rocket", "motorcycle_left", "retina")


def augmented_views(image: Image.Image, count: int, seed: int) -> Iterator[Image.Image]:
    """Deterministic random crops and flips of one photo: evaluation/calibration data
    when no labelled set is available."""
    rng = np.random.default_rng(seed)
    w, h = image.size
    for _ in range(count):
        frac = rng.uniform(0.55, 1.0)
        cw, ch = max(32, int(w * frac)), max(32, int(h * frac))
        left = int(rng.integers(0, w - cw + 1))
        top = int(rng.integers(0, h - ch + 1))
        view = image.crop((left, top, left + cw, top + ch))
        if rng.random() < 0.5:
            view = ImageOps.mirror(view)
        yield view


def image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
