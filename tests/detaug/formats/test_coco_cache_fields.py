"""The COCO annotation cache holds keypoints (float32 ``[M, K, 3]``) and the segmentations of
``masks=True``, undecoded, as plain number arrays (no pickle): a cached source gives the samples
and the loader batches of a fresh parse, and cached arrays pass the checks of a fresh parse."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import replace

import numpy as np
import pytest

import detaug.transforms as T
from detaug import DataWarning
from detaug.formats.coco_cache import _check_cached
from detaug.formats.columnar import cache_folder, load_coco_columns
from detaug.formats.mask_columns import MaskColumns
from detaug.masks import CocoMasks
from detaug.sources import CocoSource
from detaug.torch import DetectionLoader
from tests.detaug.test_keypoints import coco_doc as keypoints_doc
from tests.detaug.test_masks import coco_scene

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")
SEGMENTATIONS = [
    [[1, 2, 30, 2.5, 16, 40]],  # one polygon, ints and floats
    [[0, 0, 10, 0, 10, 10, 0, 10], [20.25, 20, 30, 20, 25, 28]],  # two polygons
    {"size": [48, 64], "counts": [5, 10, 3000, 55, 10]},  # uncompressed RLE
    {"size": [48, 64], "counts": "PZ1d0000000O"},  # compressed RLE
    [],  # no polygon
]


def assert_same_samples(fresh: CocoSource, cached: CocoSource) -> None:
    """Every sample of ``cached`` equals ``fresh``'s, field by field (masks also decoded)."""
    assert len(cached) == len(fresh) and cached.field_specs == fresh.field_specs
    for a, b in zip(fresh.samples, cached.samples):
        assert (a.image, a.image_id, a.size) == (b.image, b.image_id, b.size)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert sorted(a.fields) == sorted(b.fields)
        for name, value in a.fields.items():
            if isinstance(value, CocoMasks):
                assert isinstance(b.fields[name], CocoMasks) and b.fields[name] == value
                hw = a.size or (1, 1)
                np.testing.assert_array_equal(b.fields[name].decode(hw)[0], value.decode(hw)[0])
            else:
                assert b.fields[name].dtype == value.dtype
                np.testing.assert_array_equal(b.fields[name], value)


def same_batches(fresh: CocoSource, cached: CocoSource, recipe: T.Compose, field: str) -> None:
    """The loaders of both give equal batches for one seed."""
    loaders = [DetectionLoader(s, recipe, 2, device=DEVICE, num_threads=1, fields=[field], seed=7)
               for s in (fresh, cached)]
    try:
        for (images_a, targets_a), (images_b, targets_b) in zip(*loaders):
            for x, y in zip(images_a, images_b):
                np.testing.assert_array_equal(x.cpu().numpy(), y.cpu().numpy())
            for ta, tb in zip(targets_a, targets_b):
                assert sorted(ta) == sorted(tb)
                for key in ta:
                    got, want = tb[key], ta[key]
                    if hasattr(want, "cpu"):
                        np.testing.assert_array_equal(got.cpu().numpy(), want.cpu().numpy())
                    else:
                        assert got == want
    finally:
        for loader in loaders:
            loader.close()


def masks_file(tmp_path) -> tuple[str, str]:
    """coco_scene's file (polygons and compressed RLE) plus a crowd box of uncompressed RLE and
    an image without boxes."""
    path, root, _ = coco_scene(tmp_path)
    doc = json.loads(open(path).read())
    h, w = doc["images"][0]["height"], doc["images"][0]["width"]
    doc["annotations"].append({"id": 999, "image_id": 1, "category_id": 0, "bbox": [0, 0, 10, 5], "iscrowd": 1,
                               "segmentation": {"size": [h, w], "counts": [0, 5, h - 5, 5, h * w - h - 10]}})
    doc["images"].append({"id": 50, "file_name": "0.png", "height": h, "width": w})
    doc["images"][-1]["file_name"] = "empty.png"
    os.link(os.path.join(root, "0.png"), os.path.join(root, "empty.png"))
    with open(path, "w") as f:
        json.dump(doc, f)
    return path, root


