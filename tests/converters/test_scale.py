"""voc2coco at scale: workers, streaming output, progress bar, bounded memory."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from converters import bench, cli
from converters import coco as coco_module
from converters.progress import Progress
from converters.voc2coco import convert, convert_splits, write_splits
from tests.converters.helpers import make_voc, obj, voc_xml


def mixed(tmp: Path, n: int = 30) -> Path:
    """A dataset with images, splits, a bad XML, a filename fallback that another id owns, and
    labels to discover (one only outside the splits)."""
    files = {f"{i:03d}.xml": voc_xml(f"{i:03d}.jpg", (32, 24), [
        obj("cat" if i % 3 else "dog", (1, 1, 5 + i % 20, 9)), obj("bird", (2, 2, 40, 30))])
        for i in range(n)}
    files["bad.xml"] = "<annotation>"
    files["zz.xml"] = voc_xml("001.jpg", (32, 24), [obj("cat", (1, 1, 3, 3))])  # 001's image
    files["only.xml"] = voc_xml("only.jpg", (32, 24), [obj("yak", (1, 1, 3, 3))])
    images = {f"{i:03d}.jpg": (32, 24) for i in range(n)} | {"only.jpg": (32, 24)}
    ids = [f"{i:03d}" for i in range(n)]
    return make_voc(tmp, files, images, splits={
        "train": ids[::2] + ["zz", "bad", "missing"], "val": ids[1::2]})


def test_workers_1_and_2_give_the_same_bytes_and_reports(tmp_path: Path) -> None:
    root = mixed(tmp_path)
    one = convert_splits(root, ["train", "val", None], workers=1)
    two = convert_splits(root, ["train", "val", None], workers=2)
    for split in ("train", "val", None):
        assert one[split].to_json() == two[split].to_json()
        assert one[split].report == two[split].report
    # zz.xml's <filename> is 001.jpg: 001 is in val, not train, so train gives it to zz
    assert one["train"].report.images_skipped == {"malformed XML": 1, "listed in split, no XML": 1}
    assert "001.jpg" in [i["file_name"] for i in one["train"].coco["images"]]
    assert one[None].report.images_skipped == {"image file belongs to another id": 1,
                                                "malformed XML": 1}
    names = [c["name"] for c in one["train"].coco["categories"]]
    assert names == ["bird", "cat", "dog", "yak"]  # "yak" is in no split: discovered anyway
    assert names == [c["name"] for c in one["val"].coco["categories"]]


def test_streamed_files_equal_the_in_memory_document(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = mixed(tmp_path / "voc")
    monkeypatch.setattr(coco_module._Spool, "BATCH", 3)  # annotations spooled to disk, in batches
    targets = {"train": tmp_path / "out" / "train.json", None: tmp_path / "out" / "all.json"}
    reports = write_splits(root, targets, workers=2)
    memory = convert_splits(root, ["train", None])
    for split, path in targets.items():
        assert path.read_bytes() == memory[split].to_json()
        assert reports[split] == memory[split].report
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["all.json", "train.json"]


def test_before_commit_false_writes_nothing(tmp_path: Path) -> None:
    root = mixed(tmp_path / "voc")
    out = tmp_path / "out"
    seen = []
    write_splits(root, {"train": out / "t.json"}, before_commit=lambda r: seen.append(r) or False)
    assert len(seen) == 1 and list(out.iterdir()) == []  # no output, no temporary file


def test_cli_workers_1_and_2_write_the_same_file(tmp_path: Path) -> None:
    root = mixed(tmp_path / "voc")
    for n in ("1", "2"):
        assert cli.main([str(root), "-o", str(tmp_path / f"w{n}.json"), "-q", "--workers", n]) == 0
    assert (tmp_path / "w1.json").read_bytes() == (tmp_path / "w2.json").read_bytes()


def test_plain_progress_bar_has_rate_and_eta() -> None:
    stream = io.StringIO()
    bar = Progress(5, True, stream=stream, use_tqdm=False)
    for _ in range(5):
        bar.update(1)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\r") and text.endswith("\n")
    last = text.rstrip("\n").rsplit("\r", 1)[-1]
    assert last.startswith("voc2coco: 100% 5/5 xml, ") and "xml/s, ETA 0:00:00" in last
    assert Progress(3, True, stream=stream, use_tqdm=False).line().endswith("ETA ?")
    silent = io.StringIO()
    off = Progress(5, False, stream=silent)
    off.update(5)
    off.close()
    assert silent.getvalue() == ""


def test_progress_without_tqdm_and_off_when_quiet_or_not_a_terminal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = make_voc(tmp_path / "voc", {f"{i}.xml": voc_xml(f"{i}.jpg") for i in range(4)})
    monkeypatch.setitem(sys.modules, "tqdm", None)  # not installed: the plain bar
    convert(root, progress=True)
    assert "voc2coco: 100% 4/4 xml" in capsys.readouterr().err
    monkeypatch.setattr("converters.voc_plan.PROGRESS_MIN_FILES", 1)  # large enough for a bar
    assert cli.main([str(root), "-o", str(tmp_path / "a.json")]) == 0  # stderr is no terminal
    assert "%" not in capsys.readouterr().err
    assert cli.main([str(root), "-o", str(tmp_path / "b.json"), "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_memory_does_not_grow_with_the_files_converted(tmp_path: Path) -> None:
    """Peak RSS of the command on N and 4N files: what grows per file is the folder listing
    (about 300 bytes a file at 100k files; up to 700 at this size, allocator granularity),
    not the converted records (about 650 bytes of JSON each). Holding the records, as the
    converter did before it streamed, costs 3.8 KB a file here."""
    small, large = 1500, 6000
    peaks = {}
    for n in (small, large):
        root = tmp_path / f"voc{n}"
        bench.generate_voc(root, n)
        peaks[n] = bench.peak_rss(root, tmp_path / f"{n}.json")
    size = (tmp_path / f"{large}.json").stat().st_size
    per_file = (peaks[large] - peaks[small]) / (large - small)
    assert size / large > 500  # about 650 bytes of JSON a file: holding it would show
    assert per_file < 1500, f"{per_file:.0f} bytes per file ({peaks})"


def test_workers_from_a_script_without_main_guard_after_threads_ran(tmp_path: Path) -> None:
    """``convert(..., workers=2)`` from ``python -c`` (no script for a spawned worker to import,
    no main guard), in a process where other threads have run: the workers neither re-run the
    caller nor inherit its threads' locks; the bytes are those of ``workers=1``."""
    import subprocess
    import textwrap

    root = mixed(tmp_path / "voc")
    code = textwrap.dedent(f"""
        import threading
        from converters.voc2coco import convert
        threads = [threading.Thread(target=sum, args=(range(10**5),)) for _ in range(4)]
        [t.start() for t in threads]
        print(len(convert({str(root)!r}, workers=2).to_json()))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.strip()) == len(convert(root, workers=1).to_json())
