"""Class indices for the model (``label_map``, ``class_names``, ``category_ids``, ``num_classes``)
and Keras box formats against the output image, on real DALI CPU pipelines.

The adapters' data: a COCO file whose category ids have gaps (3, 7, 20), read by ``CocoSource``;
the box formats use synthetic scenes whose objects are solid rectangles, so that each box can be
compared with its object's pixels on the output image.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported, here or by detaug.keras

import numpy as np
import pytest
import torch

import detaug.transforms as T
from detaug.labels import BACKGROUND, LabelMap
from detaug.sources import CocoSource, SampleListSource
from detaug.synthetic import write_coco_dataset
from detaug.torch import DetectionLoader
from tests.detaug.consistency import check_boxes_match_pixels, scene_samples

keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install detaug[keras])")

from detaug.keras import DetectionSequence

CATEGORY_IDS = (3, 7, 20)  # with gaps, as COCO's
NAMES = ("cat", "dog", "bird")
OUT_HW = (48, 64)
BATCH = 3


# -- the mapping alone ---------------------------------------------------------------------------


def test_contiguous_maps_sorted_ids_with_gaps_to_0_or_1_based_indices():
    categories = {20: "bird", 3: "cat", 7: "dog"}  # any order: sorted by id
    labels = np.array([[20, 3], [7, 7]])
    keras_map = LabelMap(categories, labels, "contiguous", first=0)
    torch_map = LabelMap(categories, labels, "contiguous", first=1)
    np.testing.assert_array_equal(keras_map.map(labels), [[2, 0], [1, 1]])
    np.testing.assert_array_equal(torch_map.map(labels), [[3, 1], [2, 2]])
    assert keras_map.map(labels).dtype == np.int64
    assert keras_map.class_names == ["cat", "dog", "bird"] and keras_map.category_ids == [3, 7, 20]
    assert torch_map.class_names == [BACKGROUND, "cat", "dog", "bird"] and torch_map.category_ids == [-1, 3, 7, 20]
    for m in (keras_map, torch_map):  # a prediction goes back to its COCO id
        np.testing.assert_array_equal(m.to_category_ids(m.map(labels)), labels)
        np.testing.assert_array_equal(np.asarray(m.category_ids)[m.map(labels)], labels)
    np.testing.assert_array_equal(keras_map.to_category_ids([-1, 0]), [-1, 3])  # Keras' padding stays
    np.testing.assert_array_equal(torch_map.to_category_ids([0]), [-1])  # the background is no category
    with pytest.raises(ValueError, match=r"class index\(es\) \[4\] are outside 0..3"):
        torch_map.to_category_ids([1, 4])
    with pytest.raises(ValueError, match=r"label\(s\) \[5\] are not category ids of the source \(ids 3, 7, 20\)"):
        torch_map.map([3, 5])


def test_identity_is_the_category_ids_and_lists_index_by_id():
    m = LabelMap({1: "a", 3: "c"}, np.array([1, 3, 3]), None, first=0)
    np.testing.assert_array_equal(m.map([3, 1]), [3, 1])
    assert m.class_names == [None, "a", None, "c"] and m.category_ids == [-1, 1, -1, 3]
    np.testing.assert_array_equal(m.to_category_ids([3, 2, -1]), [3, -1, -1])  # 2: a gap
    t = LabelMap({1: "a", 3: "c"}, np.array([1]), None, first=1)
    assert t.class_names == [BACKGROUND, "a", None, "c"]  # torchvision's slot 0
    huge = LabelMap({2**31 - 1: "far"}, np.zeros(0, np.int64), None)
    np.testing.assert_array_equal(huge.map([2**31 - 1]), [2**31 - 1])  # mapping works, the lists do not
    with pytest.raises(ValueError, match="label_map='contiguous' for class_names"):
        _ = huge.class_names


def test_without_categories_the_labels_present_sorted():
    m = LabelMap({}, np.array([9, 2, 9, 5]), "contiguous")
    assert m.category_ids == [2, 5, 9] and m.class_names == ["2", "5", "9"]
    with pytest.raises(ValueError, match="label_map must be None or 'contiguous', got 'dense'"):
        LabelMap({}, np.array([1]), "dense")
    with pytest.raises(ValueError, match=r"label\(s\) \[4\] of the samples are not category ids"):
        LabelMap({1: "a"}, np.array([1, 4]), "contiguous")


def test_num_classes_check_names_label_category_and_fix():
    keras_map = LabelMap(dict(zip(CATEGORY_IDS, NAMES)), np.array(CATEGORY_IDS), None, first=0)
    assert keras_map.check_num_classes(21) == 21
    with pytest.raises(ValueError, match=(
            r"label 20 \(category id 20, 'bird'\) does not fit num_classes=20: the model takes labels 0..19.*"
            r"label_map='contiguous' \(labels 0..2, num_classes >= 3\) or num_classes >= 21")):
        keras_map.check_num_classes(20)
    torch_map = LabelMap(dict(zip(CATEGORY_IDS, NAMES)), np.array(CATEGORY_IDS), "contiguous", first=1)
    assert torch_map.check_num_classes(4) == 4  # 3 classes and the background
    with pytest.raises(ValueError, match=r"label 3 \(category id 20, 'bird'\).*labels 1..2 \(0 is the background\)"):
        torch_map.check_num_classes(3)
    zero = LabelMap({0: "zero", 1: "one"}, np.array([0, 1]), None, first=1)
    with pytest.raises(ValueError, match=r"label 0 \(category id 0, 'zero'\) is the background"):
        zero.check_num_classes(5)
    with pytest.raises(TypeError, match="num_classes must be an integer"):
        zero.check_num_classes(2.0)


# -- the adapters ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gapped_source(tmp_path_factory):
    """A COCO file of 7 images whose 3 categories have ids 3, 7, 20, read by ``CocoSource``."""
    root = tmp_path_factory.mktemp("coco_gaps")
    annotations = write_coco_dataset(root, num_images=7, size=(80, 64), min_objects=2, max_objects=4,
                                     classes=NAMES, progress=False)
    doc = json.loads(annotations.read_text())
    new_id = dict(zip(range(1, len(NAMES) + 1), CATEGORY_IDS))
    for c in doc["categories"]:
        c["id"] = new_id[c["id"]]
    for a in doc["annotations"]:
        a["category_id"] = new_id[a["category_id"]]
    source = CocoSource(doc, root / "images")
    assert sorted(source.categories) == list(CATEGORY_IDS)
    assert len({int(k) for s in source.samples for k in s.labels}) == 3  # every category has boxes
    return source


def recipe() -> T.Compose:
    return T.Compose([T.RandomHorizontalFlip(), T.Resize(OUT_HW)])  # keeps every box, in order


def test_both_adapters_give_the_same_mapped_labels_and_map_back(gapped_source):
    source = gapped_source
    loader = DetectionLoader(source, recipe(), BATCH, device="cpu", shuffle=True, seed=1, num_threads=1,
                             label_map="contiguous", num_classes=4)
    seq = DetectionSequence(source, recipe(), BATCH, shuffle=True, seed=1, device="cpu", num_threads=1,
                            prefetch=False, label_map="contiguous", num_classes=3)
    by_id = {s.image_id: s.labels for s in source.samples}
    expected_index = {cid: k for k, cid in enumerate(CATEGORY_IDS)}  # sorted ids -> 0..2
    assert loader.class_names == [BACKGROUND, *NAMES] and loader.category_ids == [-1, *CATEGORY_IDS]
    assert seq.class_names == list(NAMES) and seq.category_ids == list(CATEGORY_IDS)
    assert len(loader.class_names) == loader.num_classes and len(seq.class_names) == seq.num_classes

    seen = 0
    for i, (_, targets) in enumerate(loader):
        _, keras_targets = seq[i]
        for k, t in enumerate(targets):
            labels = t["labels"]
            assert labels.dtype == torch.int64
            want = np.array([expected_index[int(c)] for c in by_id[t["image_id"]]])
            np.testing.assert_array_equal(labels.numpy(), want + 1)  # torchvision: 1..n
            row = keras_targets["labels"][k]
            np.testing.assert_array_equal(row[row >= 0], want)  # KerasHub: 0..n-1
            assert (row[len(want):] == -1).all()
            # round trip: a prediction's class index back to its COCO category id and name
            np.testing.assert_array_equal(np.asarray(loader.category_ids)[labels.numpy()], by_id[t["image_id"]])
            np.testing.assert_array_equal(loader.label_mapping.to_category_ids(labels), by_id[t["image_id"]])
            np.testing.assert_array_equal(seq.label_mapping.to_category_ids(row)[: len(want)], by_id[t["image_id"]])
            assert [seq.class_names[j] for j in row[row >= 0]] == [source.categories[int(c)] for c in by_id[t["image_id"]]]
            seen += len(want)
    assert seen == sum(len(s.labels) for s in source.samples)
    seq.close()
    loader.close()


def test_num_classes_too_small_raises_at_construction(gapped_source):
    with pytest.raises(ValueError, match=r"DetectionLoader: label 3 \(category id 20, 'bird'\) does not fit "
                                         r"num_classes=3.*pass num_classes >= 4"):
        DetectionLoader(gapped_source, recipe(), BATCH, device="cpu", label_map="contiguous", num_classes=3)
    with pytest.raises(ValueError, match=r"DetectionSequence: label 20 \(category id 20, 'bird'\) does not fit "
                                         r"num_classes=10.*label_map='contiguous' \(labels 0..2, num_classes >= 3\)"):
        DetectionSequence(gapped_source, recipe(), BATCH, device="cpu", num_classes=10)  # ids as they are
    with pytest.raises(ValueError, match="label_map must be None or 'contiguous'"):
        DetectionLoader(gapped_source, recipe(), BATCH, device="cpu", label_map="sorted")


# -- Keras box formats against the output image ----------------------------------------------------

FORMATS = ("xyxy", "yxyx", "xywh", "center_xywh", "rel_xyxy", "rel_yxyx")
SCENE_WH = (160, 96)  # source (width, height); the output (64, 80) scales x by 1/2 and y by 2/3
BOX_OUT_HW = (64, 80)


@pytest.fixture(scope="module")
def scenes():
    return scene_samples(3, seed=3, size=SCENE_WH, max_objects=3, min_size=20)


@pytest.mark.parametrize("fmt", FORMATS)
def test_box_format_matches_the_objects_on_the_output_image(scenes, fmt):
    samples, drawn = scenes
    flip_resize = T.Compose([T.RandomHorizontalFlip(p=1.0), T.Resize(BOX_OUT_HW)])
    seq = DetectionSequence(SampleListSource(samples), flip_resize, len(samples), device="cpu", num_threads=1,
                            prefetch=False, bounding_box_format=fmt)
    images, targets = seq[0]
    seq.close()
    h, w = BOX_OUT_HW
    sx, sy = w / SCENE_WH[0], h / SCENE_WH[1]
    for k, sample in enumerate(samples):  # shuffle=False: batch 0 is the samples in order
        valid = targets["labels"][k] >= 0
        np.testing.assert_array_equal(targets["labels"][k][valid], sample.labels)  # label_map=None: the ids
        x0, y0, x1, y1 = np.asarray(sample.boxes, np.float64).T
        xyxy = np.stack([(SCENE_WH[0] - x1) * sx, y0 * sy, (SCENE_WH[0] - x0) * sx, y1 * sy], axis=1)  # mirrored, scaled
        cx, cy, bw, bh = (xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2, xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
        expected = {  # KerasHub's definitions, written out
            "xyxy": xyxy,
            "yxyx": xyxy[:, [1, 0, 3, 2]],
            "xywh": np.stack([xyxy[:, 0], xyxy[:, 1], bw, bh], axis=1),
            "center_xywh": np.stack([cx, cy, bw, bh], axis=1),
            "rel_xyxy": xyxy / [w, h, w, h],
            "rel_yxyx": xyxy[:, [1, 0, 3, 2]] / [h, w, h, w],
        }[fmt]
        got = targets["boxes"][k][valid]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
        back = keras.utils.bounding_boxes.convert_format(got, fmt, "xyxy", height=h, width=w)
        back = back.cpu().numpy() if hasattr(back, "cpu") else np.asarray(back)  # Keras' own inverse
        problems = check_boxes_match_pixels(images[k].astype(np.uint8), back, targets["labels"][k][valid], drawn[k])
        assert not problems, f"{fmt}, sample {k}: {problems}"