@pytest.mark.parametrize("include_iscrowd", [True, False])
def test_a_cached_masks_source_is_the_fresh_parse(tmp_path, include_iscrowd):
    path, root = masks_file(tmp_path)
    fresh = CocoSource(path, root, masks=True, include_iscrowd=include_iscrowd)
    built = CocoSource(path, root, masks=True, include_iscrowd=include_iscrowd, cache=tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # the second start-up opens the cache, said nothing
        opened = CocoSource(path, root, masks=True, include_iscrowd=include_iscrowd, cache=tmp_path / "cache")
    for cached in (built, opened):
        assert_same_samples(fresh, cached)
    assert os.path.isdir(cache_folder(path, tmp_path / "cache", masks=True))
    same_batches(fresh, opened, T.Compose([T.RandomAffine(degrees=20, scale=(0.8, 1.1)), T.Resize((96, 128))]), "masks")


def test_masks_and_plain_caches_of_one_file_live_side_by_side(tmp_path):
    path, root = masks_file(tmp_path)
    plain = CocoSource(path, root, cache=tmp_path / "cache")
    masked = CocoSource(path, root, masks=True, cache=tmp_path / "cache")
    assert "masks" not in plain.field_specs and "masks" not in plain.samples[0].fields
    assert isinstance(masked.samples[0].fields["masks"], CocoMasks)
    assert cache_folder(path, tmp_path / "cache") != cache_folder(path, tmp_path / "cache", masks=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # each opens its own, rebuilding neither
        assert_same_samples(plain, CocoSource(path, root, cache=tmp_path / "cache"))
        assert_same_samples(masked, CocoSource(path, root, masks=True, cache=tmp_path / "cache"))


@pytest.mark.parametrize("named", [True, False], ids=["categories name keypoints", "annotations only"])
def test_a_cached_keypoints_source_is_the_fresh_parse(tmp_path, named):
    doc, _ = keypoints_doc(tmp_path, lambda j, flat: {"keypoints": flat})
    if not named:  # only the annotations carry them
        del doc["categories"][0]["keypoints"]
    doc["annotations"][1]["iscrowd"] = 1
    path = tmp_path / "keypoints.json"
    path.write_text(json.dumps(doc))
    for include_iscrowd in (True, False):
        fresh = CocoSource(path, tmp_path, include_iscrowd=include_iscrowd)
        cached = CocoSource(path, tmp_path, include_iscrowd=include_iscrowd, cache=True)
        assert cached.field_specs["keypoints"][1] == fresh.field_specs["keypoints"][1] == (3, 3)
        assert_same_samples(fresh, cached)
    same_batches(fresh, cached, T.Compose([T.RandomHorizontalFlip(), T.RandomAffine(degrees=10)]), "keypoints")


def test_the_cache_holds_plain_number_arrays_only(tmp_path):
    path, root = masks_file(tmp_path)
    CocoSource(path, root, masks=True, cache=tmp_path / "cache")
    folder = cache_folder(path, tmp_path / "cache", masks=True)
    for file in folder.glob("*.npy"):
        array = np.load(file, allow_pickle=False)  # raises for an object array
        assert array.dtype.kind in "biuf", file.name


def test_a_touched_file_renews_a_masks_cache_after_checking_its_arrays(tmp_path):
    path, root = masks_file(tmp_path)
    first = CocoSource(path, root, masks=True, cache=tmp_path / "cache")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the fast-path key no longer holds
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # renewed (hash, signature, checks), not rebuilt
        again = CocoSource(path, root, masks=True, cache=tmp_path / "cache")
    assert_same_samples(first, again)


def test_mask_columns_give_back_each_segmentation_and_check_like_a_fresh_parse():
    columns = MaskColumns.from_segmentations(SEGMENTATIONS)
    assert [columns.segmentation(j) for j in range(len(SEGMENTATIONS))] == SEGMENTATIONS
    assert columns.check(len(SEGMENTATIONS)) == ""
    assert "one row per box" in columns.check(4)
    bad = MaskColumns(**{**columns.arrays(), "poly_starts": np.array([0, 4, 14, 20], np.int64)})
    assert "polygon" in bad.check(len(SEGMENTATIONS))  # a polygon of 2 points, as the JSON's would be named
    nan = MaskColumns(**{**columns.arrays(), "poly_coords": np.where(np.arange(20) == 3, np.nan,
                                                                      columns.poly_coords)})
    assert "not a finite number" in nan.check(len(SEGMENTATIONS))
    mixed = MaskColumns(**{**columns.arrays(), "seg_kind": np.array([0, 0, 2, 2, 0], np.int8)})
    assert "another kind" in mixed.check(len(SEGMENTATIONS))
    with pytest.raises(ValueError, match="beyond int64"):
        MaskColumns.from_segmentations([{"size": [1, 1], "counts": [2**70]}])


def test_cached_keypoints_and_segmentations_that_fail_the_checks_are_refused(tmp_path):
    from detaug import DatasetError

    path, root = masks_file(tmp_path)
    columns = load_coco_columns(path, cache_dir=tmp_path / "cache", masks=True)
    _check_cached(columns, False, masks=True)  # as built: passes
    with pytest.raises(DatasetError, match="segmentations missing"):
        _check_cached(replace(columns, segments=None), False, masks=True)
    m = len(columns.table.labels)
    points = np.zeros((m, 2, 3), np.float32)
    points[0, 1, 2] = 3  # a visibility a fresh parse refuses
    with pytest.raises(DatasetError, match="keypoints do not pass the checks.*visibility 3"):
        _check_cached(replace(columns, keypoints=points), False, masks=True)


def test_a_cached_source_pickles_as_its_cache_folder_with_its_keypoints_and_masks(tmp_path):
    """Worker processes get the columns by their cache folder (mapped again), keypoints and
    masks included; with crowd boxes left out the view's own arrays travel."""
    import pickle

    path, root = masks_file(tmp_path)
    for include_iscrowd in (True, False):
        cached = CocoSource(path, root, masks=True, include_iscrowd=include_iscrowd, cache=tmp_path / "cache")
        assert_same_samples(cached, pickle.loads(pickle.dumps(cached)))
    doc, _ = keypoints_doc(tmp_path, lambda j, flat: {"keypoints": flat})
    kp = tmp_path / "keypoints.json"
    kp.write_text(json.dumps(doc))
    cached = CocoSource(kp, tmp_path, cache=True)
    columns = cached.samples.image_of.columns
    assert columns.cache is not None and pickle.loads(pickle.dumps(columns)).keypoints is not None
    assert_same_samples(cached, pickle.loads(pickle.dumps(cached)))
