"""Seeded random mutations of COCO dicts and sample lists: building a source either raises
``DatasetError`` (``TypeError`` too for sample lists holding Python objects of the wrong kind, as
documented in :mod:`detaug.formats.validation`) or gives samples that are all valid."""

import copy
import json
import math
import random
import warnings

import numpy as np
import pytest

from detaug.errors import DatasetError, DataWarning
from detaug.formats.validation import INT32_MAX, INT64_MAX, INT64_MIN
from detaug.sources import CocoSource, Sample, SampleListSource

COCO_CASES = 200
LIST_CASES = 120

STRANGE = [None, True, False, "", "x", "12", [], {}, [1, 2], {"a": 1}, math.nan, math.inf, -math.inf,
           -1, 0, 1, 1.5, -0.5, 2**31, 2**31 - 1, 2**63, -(2**63) - 1, 10**30, 10**400, 1e39, -1e6]


def base_coco():
    return {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
            {"id": 2, "file_name": "b.jpg", "width": 32, "height": 32, "exif_orientation": 6},
            {"id": 3, "file_name": "c/d.png"},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 10, 20], "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 2, "bbox": [50, 40, 30, 30]},
            {"id": 3, "image_id": 2, "category_id": 2, "bbox": [0.5, 0.5, 4, 4], "iscrowd": 1},
            {"id": 4, "image_id": 3, "category_id": 1, "bbox": [-3, -3, 8, 8]},
            {"id": 5, "image_id": 2, "category_id": 1, "bbox": [3, 3, 0, 5]},
        ],
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}],
    }


def containers(node, out):
    """Every dict and list inside ``node`` (itself included)."""
    if isinstance(node, (dict, list)):
        out.append(node)
        for child in (node.values() if isinstance(node, dict) else node):
            containers(child, out)
    return out


def mutate_coco(doc, rng):
    """One random change somewhere in ``doc``."""
    target = rng.choice(containers(doc, []))
    keys = list(target) if isinstance(target, dict) else list(range(len(target)))
    op = rng.random()
    if not keys or op < 0.05:
        if isinstance(target, list):
            target.append(copy.deepcopy(rng.choice(target)) if target and rng.random() < 0.7 else rng.choice(STRANGE))
        else:
            target[rng.choice(["id", "bbox", "width", "file_name", "iscrowd", "extra"])] = rng.choice(STRANGE)
        return
    key = rng.choice(keys)
    if op < 0.25:
        del target[key]
    elif op < 0.4 and isinstance(target, list):  # duplicate an element
        target.append(copy.deepcopy(target[key]))
    elif op < 0.5:  # copy a sibling's value (duplicate ids / file names)
        siblings = [c for c in containers(doc, []) if isinstance(c, dict) and key in c] if isinstance(target, dict) else []
        target[key] = copy.deepcopy(rng.choice(siblings)[key]) if siblings else rng.choice(STRANGE)
    elif op < 0.7 and isinstance(target[key], (int, float)) and not isinstance(target[key], bool):
        target[key] = rng.choice([-target[key], target[key] * 10**rng.randint(1, 40), target[key] + 0.5,
                                  target[key] - 1000, math.nan])
    else:
        target[key] = copy.deepcopy(rng.choice(STRANGE))


def clone(value):
    """A deep copy (memoryviews, which cannot be copied, as they are)."""
    if isinstance(value, Sample):
        return Sample(*(clone(x) for x in vars(value).values()))
    return value if isinstance(value, memoryview) else copy.deepcopy(value)


def check_source(source, categories=None):
    ids, files = set(), set()
    assert len(source) == len(source.samples) > 0
    assert not source.report.errors
    for i, s in enumerate(source.samples):
        assert isinstance(s.image_id, int) and INT64_MIN <= s.image_id <= INT64_MAX and s.image_id not in ids
        ids.add(s.image_id)
        if isinstance(s.image, str):
            assert s.image not in files
            files.add(s.image)
        b, lab = s.boxes, s.labels
        assert b.dtype == np.float32 and b.ndim == 2 and b.shape[1] == 4
        assert lab.dtype == np.int64 and lab.shape == (len(b),)
        assert np.isfinite(b).all() and (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
        assert ((lab >= 0) & (lab <= INT32_MAX)).all()
        if categories is not None:
            assert set(lab.tolist()) <= set(categories)
        hw = s.size
        if hw is None and isinstance(s.image, np.ndarray) and s.image.ndim >= 2:
            hw = s.image.shape[:2]
        if hw is not None:
            h, w = hw
            assert isinstance(h, int) and isinstance(w, int) and 0 < h <= INT32_MAX and 0 < w <= INT32_MAX
            assert (b >= 0).all() and (b[:, [0, 2]] <= np.float32(w)).all() and (b[:, [1, 3]] <= np.float32(h)).all()
        source.file_of(i)


@pytest.mark.parametrize("seed", range(COCO_CASES))
def test_mutated_coco(seed, tmp_path):
    rng = random.Random(seed)
    doc = base_coco()
    for _ in range(rng.randint(1, 3)):
        mutate_coco(doc, rng)
    if seed % 2:  # through a file (NaN and Infinity as JSON's extensions)
        path = tmp_path / "ann.json"
        path.write_text(json.dumps(doc))
        doc = path
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataWarning)
            source = CocoSource(doc, tmp_path, include_iscrowd=bool(seed % 3), skip_empty=not seed % 5)
    except DatasetError as err:
        assert str(err).strip()
        return
    check_source(source, source.categories)


