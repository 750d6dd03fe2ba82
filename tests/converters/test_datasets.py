"""Calibration/evaluation sets: formats, batching by shape, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from converters.datasets import load_samples
from converters.errors import InputSpecMismatch, InvalidDataset
from converters.images import EFFICIENTNET_LITE
from converters.spec import parse_input_spec

TEXT = parse_input_spec("ids:int64[batch,sequence];mask:int64[batch,sequence]")
IMAGE = parse_input_spec("input:float32[batch,3,224,224]")


def test_load_samples_batches_by_sequence_length_when_files_differ(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", ids=np.ones((3, 8), np.int32), mask=np.ones((3, 8), np.int64))
    np.savez(tmp_path / "b.npz", ids=np.ones((2, 5), np.int64), mask=np.ones((2, 5), np.int64))
    samples = load_samples(tmp_path, TEXT, "evaluation")
    assert len(samples) == 5
    shapes = [b["ids"].shape for b in samples.batches(2)]
    assert shapes == [(2, 8), (1, 8), (2, 5)]
    assert samples.samples[0]["ids"].dtype == np.int64  # int32 widened to the model's int64
    assert samples.labels is None


def test_load_samples_keeps_labels_when_npz_has_them(tmp_path: Path) -> None:
    spec = parse_input_spec("x:float32[batch,4]")
    np.savez(tmp_path / "s.npz", x=np.zeros((3, 4), np.float32), labels=np.array([1, 2, 3]))
    assert load_samples(tmp_path / "s.npz", spec, "evaluation").labels == (1, 2, 3)


def test_load_samples_preprocesses_images_when_folder_holds_photos(tmp_path: Path) -> None:
    Image.new("RGB", (300, 260), (127, 200, 0)).save(tmp_path / "a.png")
    samples = load_samples(tmp_path, IMAGE, "calibration", EFFICIENTNET_LITE)
    pixels = samples.samples[0]["input"]
    assert pixels.shape == (3, 224, 224)
    assert pixels[0].max() == pytest.approx(0.0) and pixels[1].min() > 0.5


def test_load_samples_refuses_when_folder_is_empty(tmp_path: Path) -> None:
    (tmp_path / "calib").mkdir()
    with pytest.raises(InvalidDataset, match=r"calibration set .*calib holds no samples"):
        load_samples(tmp_path / "calib", IMAGE, "calibration", EFFICIENTNET_LITE)


def test_load_samples_asks_for_preprocessing_when_images_have_none(tmp_path: Path) -> None:
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    with pytest.raises(InvalidDataset, match="declare its preprocessing"):
        load_samples(tmp_path, IMAGE, "evaluation")


def test_load_samples_names_unknown_arrays_when_npz_does_not_fit(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", pixels=np.zeros((2, 3, 224, 224), np.float32))
    with pytest.raises(InputSpecMismatch, match=r"arrays \['pixels'\] that are not model inputs"):
        load_samples(tmp_path / "s.npz", IMAGE, "evaluation")


def test_first_batch_repeats_samples_when_set_is_smaller_than_batch(tmp_path: Path) -> None:
    spec = parse_input_spec("x:float32[batch,2]")
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(3, 2))
    batch = load_samples(tmp_path / "x.npy", spec, "evaluation").first_batch(5)["x"]
    assert batch.shape == (5, 2)
    assert batch[3].tolist() == [0.0, 1.0]
