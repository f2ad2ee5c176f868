"""examples/draw_previews.py: the pictures of docs/mixing.md are drawn, on the CPU, from
synthetic scenes, and the same on every run (one seed, one picture)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "draw_previews.py"


def _load():
    spec = importlib.util.spec_from_file_location("draw_previews", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_pictures_are_drawn_and_reproducible(tmp_path):
    example = _load()
    first = example.draw(tmp_path / "a", num=2)
    second = example.draw(tmp_path / "b", num=2)
    assert [p.name for p in first] == list(example.PICTURES) == ["mosaic-yolo.png", "perspective-rotation.png"]
    pictures = [np.asarray(Image.open(p).convert("RGB")) for p in first]
    for a, b in zip(pictures, (np.asarray(Image.open(p).convert("RGB")) for p in second)):
        np.testing.assert_array_equal(a, b)
    mosaic, warped = pictures
    assert mosaic.shape != warped.shape  # 320-pixel YOLO samples, 256-pixel letterboxed ones
    for picture in pictures:
        assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 100  # tinted, gridded scenes, not a blank canvas
