"""The COCO parser (load_coco) and CocoSource: every check of the validation table that COCO has."""

import copy
import json
import warnings

import numpy as np
import pytest

from detaug.errors import DatasetError, DataWarning
from detaug.formats import validation as v
from detaug.formats.coco import CocoDataset, load_coco
from detaug.sources import CocoSource, SampleListSource, coco_to_samples


def coco_dict():
    """Two images, three annotations, two categories: clean (nothing to repair)."""
    return {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 100, "height": 50},
            {"id": 2, "file_name": "sub/b.jpg", "width": 40, "height": 30, "exif_orientation": 6},
        ],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 3, "bbox": [10, 5, 20, 10], "iscrowd": 0},
            {"id": 11, "image_id": 2, "category_id": 7, "bbox": [1.5, 2, 3, 4]},
            {"id": 12, "image_id": 1, "category_id": 7, "bbox": [0, 0, 100, 50], "iscrowd": 1},
        ],
        "categories": [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}],
    }


def load_quietly(doc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        return load_coco(doc)


def test_clean_dataset_is_parsed_columnar():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing repaired: no warning
        data = load_coco(coco_dict())
    assert isinstance(data, CocoDataset)
    assert data.categories == {3: "cat", 7: "dog"}
    a, b = data.images
    assert (a.id, a.file_name, a.size, a.exif_orientation) == (1, "a.jpg", (50, 100), None)
    assert (b.id, b.file_name, b.size, b.exif_orientation) == (2, "sub/b.jpg", (30, 40), 6)
    assert a.boxes.dtype == np.float32 and a.labels.dtype == np.int64
    np.testing.assert_array_equal(a.boxes, [[10, 5, 30, 15], [0, 0, 100, 50]])
    np.testing.assert_array_equal(a.labels, [3, 7])
    np.testing.assert_array_equal(a.iscrowd, [False, True])
    np.testing.assert_array_equal(a.annotation_ids, [10, 12])
    np.testing.assert_array_equal(b.boxes, [[1.5, 2, 4.5, 6]])
    assert data.report.total == 0 and data.report.images == 2 and data.report.boxes == 3


def test_file_and_dict_give_the_same_dataset(tmp_path):
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(coco_dict()))
    from_file, from_dict = load_coco(path), load_coco(coco_dict())
    assert from_file.source == str(path)
    for x, y in zip(from_file.images, from_dict.images):
        assert x.id == y.id and np.array_equal(x.boxes, y.boxes) and np.array_equal(x.labels, y.labels)


def test_json_errors_name_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"images": [}')
    with pytest.raises(DatasetError, match=r"broken\.json: not valid JSON: .*line 1, column 13"):
        load_coco(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DatasetError, match=r"broken\.json: not valid JSON"):
        load_coco(path)
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(DatasetError, match=r"broken\.json: not valid JSON"):
        load_coco(path)
    path.write_text('{"images": [{"id": ' + "9" * 5000 + "}]}")
    with pytest.raises(DatasetError, match=r"broken\.json: not valid JSON"):
        load_coco(path)
    with pytest.raises(FileNotFoundError):
        load_coco(tmp_path / "missing.json")
    with pytest.raises(TypeError):
        load_coco(42)


def mutate(change):
    doc = coco_dict()
    change(doc)
    return doc


def expect(doc, reason, *fragments):
    """load_coco(doc) raises a DatasetError whose report has ``reason`` and whose message holds
    each fragment."""
    with pytest.raises(DatasetError) as info:
        load_quietly(doc)
    assert reason in info.value.report.errors, str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return info.value


