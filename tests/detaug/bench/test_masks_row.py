"""The ``masks`` recipe of ``detaug bench``: the default recipe with an ellipse mask per box, on
the same photos as the other rows, its ratios to the decode limit and to the default recipe."""

from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest

from detaug.bench.dataset import prepare_dataset
from detaug.bench.harness import BenchSettings
from detaug.bench.mask_data import ellipse_polygon, write_ellipse_masks
from detaug.masks import CocoMasks

SIZE = 96


def test_the_ellipse_is_inscribed_in_its_box():
    poly = np.array(ellipse_polygon([10, 20, 40, 10], points=8)).reshape(-1, 2)
    np.testing.assert_allclose(poly[[0, 2, 4, 6]], [[50, 25], [30, 20], [10, 25], [30, 30]], atol=1e-9)
    hw = (40, 60)
    mask = CocoMasks([[ellipse_polygon([10, 20, 40, 10])]]).decode(hw)[0][0]
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (20, 29, 10, 49)  # the box's pixels, no more
    assert 0.7 < mask.sum() / 400 < 0.85  # pi / 4 of the box


def test_the_masks_row_gives_a_mask_per_box_in_its_targets(voc_folder, tmp_path):
    from detaug.bench.detaug_variants import iter_detaug

    dataset = prepare_dataset(voc_folder, repeat_to=8, work_dir=tmp_path / "data")
    out = write_ellipse_masks(dataset.annotations_file, tmp_path / "masks.json")
    doc = json.loads(out.read_text())
    assert all(len(a["segmentation"]) == 1 and len(a["segmentation"][0]) == 64 for a in doc["annotations"])
    settings = BenchSettings(device="cpu", batch_size=4, workers=0, threads=2, size=SIZE, seed=0, recipe="masks")
    batches = iter_detaug(dataset, settings)
    try:
        for images, targets in islice(batches, 3):  # crosses the end of the 2-batch epoch
            assert images.shape == (4, 3, SIZE, SIZE)
            for t in targets:
                masks, boxes = t["masks"].numpy(), t["boxes"].numpy()
                assert masks.shape == (len(boxes), SIZE, SIZE)
                for m, b in zip(masks, boxes):  # each mask inside its box (the ellipse moved with it)
                    if m.any():
                        ys, xs = np.nonzero(m)
                        assert xs.min() >= b[0] - 1.01 and xs.max() + 1 <= b[2] + 1.01
                        assert ys.min() >= b[1] - 1.01 and ys.max() + 1 <= b[3] + 1.01
    finally:
        batches.close()


def test_the_masks_row_beside_the_default_one(voc_folder, tmp_path, capsys):
    from detaug import cli

    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--device", "cpu", "--quiet", "--json", str(out), "--data", str(voc_folder),
                     "--repeat-to", "8", "--batch-sizes", "4", "--recipes", "default,masks", "--images", "8",
                     "--warmup", "1", "--threads", "2", "--size", str(SIZE), "--only", "decode,detaug"]) == 0
    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["settings"]["recipes"] == ["default", "masks"]
    rows = {(r["recipe"], r["variant"]): r for r in results["results"]}
    assert set(rows) == {(None, "decode"), ("default", "detaug"), ("masks", "detaug")}
    masks, default, limit = rows["masks", "detaug"], rows["default", "detaug"], rows[None, "decode"]
    assert masks["status"] == default["status"] == "ok", (masks["message"], default["message"])
    assert masks["images"] >= 8 and masks["size"] == SIZE and "ellipse mask per box" in masks["note"]
    assert masks["vs_decode"] == pytest.approx(masks["img_per_s"] / limit["img_per_s"])
    assert masks["vs_default_recipe"] == pytest.approx(masks["img_per_s"] / default["img_per_s"])
    assert masks["source_images_per_sample"] == 1.0
    printed = capsys.readouterr().out
    assert "masks" in printed and "vs default" in printed
