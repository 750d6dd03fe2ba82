"""Calibration and evaluation samples: .npy/.npz files or a folder of images.

- ``.npy``: one array ``[N, ...]`` for a single-input model.
- ``.npz``: one array ``[N, ...]`` per input name; an optional ``labels`` array ``[N]``
  (class indices) turns top-1 *agreement* into a top-1 *accuracy* drop.
- a folder: every ``.npy``/``.npz`` in it (sorted), or, when it holds none, every image,
  preprocessed with the declared :class:`~converters.images.ImagePreprocessing`.

Samples are kept without their batch axis; consecutive samples of equal shapes are
batched together, so files with different sequence lengths exercise dynamic axes.

Without an evaluation set, FP32/FP16 are verified on a synthetic one
(:mod:`converters.synthetic`): a :class:`SampleSet` like the others, whose ``synthetic``
says how it was drawn (seed, each input's range and why).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from converters.errors import InputSpecMismatch, InvalidDataset
from converters.images import ImagePreprocessing, image_files, load_image
from converters.spec import InputSpec

Sample = Mapping[str, np.ndarray]
LABELS_KEY = "labels"


@dataclass(frozen=True)
class ValueRange:
    """How one input's synthetic values were drawn, and why those."""

    name: str
    distribution: Literal["uniform", "normal", "ones"]
    low: float | None  # uniform: the bounds, both included; normal: mean 0, std 1
    high: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "distribution": self.distribution,
                "range": [self.low, self.high] if self.low is not None else None,
                "reason": self.reason}

    def describe(self) -> str:
        if self.distribution == "normal":
            return f"{self.name}: standard normal ({self.reason})"
        if self.distribution == "ones":
            return f"{self.name}: ones ({self.reason})"
        return f"{self.name}: uniform in [{self.low:.4g}, {self.high:.4g}] ({self.reason})"


@dataclass(frozen=True)
class SyntheticOrigin:
    seed: int
    ranges: tuple[ValueRange, ...]


@dataclass(frozen=True)
class SampleSet:
    role: str  # "calibration" / "evaluation"
    source: str
    samples: tuple[Sample, ...]
    labels: tuple[int, ...] | None = None
    synthetic: SyntheticOrigin | None = None  # drawn, not the owner's data

    def __len__(self) -> int:
        return len(self.samples)

    def head(self, count: int) -> SampleSet:
        labels = self.labels[:count] if self.labels is not None else None
        return replace(self, samples=self.samples[:count], labels=labels)

    def strided(self, count: int) -> SampleSet:
        """``count`` samples spread over the whole set (not just its first file)."""
        if count >= len(self):
            return self
        index = np.linspace(0, len(self) - 1, count).round().astype(int)
        labels = tuple(self.labels[i] for i in index) if self.labels is not None else None
        return replace(self, samples=tuple(self.samples[i] for i in index), labels=labels)

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Stacked batches of up to ``batch_size`` consecutive samples of equal shapes."""
        group: list[Sample] = []
        for sample in self.samples:
            if group and (len(group) == batch_size or _shapes(group[0]) != _shapes(sample)):
                yield _stack(group)
                group = []
            group.append(sample)
        if group:
            yield _stack(group)

    def first_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` copies-or-samples of the first sample's shape (for warm-up, profiling)."""
        shape = _shapes(self.samples[0])
        same = [s for s in self.samples if _shapes(s) == shape][:batch_size]
        while len(same) < batch_size:
            same.extend(same[: batch_size - len(same)])
        return _stack(same)

    def fingerprints(self) -> set[str]:
        return {_fingerprint(s) for s in self.samples}


def _shapes(sample: Sample) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((k, tuple(v.shape)) for k, v in sorted(sample.items()))


def _stack(group: Sequence[Sample]) -> dict[str, np.ndarray]:
    return {name: np.stack([s[name] for s in group]) for name in group[0]}