def test_structure_errors(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[]")
    expect(path, v.NOT_COCO, "list.json: not a COCO detection file: the top level is a list")
    expect({"annotations": []}, v.NOT_COCO, '"images"')
    expect(mutate(lambda d: d.update(annotations={})), v.NOT_COCO, '"annotations"')
    expect(mutate(lambda d: d.pop("categories")), v.NOT_COCO, "categories")
    expect(mutate(lambda d: d.update(categories="x")), v.NOT_COCO, '"categories"')
    expect({"images": [], "annotations": [], "categories": []}, v.NO_IMAGES)


def test_images_without_annotations_or_categories_are_fine():
    data = load_coco({"images": [{"id": 5, "file_name": "x.png", "width": 3, "height": 2}]})
    assert len(data.images) == 1 and len(data.images[0].boxes) == 0 and data.categories == {}


def test_duplicate_file_names_are_an_error_not_merged():
    def dup(d):
        d["images"][1]["file_name"] = "./a.jpg"
    expect(mutate(dup), v.DUPLICATE_FILE, "image_id 2", "'./a.jpg' is also image_id 1")


def test_duplicate_image_ids():
    def dup(d):
        d["images"][1]["id"] = 1
    expect(mutate(dup), v.DUPLICATE_IMAGE_ID, "sub/b.jpg (image_id 1)")


@pytest.mark.parametrize("value", ["1", None, True, 1.5, 2**63])
def test_bad_image_ids(value):
    expect(mutate(lambda d: d["images"][0].update(id=value)), v.BAD_IMAGE_ID, "images[0]")


@pytest.mark.parametrize("field, value", [("file_name", None), ("file_name", ""), ("file_name", 3),
                                          ("exif_orientation", 9), ("exif_orientation", "6")])
def test_malformed_image_entries(field, value):
    expect(mutate(lambda d: d["images"][0].update({field: value})), v.MALFORMED_IMAGE, "image_id 1")


@pytest.mark.parametrize("width, height", [(0, 50), (-100, 50), (float("nan"), 50), (float("inf"), 50),
                                           ("100", 50), (100, None), (2**31, 50), (100.5, 50)])
def test_invalid_declared_sizes(width, height):
    doc = mutate(lambda d: d["images"][0].update(width=width, height=height))
    expect(doc, v.BAD_SIZE, "a.jpg (image_id 1)")


def test_missing_size_is_a_note_and_boxes_are_not_clipped():
    def nosize(d):
        del d["images"][0]["width"], d["images"][0]["height"]
        d["annotations"][0]["bbox"] = [90, 40, 500, 500]
    data = load_coco(mutate(nosize))
    assert data.images[0].size is None
    np.testing.assert_array_equal(data.images[0].boxes[0], [90, 40, 590, 540])
    assert data.report.notes == {v.SIZE_NOT_DECLARED: 1}


def test_annotation_without_bbox_is_an_error_not_the_previous_box():
    expect(mutate(lambda d: d["annotations"][1].pop("bbox")), v.NO_BOX,
           "sub/b.jpg (image_id 2, annotation_id 11): annotation without a box")
    expect(mutate(lambda d: d["annotations"][1].update(bbox=None)), v.NO_BOX, "annotation_id 11")


@pytest.mark.parametrize("bbox", [[1, 2, 3], [1, 2, 3, 4, 5], "1 2 3 4", {"x": 1}, [1, 2, "3", 4],
                                  [1, 2, [3], 4], [1, True, 3, 4], [1, 2, None, 4]])
def test_malformed_boxes(bbox):
    expect(mutate(lambda d: d["annotations"][0].update(bbox=bbox)), v.MALFORMED_BOX, "annotation_id 10")


@pytest.mark.parametrize("bbox", [[float("nan"), 2, 3, 4], [1, 2, float("inf"), 4], [1, 2, 3, -float("inf")],
                                  [10**400, 0, 1, 1], [3e38, 0, 3e38, 1]])  # the last: x + w overflows float32
def test_non_finite_coordinates(bbox):
    expect(mutate(lambda d: d["annotations"][0].update(bbox=bbox)), v.NON_FINITE, "annotation_id 10")


def test_nan_in_a_json_file(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(coco_dict()).replace("[10, 5, 20, 10]", "[NaN, 5, 20, Infinity]"))
    with pytest.raises(DatasetError, match=r"nan\.json: a\.jpg \(image_id 1, annotation_id 10\): non-finite"):
        load_coco(path)


@pytest.mark.parametrize("category_id, reason", [(99, v.UNKNOWN_CATEGORY), (-1, v.NEGATIVE_LABEL),
                                                  (2**40, v.LABEL_RANGE), ("3", v.MALFORMED_ANNOTATION),
                                                  (None, v.MALFORMED_ANNOTATION)])
def test_bad_category_ids_are_errors_not_label_0(category_id, reason):
    expect(mutate(lambda d: d["annotations"][0].update(category_id=category_id)), reason, "annotation_id 10")


@pytest.mark.parametrize("category, reason", [
    ({"id": -3, "name": "neg"}, v.NEGATIVE_LABEL), ({"id": 2**31, "name": "big"}, v.LABEL_RANGE),
    ({"id": 3, "name": "again"}, v.DUPLICATE_CATEGORY), ({"id": "4", "name": "s"}, v.MALFORMED_CATEGORY),
    ({"id": 4}, v.MALFORMED_CATEGORY), ("cat", v.MALFORMED_CATEGORY),
])
def test_bad_categories(category, reason):
    expect(mutate(lambda d: d["categories"].append(category)), reason, "categories[2]")


@pytest.mark.parametrize("key, reason", [("images", v.MALFORMED_IMAGE), ("categories", v.MALFORMED_CATEGORY)])
def test_list_entries_that_are_not_objects(key, reason):
    def spoil(d):
        d[key][1] = ["x"]
    expect(mutate(spoil), reason, f"{key}[1]", "['x'] is not an object")


@pytest.mark.parametrize("change, fragment", [
    (lambda a: a.update(image_id=99), "annotation of an unknown image"),
    (lambda a: a.update(image_id="1"), "image_id '1' is not an integer"),
    (lambda a: a.update(iscrowd=2), "iscrowd 2"),
    (lambda a: a.update(id="x"), "id 'x'"),
])
def test_malformed_annotations(change, fragment):
    doc = coco_dict()
    change(doc["annotations"][0])
    with pytest.raises(DatasetError, match=fragment):
        load_quietly(doc)
    doc["annotations"][0] = "not an object"
    expect(doc, v.MALFORMED_ANNOTATION, "annotations[0]")


def test_annotations_of_a_broken_image_are_not_reported_twice():
    doc = mutate(lambda d: d["images"][0].update(width=-1))
    err = expect(doc, v.BAD_SIZE)
    assert v.UNKNOWN_IMAGE not in err.report.errors


def test_all_errors_are_listed_in_one_message():
    def many(d):
        d["annotations"][0]["category_id"] = 99
        d["annotations"][1].pop("bbox")
        d["annotations"][2]["bbox"] = [float("nan")] * 4
    err = expect(mutate(many), v.UNKNOWN_CATEGORY)
    assert err.report.errors == {v.UNKNOWN_CATEGORY: 1, v.NO_BOX: 1, v.NON_FINITE: 1}
    assert "3 problems in <COCO dict>" in str(err)


def test_repairs_are_counted_and_warned():
    def bad_boxes(d):
        d["annotations"] += [
            {"id": 20, "image_id": 1, "category_id": 3, "bbox": [5, 5, 0, 10]},     # zero width
            {"id": 21, "image_id": 1, "category_id": 3, "bbox": [5, 5, -3, 10]},    # negative width
            {"id": 22, "image_id": 1, "category_id": 3, "bbox": [90, 40, 20, 20]},  # clipped
            {"id": 23, "image_id": 1, "category_id": 3, "bbox": [-30, 0, 10, 10]},  # outside
        ]
    with pytest.warns(DataWarning, match="2 empty box dropped"):
        data = load_coco(mutate(bad_boxes))
    assert data.report.repairs == {v.EMPTY_BOX: 2, v.BOX_CLIPPED: 1, v.BOX_OUTSIDE: 1}
    a = data.images[0]
    np.testing.assert_array_equal(a.annotation_ids, [10, 12, 22])
    np.testing.assert_array_equal(a.boxes[2], [90, 40, 100, 50])
    assert "annotation_id 23" in data.report.summary()


def test_integral_floats_are_integers():
    def floats(d):
        d["images"][0].update(id=1.0, width=100.0, height=50.0)
        d["annotations"][0].update(category_id=3.0, image_id=1.0)
    data = load_coco(mutate(floats))
    assert data.images[0].id == 1 and data.images[0].size == (50, 100) and data.images[0].labels.dtype == np.int64


def test_annotation_ids_are_optional():
    doc = mutate(lambda d: [a.pop("id") for a in d["annotations"]])
    doc["annotations"].append({"image_id": 1, "category_id": 3, "bbox": [90, 40, 20, 20]})
    with pytest.warns(DataWarning):
        data = load_coco(doc)
    assert data.images[0].annotation_ids.tolist() == [-1, -1, -1]
    assert "a.jpg (image_id 1, annotations[3])" in data.report.summary()


# -- CocoSource ---------------------------------------------------------------------------------------

@pytest.fixture
def coco_files(tmp_path):
    (tmp_path / "images").mkdir()
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(coco_dict()))
    return path, tmp_path / "images"


