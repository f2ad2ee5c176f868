"""converters.labels: VOC classes, labels files (plain and labelmap.txt), discovered names."""

from __future__ import annotations

from pathlib import Path

import pytest

from converters.labels import VOC_CLASSES, read_labels_file, resolve_labels


def test_voc_classes_in_devkit_order() -> None:
    assert len(VOC_CLASSES) == 20
    assert VOC_CLASSES[0] == "aeroplane" and VOC_CLASSES[14] == "person"
    assert VOC_CLASSES[-1] == "tvmonitor"
    assert resolve_labels("voc", ["zebra"]) == list(VOC_CLASSES)


def test_discover_sorts_unique_names() -> None:
    assert resolve_labels("discover", ["WBC", "RBC", "Platelets", "RBC"]) == [
        "Platelets", "RBC", "WBC"]


def test_plain_labels_file(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("# my classes\ncat\n\n  dog  \ndining table\n", encoding="utf-8")
    assert read_labels_file(path) == ["cat", "dog", "dining table"]
    assert resolve_labels(str(path), []) == ["cat", "dog", "dining table"]
    assert resolve_labels(path, []) == ["cat", "dog", "dining table"]


def test_cvat_labelmap(realdata: Path) -> None:
    names = read_labels_file(realdata / "datumaro-voc-dataset2/labelmap.txt")
    assert names[:3] == ["background", "aeroplane", "bicycle"]
    assert names[-1] == "ignored" and len(names) == 22
    assert names[1:21] == list(VOC_CLASSES)


def test_utf8_bom_and_unicode_names(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes("\ufeff猫\nchien\n".encode())
    assert read_labels_file(path) == ["猫", "chien"]


def test_duplicate_name_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("cat\ndog\ncat\n", encoding="utf-8")
    with pytest.raises(ValueError,
                       match=r"labels.txt:3: duplicate label 'cat' \(first on line 1\)"):
        read_labels_file(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("# nothing\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no label names"):
        read_labels_file(path)


def test_list_and_bad_specs(tmp_path: Path) -> None:
    assert resolve_labels(["b", "a"], ["x"]) == ["b", "a"]
    with pytest.raises(ValueError, match="duplicate"):
        resolve_labels(["a", "a"], [])
    with pytest.raises(ValueError, match="not 'voc', 'discover' or an existing file"):
        resolve_labels(str(tmp_path / "missing.txt"), [])
