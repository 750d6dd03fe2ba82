"""Real photographs that ship inside installed packages (nothing is downloaded), and
varied views of them: the calibration and evaluation sets of the INT8 study.

The pool: scikit-image's bundled data (colour and greyscale photographs), scikit-learn's
two sample photos, matplotlib's sample photo and mahotas' demo photos. Greyscale photos
are used as RGB. Synthetic pictures (logos, text pages, binary silhouettes) are left out.

Views (:func:`varied_views`) are random crops over a wide range of scales and aspect
ratios, flips, small rotations and colour/brightness changes: a classifier sees
different objects, parts and textures in them, so agreement measured on them is not
the agreement on six near-identical crops. Views of one photo are not independent:
:func:`converters.confidence.photo_bootstrap` resamples photos, not views.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from converters.images import load_image


@dataclass(frozen=True)
class BundledPhoto:
    name: str
    package: str  # import name of the package that ships it
    relative: str  # path inside the package


_SKIMAGE = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
            "motorcycle_right.png", "retina.jpg", "hubble_deep_field.jpg", "ihc.png",
            "camera.png", "coins.png", "moon.png", "brick.png", "grass.png", "gravel.png",
            "clock_motion.png")
PHOTO_POOL: tuple[BundledPhoto, ...] = (
    *(BundledPhoto(f.rsplit(".", 1)[0], "skimage", f"data/{f}") for f in _SKIMAGE),
    BundledPhoto("china", "sklearn", "datasets/images/china.jpg"),
    BundledPhoto("flower", "sklearn", "datasets/images/flower.jpg"),
    BundledPhoto("grace_hopper", "matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    BundledPhoto("present", "matplotlib", "mpl-data/sample_data/Minduka_Present_Blue_Pack.png"),
    BundledPhoto("department_store", "mahotas", "demos/data/DepartmentStore.jpg"),
    BundledPhoto("luispedro", "mahotas", "demos/data/luispedro.jpg"),
)


# Objects and scenes: what an ImageNet classifier is meant to answer on. Textures (brick,
# grass, gravel), microscopy (ihc) and deep-space images are real photographs too, but
# FP32 EfficientNet-Lite0 barely decides them (top-2 softmax margin under 5% on about a
# third of their views; even FP16 then agreed on only 99.1%): they measure tie-breaking
# noise, not quantization quality.
OBJECT_PHOTOS = tuple(p for p in PHOTO_POOL if p.name not in (
    "brick", "grass", "gravel", "ihc", "hubble_deep_field"))


def photo_path(photo: BundledPhoto) -> Path | None:
    """Where the photo is installed, or None when its package is not."""
    spec = importlib.util.find_spec(photo.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / photo.relative
    return path if path.is_file() else None


def available_photos(pool: Sequence[BundledPhoto] = PHOTO_POOL) -> list[tuple[str, Path]]:
    """(name, path) of every photo of ``pool`` that is installed here."""
    found = [(p.name, photo_path(p)) for p in pool]
    return [(name, path) for name, path in found if path is not None]


def varied_views(image: Image.Image, count: int, seed: int) -> Iterator[Image.Image]:
    """Deterministic, varied views: crops of 15-100% of the area with aspect ratios 3:4 to
    4:3, flips, rotations up to 12 degrees, brightness/contrast/colour 0.7-1.3."""
    rng = np.random.default_rng(seed)
    w, h = image.size
    for _ in range(count):
        area = rng.uniform(0.15, 1.0) * w * h
        ratio = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        cw = int(min(w, max(32, round(np.sqrt(area * ratio)))))
        ch = int(min(h, max(32, round(np.sqrt(area / ratio)))))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        view = image.crop((left, top, left + cw, top + ch))
        if rng.random() < 0.5:
            view = ImageOps.mirror(view)
        angle = float(rng.uniform(-12, 12))
        if abs(angle) > 2:
            view = view.rotate(angle, resample=Image.Resampling.BILINEAR, expand=False)
        for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
            view = enhance(view).enhance(float(rng.uniform(0.7, 1.3)))
        yield view


def write_varied_views(folder: Path, per_photo: int, seed: int,
                       photos: Sequence[tuple[str, Path]] | None = None) -> Path:
    """PNG views ``<photo>_<seed>_<index>.png`` of every available photo (use different
    seeds for calibration and evaluation sets)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, (name, path) in enumerate(photos or available_photos()):
        image = load_image(path)
        for view_index, view in enumerate(varied_views(image, per_photo, seed + 7919 * index)):
            view.save(folder / f"{name}_{seed}_{view_index:04d}.png")
    return folder


def photo_of(file_name: str) -> str:
    """The source photo of a view written by :func:`write_varied_views`."""
    return file_name.rsplit("_", 2)[0]
