"""The YOLO-txt parser: its layout, its notes, and every malformed input named by file and line."""

from __future__ import annotations

import os

import numpy as np
import pytest

from detaug.errors import DatasetError
from detaug.formats import validation as v
from detaug.formats.yolo import MAX_LABEL_BYTES, label_path, parse_labels, read_names, read_yolo_folder


def folder(root, labels: dict[str, str], images=("a.jpg",), names="cat\ndog\n"):
    """A YOLO folder: empty image files (the parser reads no pixels), label files, classes.txt."""
    for name in images:
        (root / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "images" / name).write_bytes(b"")
    for name, text in labels.items():
        (root / "labels" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "labels" / name).write_text(text)
    if names is not None:
        (root / "classes.txt").write_text(names)
    return root


def test_images_in_path_order_with_their_label_lines(tmp_path):
    folder(tmp_path, {"b/c.txt": "1 0.5 0.5 0.2 0.4\n\n0 0.25 0.75 0.5 0.5\n", "z.txt": "0 0.5 0.5 0.1 0.1\n"},
           images=("b/c.PNG", "a.jpg", "notes.txt"))
    parsed = read_yolo_folder(tmp_path)
    assert parsed.categories == {0: "cat", 1: "dog"}
    assert [os.path.relpath(i.image, tmp_path) for i in parsed.images] == ["images/a.jpg", "images/b/c.PNG"]
    first, second = parsed.images
    assert first.label_file is None and first.boxes.shape == (0, 4)
    assert second.labels.tolist() == [1, 0] and second.lines.tolist() == [1, 3]
    assert second.boxes.tolist() == [[0.5, 0.5, 0.2, 0.4], [0.25, 0.75, 0.5, 0.5]]
    assert parsed.report.counts == {v.IMAGE_WITHOUT_LABELS: 1, v.LABELS_WITHOUT_IMAGE: 1}
    assert "labels/z.txt" in str(parsed.report.examples[v.LABELS_WITHOUT_IMAGE][0])


@pytest.mark.parametrize("line, reason, detail", [
    ("0 0.5 0.5 0.5", v.MALFORMED_BOX, "expected 'class cx cy w h' (5 values), got 4"),
    ("0 0.5 0.5 0.5 0.5 0.9", v.MALFORMED_BOX, "got 6"),
    ("0 0.5 half 0.5 0.5", v.MALFORMED_BOX, "are not 4 numbers"),
    ("cat 0.5 0.5 0.5 0.5", v.MALFORMED_LABEL, "class 'cat' is not an integer"),
    ("1.5 0.5 0.5 0.5 0.5", v.MALFORMED_LABEL, "is not an integer"),
    ("-1 0.5 0.5 0.5 0.5", v.NEGATIVE_LABEL, "class -1"),
    ("4294967296 0.5 0.5 0.5 0.5", v.LABEL_RANGE, "class 4294967296"),
    ("2 0.5 0.5 0.5 0.5", v.UNKNOWN_CATEGORY, "class 2 (the names have 2)"),
    ("0 0.5 inf 0.5 0.5", v.NON_FINITE, "0.5 inf 0.5 0.5"),
])
def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path, line, reason, detail):
    folder(tmp_path, {"a.txt": f"0 0.5 0.5 0.1 0.1\n\n{line}\n"})
    with pytest.raises(DatasetError) as info:
        read_yolo_folder(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'labels' / 'a.txt'} (line 3): {reason}: ")
    assert detail in str(info.value) and info.value.report.errors == {reason: 1}


def test_every_bad_line_is_listed_and_integral_classes_are_integers(tmp_path):
    report = v.Report("t")
    labels, boxes, lines = parse_labels("3.0 0.1 0.2 0.3 0.4\nx\n1 a b c d\n", "f.txt", None, report)
    assert labels.tolist() == [3] and boxes.tolist() == [[0.1, 0.2, 0.3, 0.4]] and lines.tolist() == [1]
    assert sum(report.errors.values()) == 2  # no names given: class 3 is not checked


