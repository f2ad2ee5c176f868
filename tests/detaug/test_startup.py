"""Start-up independent of dataset size: the columnar COCO parser and its cache (the same
samples, repairs and errors as load_coco), and ``detaug bench --startup`` at tiny sizes."""

from __future__ import annotations

import json
import os
import pickle
import warnings

import numpy as np
import pytest

from detaug import DatasetError, DataWarning
from detaug.bench.startup import main as startup_main
from detaug.formats.coco import load_coco
from detaug.formats.columnar import (
    CocoColumns,
    load_coco_columns,
    parse_coco_columns,
)
from detaug.sources import CocoSource


def coco_dict():
    """Three images (one without a declared size), annotations to clip, drop and keep, crowd."""
    return {
        "info": {"nested": [{"a": 1}, {"b": [2, 3]}]},
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 100, "height": 50},
            {"id": 2, "file_name": "sub/b},{.jpg", "width": 40, "height": 30, "exif_orientation": 6},
            {"id": 3, "file_name": "./c\u00e9.jpg"},
        ],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 3, "bbox": [10, 5, 20, 10], "iscrowd": 0},
            {"id": 11, "image_id": 2, "category_id": 7, "bbox": [1.5, 2, 3, 4]},
            {"id": 12, "image_id": 1, "category_id": 7, "bbox": [-5, 0, 200, 50], "iscrowd": 1},
            {"image_id": 3, "category_id": 3, "bbox": [0, 0, 5, 5]},
            {"id": 14, "image_id": 2, "category_id": 3, "bbox": [1, 1, 0, 4]},
            {"id": 15, "image_id": 1, "category_id": 3, "bbox": [200, 200, 5, 5]},
        ],
        "categories": [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}],
    }


def _write(tmp_path, doc, name="a.json", indent=None):
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=indent))
    return path


def _assert_same(expected: CocoColumns, got: CocoColumns):
    for name, array in expected.arrays().items():
        assert got.arrays()[name].dtype == array.dtype and np.array_equal(got.arrays()[name], array), name
    assert got.categories == expected.categories
    assert dict(got.report.counts) == dict(expected.report.counts)
    assert {r: [str(f) for f in fs] for r, fs in got.report.examples.items()} == \
        {r: [str(f) for f in fs] for r, fs in expected.report.examples.items()}


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_streaming_parser_gives_what_load_coco_gives(tmp_path, indent, chunk):
    doc = coco_dict()
    doc["images"] += [{"id": 100 + i, "file_name": f"x/{i}.jpg", "width": 64, "height": 48} for i in range(30)]
    doc["annotations"] += [{"id": 1000 + i, "image_id": 100 + i % 30, "category_id": 7, "bbox": [i % 50, 1, 9.5, 3]}
                           for i in range(60)]
    path = _write(tmp_path, doc, indent=indent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        expected = CocoColumns.from_dataset(load_coco(path))
        got = parse_coco_columns(path, chunk_bytes=chunk)
    assert got.parsed_by == "stream"
    _assert_same(expected, got)
    assert expected.report.repairs and expected.report.notes  # the file has repairs and notes to compare


@pytest.mark.parametrize("spoil", [
    lambda d: d["images"][0].update(id="1"),  # a string id: load_coco's error
    lambda d: d["annotations"][0].update(image_id=99),  # an unknown image
    lambda d: d["images"][1].update(id=1),  # a duplicate id
    lambda d: d["images"].append({"id": 9, "file_name": "a.jpg"}),  # a duplicate file
    lambda d: d["annotations"][1].update(bbox=[1, 2, 3]),
])
def test_files_with_errors_get_load_cocos_error(tmp_path, spoil):
    doc = coco_dict()
    spoil(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(DatasetError) as expected, warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        load_coco(path)
    with pytest.raises(DatasetError) as got, warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        parse_coco_columns(path)
    assert str(got.value) == str(expected.value)


def test_irregular_but_valid_files_are_parsed_by_load_coco(tmp_path):
    doc = coco_dict()
    doc["images"][0]["width"] = 100.0  # a float size: valid, not the fast path's plain form
    path = _write(tmp_path, doc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        got = parse_coco_columns(path)
        expected = CocoColumns.from_dataset(load_coco(path))
    assert got.parsed_by == "load_coco"
    _assert_same(expected, got)


def test_the_cache_is_used_and_rebuilt_when_the_file_changes(tmp_path):
    path = _write(tmp_path, coco_dict())
    with pytest.warns(DataWarning, match="box clipped"):
        first = load_coco_columns(path, cache_dir=tmp_path / "cache")
    with pytest.warns(DataWarning, match="box clipped"):  # repairs are said on every start-up
        second = load_coco_columns(path, cache_dir=tmp_path / "cache")
    assert first.parsed_by == second.parsed_by == "cache"
    assert isinstance(second.table.boxes, np.memmap) or second.table.boxes.size * 16 < 4096
    _assert_same(first, second)
    doc = coco_dict()
    doc["annotations"].pop()
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        third = load_coco_columns(path, cache_dir=tmp_path / "cache")
    assert len(third.table.boxes) == len(first.table.boxes)  # the dropped one was outside anyway
    assert third.report.counts != first.report.counts  # parsed again: one repair fewer


@pytest.mark.parametrize("options", [{}, {"include_iscrowd": False}, {"skip_empty": True, "include_iscrowd": False}])
def test_coco_source_with_a_cache_is_the_coco_source(tmp_path, options):
    doc = coco_dict()
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != 3 or options.get("skip_empty") is None]
    path = _write(tmp_path, doc)
    (tmp_path / "images").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        expected = CocoSource(path, tmp_path / "images", **options)
        for _ in range(2):  # built, then from the cache
            got = CocoSource(path, tmp_path / "images", cache=tmp_path / "cache", **options)
    assert isinstance(got, CocoSource) and len(got) == len(expected)
    for i in range(len(expected)):
        a, b = expected.samples[i], got.samples[i]
        assert (a.image, a.image_id, a.size) == (b.image, b.image_id, b.size)
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.labels, b.labels)
        assert expected.file_of(i) == got.file_of(i)
    assert dict(got.report.counts) == dict(expected.report.counts)
    assert (got.report.images, got.report.boxes) == (expected.report.images, expected.report.boxes)
    assert got.present_labels().tolist() == sorted({int(x) for s in expected.samples for x in s.labels})
    again = pickle.loads(pickle.dumps(got))
    assert again.samples[0].image == got.samples[0].image and np.array_equal(again.samples[0].boxes, got.samples[0].boxes)


def test_bench_startup_prints_the_table_at_tiny_sizes(tmp_path, capsys):
    out = tmp_path / "startup.json"
    status = startup_main(["--sizes", "1000,4000", "--workdir", str(tmp_path / "work"), "--json", str(out), "--ranks", "4"])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    rows = {(r["images"], r["source"]): r for r in result["rows"]}
    assert set(rows) == {(n, k) for n in (1000, 4000) for k in ("coco-list", "coco-cache-build", "coco-cache", "shards")}
    for row in rows.values():
        assert "error" not in row, row
        assert 0 < row["seconds"] < 60 and 10 * 2**20 < row["peak_rss"] < 2 * 10**9 and row["samples"] in (1000, 4000)
    assert [c["check"].split()[0] for c in result["checks"]] == ["coco-cache", "shards"]
    assert status == (0 if all(c["ok"] for c in result["checks"]) else 1)
    for line in ("coco-list", "coco-cache-build", "shards", "peak RSS MB", "4,000"):
        assert line in printed