def test_coco_source_is_a_list_of_checked_samples(coco_files):
    path, images = coco_files
    source = CocoSource(path, images, shuffle=True, seed=5, shard_id=1, num_shards=2)
    assert isinstance(source, SampleListSource) and source.to_sample_list() is source
    assert (source.shuffle, source.seed, source.shard_id, source.num_shards) == (True, 5, 1, 2)
    assert len(source) == 2 and not source.decoded and source.orientation == "auto"
    assert source.categories == {3: "cat", 7: "dog"}
    assert source.file_of(1) == str(images / "sub/b.jpg")
    s = source.samples[0]
    assert (s.image_id, s.size) == (1, (50, 100)) and s.labels.dtype == np.int64
    assert source.report.images == 2 and source.report.total == 0
    assert not hasattr(source, "dali_read")


def test_coco_source_options_are_counted(coco_files):
    path, images = coco_files
    source = CocoSource(path, images, include_iscrowd=False)
    np.testing.assert_array_equal(source.samples[0].labels, [3])
    assert source.report.notes == {v.CROWD_LEFT_OUT: 1}
    doc = coco_dict()
    doc["images"].append({"id": 3, "file_name": "empty.jpg", "width": 5, "height": 5})
    source = CocoSource(doc, images, skip_empty=True)
    assert [s.image_id for s in source.samples] == [1, 2]
    assert source.report.notes == {v.EMPTY_IMAGE_LEFT_OUT: 1} and source.report.images == 2
    doc["annotations"] = []
    with pytest.raises(DatasetError, match="every image was left out"):
        CocoSource(doc, images, skip_empty=True)


