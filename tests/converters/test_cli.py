"""converters.cli: the voc2coco command, in process and as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from converters import cli
from converters.voc2coco import convert
from tests.converters.helpers import make_voc, obj, voc_xml


def dataset(tmp_path: Path) -> Path:
    files = {"a.xml": voc_xml("a.jpg", objects=[obj("cat", (1, 1, 10, 10))]),
             "b.xml": voc_xml("b.jpg", objects=[obj("dog", (2, 2, 9, 9))]),
             "c.xml": voc_xml("c.jpg", objects=[obj("dog", (5, 5, 4, 4))])}  # zero-size box
    return make_voc(tmp_path / "VOC", files, {n: (32, 24) for n in ("a.jpg", "b.jpg", "c.jpg")},
                    splits={"train": ["a", "c"], "val": ["b"]})


def test_all_to_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = dataset(tmp_path)
    out = tmp_path / "out.json"
    assert cli.main([str(root), "-o", str(out)]) == 0
    coco = json.loads(out.read_text(encoding="utf-8"))
    assert len(coco["images"]) == 3 and len(coco["annotations"]) == 2
    err = capsys.readouterr().err
    assert "== all XML files" in err and "annotations: 2 converted, 1 skipped, of 3" in err
    assert "c.xml: skipped object: zero-size box" in err and f"wrote {out}" in err


def test_splits_to_a_folder_share_categories(tmp_path: Path) -> None:
    root = dataset(tmp_path)
    assert cli.main([str(root), "--split", "train", "--split", "val", "-o",
                     str(tmp_path / "coco"), "-q"]) == 0
    train = json.loads((tmp_path / "coco/train.json").read_bytes())
    val = json.loads((tmp_path / "coco/val.json").read_bytes())
    assert train["categories"] == val["categories"] == [
        {"id": 1, "name": "cat", "supercategory": "none"},
        {"id": 2, "name": "dog", "supercategory": "none"}]
    assert [i["file_name"] for i in train["images"]] == ["a.jpg", "c.jpg"]


def test_output_bytes_match_the_api_and_repeat(tmp_path: Path) -> None:
    from converters.coco import dumps_coco

    root = dataset(tmp_path)
    cli.main([str(root), "-o", str(tmp_path / "1.json"), "-q"])
    cli.main([str(root), "-o", str(tmp_path / "2.json"), "-q", "--workers", "2"])
    first = (tmp_path / "1.json").read_bytes()
    assert first == (tmp_path / "2.json").read_bytes() == dumps_coco(convert(root).coco)


def test_strict_exits_1_and_writes_nothing(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = dataset(tmp_path)
    out = tmp_path / "out.json"
    assert cli.main([str(root), "-o", str(out), "--strict"]) == 1
    assert not out.exists()
    assert "--strict: 1 skipped object; nothing written" in capsys.readouterr().err
    assert cli.main([str(root), "--split", "val", "-o", str(out), "--strict", "-q"]) == 0
    assert out.exists()


def test_quiet_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([str(dataset(tmp_path)), "-o", str(tmp_path / "o.json"), "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_options_reach_the_converter(tmp_path: Path) -> None:
    root = make_voc(tmp_path / "VOC", {"a.xml": voc_xml("a.jpg", objects=[
        obj("person", (1.5, 2, 10.5, 9), difficult=1)])}, {"a.jpg": (32, 24)})
    out = tmp_path / "o.json"
    assert cli.main([str(root), "-o", str(out), "-q", "--labels", "voc", "--coords", "raw",
                     "--difficult", "crowd", "--verify-images"]) == 0
    ann = json.loads(out.read_bytes())["annotations"][0]
    assert ann["bbox"] == [1.5, 2.0, 9.0, 7.0] and ann["iscrowd"] == 1
    assert ann["category_id"] == 15


def test_alternative_layout_without_root(tmp_path: Path) -> None:
    root = dataset(tmp_path)
    out = tmp_path / "o.json"
    assert cli.main(["--annotations", str(root / "Annotations"), "--images",
                     str(root / "JPEGImages"), "-o", str(out), "-q"]) == 0
    assert len(json.loads(out.read_bytes())["images"]) == 3


@pytest.mark.parametrize("args, message", [
    (["-o", "x.json"], "give VOC_ROOT or --annotations DIR"),
    (["ROOT", "--split", "a", "--split", "b", "-o", "x.json"], "one file cannot hold 2 splits"),
    (["ROOT", "--split", "a", "--all", "-o", "x"], "not allowed with argument"),
    (["ROOT", "-o", "x", "--workers", "0"], "must be at least 1"),
    (["ROOT", "-o", "x", "--coords", "pixel"], "invalid choice"),
])
def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             args: list[str], message: str) -> None:
    args = [str(dataset(tmp_path)) if a == "ROOT" else a for a in args]
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_dataset_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([str(dataset(tmp_path)), "--split", "test", "-o", str(tmp_path / "o")]) == 2
    assert "voc2coco: error: split 'test' not found" in capsys.readouterr().err


def test_interrupt_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    from converters import voc_plan

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C in the middle of the conversion (the output is open)

    monkeypatch.setattr(voc_plan, "assemble_split", interrupted)
    out = tmp_path / "out" / "o.json"
    assert cli.main([str(dataset(tmp_path)), "-o", str(out)]) == 130
    assert "voc2coco: interrupted; nothing written" in capsys.readouterr().err
    assert list(out.parent.iterdir()) == []  # no output, no temporary file


def test_help_states_the_conventions() -> None:
    text = cli.build_parser().format_help()
    for needle in ("x = xmin - 1", "w = xmax - xmin + 1", "--coords raw", "start at 1",
                   "XML file's stem", "iscrowd = 1", "labelmap.txt", "atomically"):
        assert needle in text, needle


def test_console_entry_point_end_to_end(realdata: Path, tmp_path: Path) -> None:
    out = tmp_path / "kangaroo.json"
    completed = subprocess.run(
        [sys.executable, "-m", "converters.cli", str(realdata / "kangaroo"), "-o", str(out),
         "--verify-images", "--strict"], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    assert "images:      12 converted, 0 skipped, of 12" in completed.stderr
    from pycocotools.coco import COCO

    assert len(COCO(str(out)).getAnnIds()) == 27


def test_a_split_that_converts_nothing_exits_1_and_writes_nothing(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38: the wrong --labels converted 0 of 576 objects and exited 0 with an empty
    dataset. A split with no image converted, or none of its objects, is now an error in one
    line, nothing written; --allow-empty writes it as before."""
    root = dataset(tmp_path)
    out = tmp_path / "out.json"
    assert cli.main([str(root), "-o", str(out), "--labels", str(_labels(tmp_path, "bird")), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["voc2coco: error: all XML files converted no object (0 of 3: 3 label not in the labels list); "
                   "nothing written (--allow-empty writes it)"]
    assert not out.exists()
    assert cli.main([str(root), "-o", str(out), "--labels", str(_labels(tmp_path, "bird")), "-q",
                     "--allow-empty"]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["annotations"] == []
    (root / "JPEGImages" / "b.jpg").unlink()
    folder = tmp_path / "coco"
    assert cli.main([str(root), "--split", "train", "--split", "val", "-o", str(folder), "-q"]) == 1
    assert capsys.readouterr().err.strip() == ("voc2coco: error: split val converted no image (0 of 1: 1 image "
                                                "file not found); nothing written (--allow-empty writes it)")
    assert not folder.exists() or not list(folder.iterdir())  # train is not written either
    negatives = make_voc(tmp_path / "negatives", {"n.xml": voc_xml("n.jpg")}, {"n.jpg": (32, 24)})
    assert cli.main([str(negatives), "-o", str(tmp_path / "n.json"), "-q"]) == 0  # no object at all: fine


def _labels(tmp_path: Path, *names: str) -> Path:
    path = tmp_path / "labels.txt"
    path.write_text("\n".join(names) + "\n", encoding="utf-8")
    return path
