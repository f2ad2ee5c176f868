"""converters.coco: the top-level dict, deterministic bytes, atomic writes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from converters import atomic_output
from converters.coco import dumps_coco, make_categories, make_coco, write_coco_json


def small_coco() -> dict:
    return make_coco(
        [{"id": 1, "file_name": "猫.jpg", "width": 10, "height": 5}],
        [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0.0, 0.0, 2.0, 4.0], "area": 8.0,
          "iscrowd": 0, "attributes": {"difficult": 0}}],
        make_categories(["cat", "dog"]))


def test_top_level_keys_and_category_ids() -> None:
    coco = small_coco()
    assert list(coco) == ["info", "licenses", "images", "annotations", "categories"]
    assert coco["licenses"] == [] and "description" in coco["info"]
    assert [(c["id"], c["name"]) for c in coco["categories"]] == [(1, "cat"), (2, "dog")]


def test_dumps_is_utf8_compact_and_stable() -> None:
    data = dumps_coco(small_coco())
    assert data == dumps_coco(small_coco())
    assert "猫.jpg".encode() in data and data.endswith(b"\n") and b", " not in data
    assert json.loads(data) == small_coco()


def test_nan_is_refused_before_writing(tmp_path: Path) -> None:
    coco = small_coco()
    coco["annotations"][0]["area"] = float("nan")
    with pytest.raises(ValueError):
        write_coco_json(coco, tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []


def test_write_creates_folders_and_readable_file(tmp_path: Path) -> None:
    path = write_coco_json(small_coco(), tmp_path / "a" / "b" / "out.json")
    assert json.loads(path.read_text(encoding="utf-8")) == small_coco()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0o600
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]


class _Crash(Exception):
    pass


def test_failure_mid_write_leaves_old_file_and_no_temp(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.json"
    path.write_text('{"old": true}', encoding="utf-8")
    real_fdopen = os.fdopen

    class HalfWriter:
        """Writes half of the bytes, then fails, like a crash or Ctrl-C in the middle."""

        def __init__(self, fd: int, mode: str, **kwargs: object) -> None:
            self.handle = real_fdopen(fd, mode, **kwargs)

        def close(self) -> None:
            self.handle.close()

        def __enter__(self) -> HalfWriter:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, data: bytes) -> None:
            self.handle.write(data[: len(data) // 2])
            self.handle.flush()
            raise _Crash("killed mid-write")

    monkeypatch.setattr(atomic_output.os, "fdopen", HalfWriter)
    with pytest.raises(_Crash):
        write_coco_json(small_coco(), path)
    assert path.read_text(encoding="utf-8") == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_keyboard_interrupt_before_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.json"

    def interrupted_replace(src: str, dst: str) -> None:
        assert Path(src).read_bytes() == dumps_coco(small_coco())  # complete, but not in place
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic_output.os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        write_coco_json(small_coco(), path)
    assert list(tmp_path.iterdir()) == []


def test_replacing_keeps_the_mode_of_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("{}", encoding="utf-8")
    path.chmod(0o640)
    write_coco_json(small_coco(), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert json.loads(path.read_bytes()) == small_coco()


def test_document_from_parts_equals_dumps() -> None:
    from converters.coco import coco_json_from_parts, json_tail

    coco = small_coco()
    images = ['{"id":1,' + json_tail({k: v for k, v in coco["images"][0].items() if k != "id"})]
    ann = coco["annotations"][0]
    annotations = ['{"id":1,"image_id":1,"category_id":1,' + json_tail(
        {k: v for k, v in ann.items() if k not in ("id", "image_id", "category_id")})]
    assert coco_json_from_parts(images, annotations, coco["categories"]) == dumps_coco(coco)
    assert coco_json_from_parts([], [], []) == dumps_coco(make_coco([], [], []))
