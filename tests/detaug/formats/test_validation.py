"""The validation module: its value rules, the box checks, the report, and its documented table."""

import json
import math
import warnings

import numpy as np
import pytest

from detaug.errors import DatasetError, DataWarning
from detaug.formats import validation as v


def test_every_reason_is_in_the_docstring_table_with_its_kind():
    rows = {}
    for line in v.__doc__.splitlines():
        for reason, kind in v.RULES.items():
            if line.startswith(reason + " ") and line[len(reason):].split()[0] == kind:
                rows[reason] = kind
    assert rows == v.RULES


@pytest.mark.parametrize("value, expected", [
    (3, 3), (np.int64(-2), -2), (4.0, 4), (np.float32(7), 7), (2**70, 2**70),
    (True, None), (np.bool_(False), None), (2.5, None), (math.nan, None), (math.inf, None),
    ("3", None), (None, None), ([1], None),
])
def test_as_int(value, expected):
    assert v.as_int(value) == expected


def test_as_coordinate():
    assert v.as_coordinate(2) == 2.0 and v.as_coordinate(1.5) == 1.5
    assert v.as_coordinate(10**400) == math.inf and v.as_coordinate(-(10**400)) == -math.inf
    assert math.isnan(v.as_coordinate(math.nan))
    for bad in (True, "1", None, [1]):
        assert v.as_coordinate(bad) is None


@pytest.mark.parametrize("h, w, ok", [
    (10, 20, True), (10.0, 20, True), (2**31 - 1, 1, True),
    (0, 20, False), (-1, 20, False), (10, 2**31, False), (math.nan, 5, False), (math.inf, 5, False),
    ("10", 20, False), (10, None, False), (True, 5, False), (10.5, 20, False),
])
def test_check_size(h, w, ok):
    size, why = v.check_size(h, w)
    assert (size == (int(h), int(w))) if ok else (size is None and why)


def test_label_problem():
    assert v.label_problem(0) is None and v.label_problem(2**31 - 1) is None
    assert v.label_problem(-1) == v.NEGATIVE_LABEL
    assert v.label_problem(2**31) == v.LABEL_RANGE


def _where(j):
    return "f.json", 7, j


def test_check_boxes_repairs_and_counts():
    boxes = np.array([
        [1, 2, 5, 6],        # kept as is
        [5, 5, 5, 9],        # zero width: dropped
        [5, 5, 9, 3],        # negative height: dropped
        [-2, 1, 4, 12],      # clipped to [0, 1, 4, 10]
        [30, 1, 40, 5],      # outside (w = 20): dropped
        [20, 1, 25, 5],      # touches the right edge only: no area inside, dropped
        [1, 1, 3, 3],        # size unknown: not clipped
        [-5, -5, 300, 300],  # size unknown: kept as is
    ], np.float64)
    sizes = np.array([[10, 20]] * 6 + [[np.nan, np.nan]] * 2)
    report = v.Report("f.json")
    out, keep = v.check_boxes(boxes, sizes, report, _where)
    assert out.dtype == np.float32
    assert keep.tolist() == [True, False, False, True, False, False, True, True]
    np.testing.assert_array_equal(out[keep], [[1, 2, 5, 6], [0, 1, 4, 10], [1, 1, 3, 3], [-5, -5, 300, 300]])
    assert report.repairs == {v.EMPTY_BOX: 2, v.BOX_CLIPPED: 1, v.BOX_OUTSIDE: 2}
    assert report.errors == {} and report.total == 5
    clipped = report.examples[v.BOX_CLIPPED][0]
    assert (clipped.file, clipped.image_id, clipped.annotation) == ("f.json", 7, 3)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e39])  # 1e39 overflows float32
def test_check_boxes_non_finite_is_an_error(bad):
    report = v.Report("f.json")
    _, keep = v.check_boxes(np.array([[0, 0, bad, 4], [0, 0, 2, 2]]), np.full((2, 2), np.nan), report, _where)
    assert keep.tolist() == [False, True]
    assert report.errors == {v.NON_FINITE: 1}
    with pytest.raises(DatasetError, match=r"f\.json \(image_id 7, annotation_id 0\): non-finite coordinate"):
        report.raise_errors()


def test_clipped_boxes_stay_inside_in_float32():
    w = 2**24 + 1  # not a float32
    report = v.Report()
    out, keep = v.check_boxes(np.array([[0.0, 0, w + 10, 3]]), np.array([[4.0, w]]), report, _where)
    assert keep.all() and out[0, 2] <= np.float32(w) and out[0, 3] == 3


def test_report_examples_are_capped_and_counts_complete():
    report = v.Report("src")
    for k in range(10):
        report.add(v.BOX_CLIPPED, "a.jpg", image_id=k, annotation=k)
    assert report.counts[v.BOX_CLIPPED] == 10 and len(report.examples[v.BOX_CLIPPED]) == v.MAX_EXAMPLES
    with pytest.raises(KeyError):
        report.add("not a reason", "a.jpg")


def test_report_summary_and_as_dict():
    report = v.Report("ann.json")
    report.images, report.boxes = 3, 5
    report.add(v.BOX_CLIPPED, "ann.json: a.jpg", image_id=1, annotation=11, detail="xyxy [..]")
    report.add(v.CROWD_LEFT_OUT, "ann.json: a.jpg", image_id=1, annotation=12)
    text = report.summary()
    assert "ann.json: 3 images, 5 boxes kept" in text
    assert "repaired:" in text and "notes:" in text
    assert "ann.json: a.jpg (image_id 1, annotation_id 11): xyxy [..]" in text
    d = report.as_dict()
    json.dumps(d)
    assert d["repairs"] == {v.BOX_CLIPPED: 1} and d["notes"] == {v.CROWD_LEFT_OUT: 1}
    assert d["errors"] == {} and d["total"] == report.total == 2
    assert "nothing to repair" in v.Report("x").summary()