# -- sample lists -------------------------------------------------------------------------------------

JPEG = b"\xff\xd8\xff\xe0 not really a jpeg \xff\xd9"


def base_samples(decoded):
    image = (lambda k: np.zeros((24, 32, 3), np.uint8)) if decoded else (lambda k: f"img{k}.jpg")
    return [Sample(image(k), np.array([[1, 2, 10, 12], [20, 5, 40, 30]], np.float32), np.array([1, 2]), k + 1,
                   None if decoded else (24, 32)) for k in range(4)]


STRANGE_IMAGES = [None, 3, 1.5, "", "img0.jpg", JPEG, bytearray(JPEG), memoryview(JPEG),
                  np.frombuffer(JPEG, np.uint8), np.zeros((8, 8), np.uint8), np.zeros((8, 8, 3), np.float32),
                  np.zeros((8, 8, 4), np.uint8), np.zeros((0, 3), np.uint8), np.zeros((5, 5, 3), np.uint8)]
STRANGE_BOXES = [[], [1, 2, 3], "box", [[math.nan, 0, 1, 1]], [[0, 0, math.inf, 1]], [[0, 0, 10**40, 1]],
                 [[0, 0, 2**70, 1]], np.zeros((2, 4), bool),
                 [[-5, -5, 100, 100], [5, 5, 1, 1]], [[30, 20, 50, 40], [1, 1, 1, 9]], [[-9, 1, -1, 5], [2, 2, 3, 3]],
                 np.array([[0.5, 0.5, 31.5, 23.5], [10, 10, 10.001, 11]], np.float64),
                 [[0, 0, 1, 1], [1, 1, 2, 2], [2, 2, 3, 3]], [["1", "2", "3", "4"]], None]
STRANGE_LABELS = [[], [-1, 2], [2**40, 1], [1.5, 1], ["a", "b"], [True, False], [math.nan, 1], [2**70, 1],
                  np.array([1, 2], np.uint64), [1], [7, 8], None, 5]
STRANGE_IDS = [0, 1, -1, 2**63, 2**70, "1", None, 1.0, 2.5, True, np.int64(9), 50, 51, -(2**63), 2**63 - 1]
STRANGE_SIZES = [None, None, (24, 32), (24, 32), (0, 32), (-1, 5), (math.nan, 4), (2**31, 4), "24x32", (24,),
                 (1.5, 3), (10, 10), (24.0, 32.0), np.array([24, 32])]


@pytest.mark.parametrize("seed", range(LIST_CASES))
def test_mutated_sample_lists(seed):
    rng = random.Random(10_000 + seed)
    samples = base_samples(decoded=bool(seed % 2))
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(len(samples))
        field = rng.choice(["image", "boxes", "labels", "image_id", "size", "duplicate", "delete"])
        if field == "duplicate":
            samples.append(clone(samples[k]))
        elif field == "delete" and len(samples) > 1:
            del samples[k]
        elif field != "delete":
            pool = {"image": STRANGE_IMAGES, "boxes": STRANGE_BOXES, "labels": STRANGE_LABELS,
                    "image_id": STRANGE_IDS, "size": STRANGE_SIZES}[field]
            setattr(samples[k], field, clone(rng.choice(pool)))
    categories = {1: "a", 2: "b"} if seed % 3 == 0 else None
    if rng.random() < 0.5:
        samples = [vars(s) for s in samples]  # dicts are accepted too
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataWarning)
            source = SampleListSource(samples, categories)
    except (DatasetError, TypeError) as err:
        assert str(err).strip()
        return
    check_source(source, categories)
    for i in range(len(source)):
        if not isinstance(source.samples[i].image, str):
            data = source.load(i)[0]
            assert data.dtype == np.uint8 and (data.ndim == 1 or (data.ndim == 3 and data.shape[2] == 3))


def test_the_fuzzing_reaches_both_outcomes(tmp_path):
    """Not all rejected, not all built: the cases above test something."""
    built = 0
    for seed in range(40):
        rng = random.Random(seed)
        doc = base_coco()
        mutate_coco(doc, rng)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)
                CocoSource(doc, tmp_path)
            built += 1
        except DatasetError:
            pass
    assert 5 <= built <= 35