def _fingerprint(sample: Sample) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    for name, array in sorted(sample.items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def load_samples(
    path: Path,
    spec: InputSpec,
    role: str,
    preprocessing: ImagePreprocessing | None = None,
    limit: int | None = None,
) -> SampleSet:
    """Read a sample set and check it against the model's input spec."""
    if not path.exists():
        raise InvalidDataset(f"{role} set {path} does not exist")
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.suffix in (".npy", ".npz")
    )
    samples: list[Sample] = []
    labels: list[int] = []
    has_labels = True
    if files:
        for file in files:
            arrays = _read_arrays(file, spec, role)
            file_labels = arrays.pop(LABELS_KEY, None)
            count = _count(arrays, file, role)
            samples.extend({k: v[i] for k, v in arrays.items()} for i in range(count))
            if file_labels is None:
                has_labels = False
            else:
                labels.extend(int(x) for x in np.asarray(file_labels).reshape(-1)[:count])
    elif path.is_dir() and image_files(path):
        samples, has_labels = _read_images(path, spec, role, preprocessing), False
    if not samples:
        raise InvalidDataset(
            f"{role} set {path} holds no samples (expected .npy/.npz arrays or image files)"
        )
    if limit is not None:
        samples, labels = samples[:limit], labels[:limit]
    for index, sample in enumerate(samples):
        spec.check_sample(sample, f"{role} set {path} sample {index}")
    return SampleSet(role, str(path), tuple(samples), tuple(labels) if has_labels else None)


def _read_arrays(file: Path, spec: InputSpec, role: str) -> dict[str, np.ndarray]:
    try:
        if file.suffix == ".npz":
            with np.load(file, allow_pickle=False) as archive:
                arrays = {k: archive[k] for k in archive.files}
        else:
            if len(spec.inputs) != 1:
                raise InvalidDataset(
                    f"{role} file {file} is a single .npy array but the model has inputs "
                    f"{list(spec.names)}: use an .npz with one array per input"
                )
            arrays = {spec.inputs[0].name: np.load(file, allow_pickle=False)}
    except (OSError, ValueError) as exc:
        raise InvalidDataset(f"{role} file {file} cannot be read: {exc}") from None
    unknown = sorted(set(arrays) - set(spec.names) - {LABELS_KEY})
    if unknown:
        raise InputSpecMismatch(
            f"{role} file {file} has arrays {unknown} that are not model inputs "
            f"{list(spec.names)}"
        )
    for tensor in spec.inputs:
        array = arrays.get(tensor.name)
        if array is None:
            continue
        want = np.dtype(tensor.dtype)
        if array.dtype != want and array.dtype.kind == want.kind:
            arrays[tensor.name] = array.astype(want)  # float64 -> float32, int32 -> int64
    return arrays


def _count(arrays: Mapping[str, np.ndarray], file: Path, role: str) -> int:
    counts = {k: (v.shape[0] if v.ndim else 0) for k, v in arrays.items()}
    if len(set(counts.values())) > 1:
        raise InvalidDataset(f"{role} file {file} has arrays of different lengths {counts}")
    return next(iter(counts.values()), 0)


def _read_images(
    folder: Path, spec: InputSpec, role: str, preprocessing: ImagePreprocessing | None
) -> list[Sample]:
    if preprocessing is None:
        raise InvalidDataset(
            f"{role} set {folder} is a folder of images: declare its preprocessing "
            "(--preprocess efficientnet-lite|imagenet|JSON)"
        )
    floats = [t for t in spec.inputs if np.issubdtype(np.dtype(t.dtype), np.floating)]
    if len(spec.inputs) != 1 or not floats:
        raise InputSpecMismatch(
            f"{role} set {folder} holds images, but the model's inputs {list(spec.names)} are "
            "not a single float image tensor"
        )
    name, dtype = floats[0].name, floats[0].dtype
    samples: list[Sample] = []
    for file in image_files(folder):
        try:
            samples.append({name: preprocessing(load_image(file)).astype(dtype)})
        except OSError as exc:
            raise InvalidDataset(f"{role} image {file} cannot be read: {exc}") from None
    return samples
