"""converters.images: finding an image by VOC id, reading headers, verifying."""

from __future__ import annotations

from pathlib import Path

from converters import report as R
from converters.images import ImageIndex, filename_base, probe_image
from tests.converters.helpers import write_image


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


def test_probe_header_and_grayscale(tmp_path: Path) -> None:
    probe = probe_image(write_image(tmp_path / "g.jpg", (30, 20), mode="L"), verify=True)
    assert probe.size == (30, 20) and probe.mode == "L" and probe.bands == 1
    assert probe.error is None


def test_probe_truncated_jpeg(realdata: Path) -> None:
    path = realdata / "damse-truncated-jpeg/JPEGImages/000001.jpg"
    assert probe_image(path, verify=False) == ((353, 500), "RGB", 3, None)
    broken = probe_image(path, verify=True)
    assert broken.size == (353, 500) and broken.error is not None
    assert broken.error[0] == R.IMAGE_BROKEN and "truncated" in broken.error[1]


def test_probe_not_an_image(tmp_path: Path) -> None:
    path = tmp_path / "x.jpg"
    path.write_bytes(b"\x00" * 100)
    probe = probe_image(path, verify=False)
    assert probe.size is None and probe.error[0] == R.IMAGE_UNREADABLE