def test_coco_source_arguments(coco_files, tmp_path):
    path, images = coco_files
    with pytest.raises(FileNotFoundError, match="nope.json"):
        CocoSource(tmp_path / "nope.json", images)
    with pytest.raises(FileNotFoundError, match="no-dir"):
        CocoSource(path, tmp_path / "no-dir")
    with pytest.raises(ValueError, match="orientation"):
        CocoSource(path, images, orientation="rotate")
    with pytest.raises(TypeError):
        CocoSource(path, images, initial_fill=16)  # DALI's reader is gone
    assert CocoSource(path, images, orientation="ignore").orientation == "ignore"


def test_coco_source_load(coco_files):
    path, images = coco_files
    (images / "a.jpg").write_bytes(b"\xff\xd8abc\xff\xd9")
    source = CocoSource(path, images)
    data, boxes, labels, image_id = source.load(0)
    assert data.dtype == np.uint8 and data.ndim == 1 and data.tobytes() == b"\xff\xd8abc\xff\xd9"
    assert boxes.dtype == np.float32 and labels.dtype == np.int64 and image_id == 1
    with pytest.raises(OSError, match="b.jpg"):
        source.load(1)


def test_coco_to_samples_keeps_working(tmp_path):
    samples = coco_to_samples(coco_dict(), tmp_path, include_iscrowd=False)
    assert [s.image for s in samples] == [str(tmp_path / "a.jpg"), str(tmp_path / "sub/b.jpg")]
    assert [len(s.boxes) for s in samples] == [1, 1]
    with pytest.raises(DatasetError):
        coco_to_samples(mutate(lambda d: d["annotations"][0].pop("bbox")), tmp_path)


def test_the_input_dict_is_not_changed():
    doc = coco_dict()
    doc["annotations"][0]["bbox"] = [90, 40, 20, 20]
    before = copy.deepcopy(doc)
    load_quietly(doc)
    assert doc == before


def test_iscrowd_accepts_json_booleans():
    def booleans(d):
        d["annotations"][0]["iscrowd"] = False
        d["annotations"][2]["iscrowd"] = True
    data = load_coco(mutate(booleans))
    np.testing.assert_array_equal(data.images[0].iscrowd, [False, True])
