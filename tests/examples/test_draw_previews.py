"""examples/draw_previews.py: the pictures of docs/mixing.md are drawn, on the CPU, from
synthetic scenes, and the same on every run (one seed, one picture). The script runs as shipped,
twice, in a subprocess (``--out`` a temporary folder, ``--num 2``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "draw_previews.py"
PICTURES = ["mosaic-yolo.png", "perspective-rotation.png"]
TIMEOUT_S = 300


def draw(out: Path) -> list[Path]:
    """``python examples/draw_previews.py --out OUT --num 2``; the pictures it wrote (and said so)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(out), "--num", "2"], cwd=out.parent, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    written = sorted(out.glob("*.png"))
    assert all(f"wrote {path}\n" in run.stdout for path in written), run.stdout[-2000:]
    return written


def test_the_docs_pictures_are_drawn_and_reproducible(tmp_path):
    first = draw(tmp_path / "a")
    second = draw(tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second] == PICTURES
    assert all(p.parent == tmp_path / "a" for p in first)
    pictures = [np.asarray(Image.open(p).convert("RGB")) for p in first]
    for a, b in zip(pictures, (np.asarray(Image.open(p).convert("RGB")) for p in second)):
        np.testing.assert_array_equal(a, b)
    mosaic, warped = pictures
    assert mosaic.shape != warped.shape  # 320-pixel YOLO samples, 256-pixel letterboxed ones
    for picture in pictures:
        assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 100  # tinted, gridded scenes, not a blank canvas
