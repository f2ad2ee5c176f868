"""The COCO annotation cache is built in bounded memory (the chunks' columns spilled to files in
the folder being written, the boxes grouped by image a group of images at a time): the same
arrays, bytes and report as the in-memory parse, and nothing but the cache left behind."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest

import detaug.formats.coco_stream as coco_stream
from detaug import DatasetError, DataWarning
from detaug.formats.columnar import cache_folder, load_coco_columns, parse_coco_columns


def coco_doc(n: int = 40) -> dict:
    """``n`` images (every seventh without a declared size, one EXIF-rotated, a non-ASCII name),
    annotations in an order unrelated to the images' (to be grouped), some to clip, drop and
    keep, crowd ones, some without an id."""
    rng = np.random.default_rng(0)
    images = [{"id": 1000 - 3 * i, "file_name": f"d{i % 3}/{i}{'é' if i == 5 else ''}.jpg",
               **({} if i % 7 == 3 else {"width": 64, "height": 48})} for i in range(n)]
    images[2]["exif_orientation"] = 6
    annotations = []
    for j in range(3 * n):
        x, y = (float(v) for v in rng.integers(-10, 70, 2))
        ann = {"id": 5000 + j, "image_id": images[int(rng.integers(0, n))]["id"], "category_id": int(rng.choice([3, 7])),
               "bbox": [x + 0.5, y, float(rng.integers(0, 30)), 9.25], "iscrowd": int(j % 11 == 0)}
        if j % 13 == 0:
            del ann["id"]
        annotations.append(ann)
    return {"images": images, "annotations": annotations,
            "categories": [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}]}


def _tiny_blocks(monkeypatch) -> list[str]:
    """Chunks of 64 bytes, checks of 7 boxes, groups of at most 5 kept boxes; returns the
    names of the spilled columns the build makes (recorded as they are made)."""
    monkeypatch.setattr(coco_stream, "CHUNK_BYTES", 64)  # what a cache build reads the file by
    monkeypatch.setattr(coco_stream, "_CHECK_ROWS", 7)
    monkeypatch.setattr(coco_stream, "_GROUP_ROWS", 5)
    made: list[str] = []
    real = coco_stream._Collector.column

    def column(self, name, dtype, shape=()):
        made.append(name if self.spill is not None else f"memory:{name}")
        return real(self, name, dtype, shape)

    monkeypatch.setattr(coco_stream._Collector, "column", column)
    return made


def _quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        return call(*args, **kwargs)


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def test_a_cache_built_in_tiny_blocks_is_the_in_memory_parse(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(coco_doc()))
    expected = _quiet(parse_coco_columns, path)  # in memory, default blocks
    assert expected.parsed_by == "stream" and expected.report.repairs and expected.report.notes
    made = _tiny_blocks(monkeypatch)
    built = _quiet(load_coco_columns, path)
    assert sum(name.startswith("group") for name in made) >= 10  # the kept boxes went through group files
    assert not any(name.startswith("memory:") for name in made)
    folder = cache_folder(path)
    for name, array in expected.arrays().items():
        got = built.arrays()[name]
        assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array), name
        assert (folder / f"{name}.npy").read_bytes() == _npy_bytes(array), name  # np.save's very bytes
    assert built.categories == expected.categories
    assert dict(built.report.counts) == dict(expected.report.counts)
    assert {r: [str(f) for f in fs] for r, fs in built.report.examples.items()} == \
        {r: [str(f) for f in fs] for r, fs in expected.report.examples.items()}
    assert built.table.present_labels().tolist() == np.unique(expected.table.labels).tolist()
    assert built.table.max_boxes() == expected.table.max_boxes()
    # nothing but the file, its cache (its arrays and meta.json) and the build lock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.json.detaug-cache", "a.json.detaug-cache.lock"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*(f"{n}.npy" for n in expected.arrays()), "meta.json"])
    again = _quiet(load_coco_columns, path)
    assert again.parsed_by == "cache" and np.array_equal(again.table.boxes, expected.table.boxes)


@pytest.mark.parametrize("spoil", [
    lambda d: d["annotations"][-1].update(bbox=[1e39, 0, 1, 1]),  # beyond float32: a non-finite box, an error
    lambda d: d["annotations"][-2].update(image_id=123456),  # an unknown image: load_coco names it
    lambda d: d["categories"].append({"id": 3, "name": "again"}),  # a duplicate category id, found at the end
])
def test_a_build_that_fails_midway_leaves_nothing_behind(tmp_path, monkeypatch, spoil):
    doc = coco_doc()
    spoil(doc)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetError) as expected:
        _quiet(parse_coco_columns, path)
    made = _tiny_blocks(monkeypatch)
    with pytest.raises(DatasetError) as got:
        _quiet(load_coco_columns, path)
    assert str(got.value) == str(expected.value) and str(path) in str(got.value)
    assert made  # the failure came after columns had been spilled
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.json.detaug-cache.lock"]


def test_a_file_found_irregular_midway_is_cached_by_load_coco_without_leftovers(tmp_path, monkeypatch):
    doc = coco_doc()
    doc["images"][-1]["width"] = 64.0  # a float size, valid: load_coco reads the file
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    expected = _quiet(parse_coco_columns, path)
    assert expected.parsed_by == "load_coco"
    made = _tiny_blocks(monkeypatch)
    built = _quiet(load_coco_columns, path)
    assert made
    for name, array in expected.arrays().items():
        assert np.array_equal(built.arrays()[name], array), name
    folder = cache_folder(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.json.detaug-cache", "a.json.detaug-cache.lock"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*(f"{n}.npy" for n in expected.arrays()), "meta.json"])


@pytest.mark.parametrize("doc", [
    {"images": [{"id": 1, "file_name": "a.jpg"}]},  # no annotations, no categories
    {"images": [{"id": 1, "file_name": "a.jpg", "width": 5, "height": 5}], "annotations": [], "categories": []},
    {"images": [{"id": 1, "file_name": "a.jpg", "width": 5, "height": 5}],  # every box dropped: no box kept
     "annotations": [{"id": k, "image_id": 1, "category_id": 1, "bbox": [9, 9, 1, 1]} for k in range(9)],
     "categories": [{"id": 1, "name": "x"}]},
])
def test_a_cache_without_boxes_is_built_in_tiny_blocks(tmp_path, monkeypatch, doc):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    expected = _quiet(parse_coco_columns, path)
    _tiny_blocks(monkeypatch)
    built = _quiet(load_coco_columns, path)
    assert expected.parsed_by == "stream" and len(built.table.boxes) == 0
    for name, array in expected.arrays().items():
        got = built.arrays()[name]
        assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array), name
        assert (cache_folder(path) / f"{name}.npy").read_bytes() == _npy_bytes(array), name
    assert dict(built.report.counts) == dict(expected.report.counts)
