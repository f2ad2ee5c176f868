"""converters.images: finding an image by VOC id. (Probing the image: tests/detaug/formats;
what the converter does with the probe: tests/converters/test_verify_and_exif.py.)"""

from __future__ import annotations

from pathlib import Path

from converters.images import ImageIndex, filename_base


def test_find_by_id_then_filename(tmp_path: Path) -> None:
    for name in ["a.JPG", "b.png", "b.jpeg", "c d.jpg", "notes.txt"]:
        (tmp_path / name).write_bytes(b"x")
    index = ImageIndex.scan(tmp_path)
    assert index.find("a", None) == ("a.JPG", "id", 1)
    assert index.find("b", None) == ("b.jpeg", "id", 2)  # .jpeg ranks before .png
    assert index.find("b", "b.png") == ("b.png", "id", 2)  # <filename> picks among them
    assert index.find("x", "C:\\data\\c d.jpg") == ("c d.jpg", "filename", 1)
    assert index.find("x", "C D.JPG") == ("c d.jpg", "filename", 1)
    assert index.find("notes", "notes.txt") == (None, None, 0)


def test_filename_base() -> None:
    assert filename_base("/a/b/c.jpg") == "c.jpg"
    assert filename_base("a\\b\\c.jpg") == "c.jpg"
    assert filename_base("  ") is None and filename_base(None) is None