def test_raise_errors_names_the_first_error_and_counts_all():
    report = v.Report("ann.json")
    report.add(v.BOX_CLIPPED, "ann.json: a.jpg", image_id=1)  # a repair is not an error
    report.raise_errors()
    report.add(v.NO_BOX, "ann.json: a.jpg", image_id=1, annotation=5)
    for k in range(4):
        report.add(v.UNKNOWN_CATEGORY, "ann.json: b.jpg", image_id=2, annotation=6 + k, detail="category_id 99")
    with pytest.raises(DatasetError) as info:
        report.raise_errors()
    text = str(info.value)
    assert text.splitlines()[0] == "ann.json: a.jpg (image_id 1, annotation_id 5): annotation without a box"
    assert "5 problems in ann.json" in text and "4  unknown category id" in text
    assert info.value.report is report
    assert isinstance(info.value, ValueError)


def test_finish_warns_once_when_something_was_repaired():
    report = v.Report("ann.json")
    report.add(v.SIZE_NOT_DECLARED, "x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.finish()  # notes do not warn
    report.add(v.BOX_CLIPPED, "x")
    report.add(v.BOX_CLIPPED, "x")
    with pytest.warns(DataWarning, match="2 box clipped to the image") as record:
        report.finish()
    assert len(record) == 1
    assert record[0].filename == __file__  # points at the caller, not into detaug


# -- containment and whole-dataset columns (issue 39) ----------------------------------------------

@pytest.mark.parametrize("name, problem", [
    ("a.jpg", None), ("sub/../a.jpg", None), ("..a", None), ("a..b", None), ("..\\x", None),
    ("../x", "leaves its folder (..)"), ("a/../../x", "leaves its folder (..)"), ("./..", "leaves its folder (..)"),
    ("/etc/passwd", "is an absolute path"), ("x\0y", "holds a NUL byte"),
])
def test_path_problem(name, problem):
    assert v.path_problem(name) == problem
    assert v.outside_paths(["ok.jpg", name]) == ([] if problem is None else [1])


def _columns(boxes, labels=None, ids=(1, 2, 3), sizes=((20, 30),) * 3, starts=(0, 1, 2, 3)):
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    labels = np.ones(len(boxes), np.int32) if labels is None else np.asarray(labels, np.int32)
    return (np.asarray(ids, np.int64), np.asarray(sizes, np.int32), np.asarray(starts, np.int64), boxes, labels)


def test_check_columns_names_the_row_across_blocks(monkeypatch):
    monkeypatch.setattr(v, "_BLOCK_ROWS", 2)  # the third box is in the second block
    report = v.Report("manifest")
    good = [2, 2, 10, 10]
    boxes, keep = v.check_columns(*_columns([good, good, [np.nan, 0, 1, 1]]), {1: "x"}, report, lambda i: f"file{i}")
    assert keep.tolist() == [True, True, False]
    finding = report.examples[v.NON_FINITE][0]
    assert (finding.file, finding.image_id, finding.annotation) == ("file2", 3, "box 0")
    with pytest.raises(DatasetError, match="file2 \\(image_id 3, box 0\\): non-finite"):
        report.raise_errors()


def test_check_columns_repairs_and_counts():
    report = v.Report("manifest")
    boxes, keep = v.check_columns(*_columns([[5, 5, 2, 9], [0, 0, 1e30, 1e30], [-5, -5, 10, 10]]), {1: "x"},
                                  report, str)
    assert keep.tolist() == [False, True, True]
    assert boxes[1].tolist() == [0, 0, 30, 20] and boxes[2].tolist() == [0, 0, 10, 10]
    assert report.repairs == {v.EMPTY_BOX: 1, v.BOX_CLIPPED: 2} and not report.errors


@pytest.mark.parametrize("edit, reason", [
    (dict(labels=[1, 999, 1]), v.UNKNOWN_CATEGORY), (dict(labels=[1, -5, 1]), v.NEGATIVE_LABEL),
    (dict(labels=[1, 2**31, 1]), v.LABEL_RANGE), (dict(ids=(1, 2, 1)), v.DUPLICATE_IMAGE_ID),
    (dict(sizes=((20, 30), (-1, 30), (20, 30))), v.BAD_SIZE), (dict(sizes=((20, 0),) * 3), v.BAD_SIZE),
])
def test_check_columns_errors(edit, reason):
    good = [2, 2, 10, 10]
    labels = edit.pop("labels", None)
    arrays = list(_columns([good] * 3, **edit))
    if labels is not None:
        arrays[4] = np.asarray(labels, np.int64)
    report = v.Report("manifest")
    v.check_columns(*arrays, {1: "x"}, report, lambda i: f"file{i}")
    assert reason in report.errors


@pytest.mark.parametrize("starts", [(0, 2, 1, 3), (0, 1, 2), (1, 1, 2, 3), (0, 1, 2, 4)])
def test_check_columns_refuses_columns_that_do_not_fit(starts):
    with pytest.raises(DatasetError, match="do not fit together"):
        v.check_columns(*_columns([[2, 2, 10, 10]] * 3, starts=starts), {1: "x"}, v.Report("m"), str)