def test_names_from_a_list_a_file_or_classes_txt(tmp_path):
    report = v.Report("t")
    assert read_names(["a", "b"], report) == {0: "a", 1: "b"}
    (tmp_path / "names").write_text("a\n\nb\na\n\n\n")
    assert read_names(tmp_path / "names", report) == {0: "a", 2: "b"}
    assert [str(f) for f in report.examples[v.MALFORMED_CATEGORY]] == [
        f"{tmp_path / 'names'} (line 2): malformed category: empty name",
        f"{tmp_path / 'names'} (line 4): malformed category: name 'a' also on line 1"]
    folder(tmp_path, {}, names=None)
    assert read_yolo_folder(tmp_path).categories == {}
    assert read_yolo_folder(tmp_path, names=["x"]).categories == {0: "x"}


def test_split_lists_stay_inside_the_folder(tmp_path):
    folder(tmp_path, {"t/a.txt": "0 0.5 0.5 0.1 0.1\n"}, images=("t/a.jpg", "t/b.jpg"))
    (tmp_path / "train.txt").write_text("./images/t/b.jpg\n\nimages/t/a.jpg\n")
    parsed = read_yolo_folder(tmp_path, "train")
    assert [os.path.relpath(i.image, tmp_path) for i in parsed.images] == ["images/t/b.jpg", "images/t/a.jpg"]
    assert parsed.images[1].labels.tolist() == [0]
    (tmp_path / "val.txt").write_text("images/t/a.jpg\n../outside/images/x.jpg\n/etc/images/passwd\nphotos/a.jpg\n")
    with pytest.raises(DatasetError) as info:
        read_yolo_folder(tmp_path, "val")
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'val.txt'} (line 2): path outside the dataset folder: '../outside/images/x.jpg'")
    assert "(line 3): '/etc/images/passwd' is an absolute path" in text
    assert "(line 4): 'photos/a.jpg' is not under an images/ folder" in text
    outside = read_yolo_folder(tmp_path, "train", allow_paths_outside=True)  # accepted when asked
    assert len(outside.images) == 2
    with pytest.raises(FileNotFoundError, match="test.txt: split list"):
        read_yolo_folder(tmp_path, "test")


def test_label_files_that_are_not_text_are_named(tmp_path):
    folder(tmp_path, {"a.txt": ""}, images=("a.jpg", "b.jpg"))
    (tmp_path / "labels" / "a.txt").write_bytes(b"0 0.5 \xff 0.5 0.5\n")
    os.mkfifo(tmp_path / "labels" / "b.txt")  # a pipe planted where a label file should be: never opened
    with pytest.raises(DatasetError) as info:
        read_yolo_folder(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'labels' / 'a.txt'}: malformed annotation: not UTF-8 text (byte 6)")
    assert f"{tmp_path / 'labels' / 'b.txt'}: not a regular file" in str(info.value)


def test_label_path_replaces_the_last_images_folder(tmp_path):
    assert label_path(tmp_path, "images/x/images/y.jpg") == tmp_path / "images/x/labels/y.txt"
    assert label_path(tmp_path, "./images/y.jpeg") == tmp_path / "labels/y.txt"
    assert label_path(tmp_path, "y.jpg") is None and MAX_LABEL_BYTES >= 1 << 20


def test_empty_folder_and_missing_images_folder(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DatasetError, match="no images"):
        read_yolo_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="images folder"):
        read_yolo_folder(tmp_path / "nope")
    assert np.array_equal(parse_labels("", "f", None, v.Report("t"))[1], np.zeros((0, 4)))


def test_hostile_label_files_are_refused_before_they_are_read(tmp_path, monkeypatch):
    """A link to a device never ends and a huge file would fill the memory: both are named."""
    import detaug.formats.yolo as yolo

    folder(tmp_path, {"b.txt": "0 0.5 0.5 0.5 0.5\n" * 4}, images=("a.jpg", "b.jpg"))
    (tmp_path / "labels" / "a.txt").symlink_to("/dev/zero")
    monkeypatch.setattr(yolo, "MAX_LABEL_BYTES", 40)
    with pytest.raises(DatasetError) as info:
        read_yolo_folder(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'labels' / 'a.txt'}: malformed annotation: not a regular file")
    assert f"{tmp_path / 'labels' / 'b.txt'}: 72 bytes: larger than 40" in str(info.value)
