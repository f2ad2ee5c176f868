"""Fixtures of the bench's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def coco_folder(tmp_path_factory) -> Path:
    """A small generated COCO dataset (8 images, 160x120, 1-4 boxes each) for the training rows."""
    from detaug.synthetic import write_coco_dataset

    root = tmp_path_factory.mktemp("train_data")
    write_coco_dataset(root, num_images=8, size=(160, 120), min_objects=1, max_objects=4, seed=0, progress=False)
    return root
