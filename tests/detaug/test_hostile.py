"""Hostile inputs (issue 39): datasets from strangers. Each case asserts a named error, a counted
repair or a documented limit, and that nothing outside the dataset's folder is opened (a Python
audit hook watches every ``open``). Paths, JSON, XML, YAML, images, shards and caches."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import detaug.transforms as T
from detaug.errors import DatasetError, DataWarning, RecipeError
from detaug.formats import images as I
from detaug.formats import validation as v
from detaug.formats.columnar import cache_folder, load_coco_columns
from detaug.shards import ShardSource, iter_webdataset, rebuild_manifest, source_of, write_shards
from detaug.sources import CocoSource
from detaug.torch import DetectionLoader
from detaug.transforms import Compose

# -- watching opens --------------------------------------------------------------------------------

_OPENED: list[str] = []
_WATCHING: list[bool] = []  # not empty inside an Opens block (the hook stays for the session: records nothing else)


def _audit(event: str, args: tuple) -> None:
    if _WATCHING and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


class Opens:
    """The files opened (by Python) inside the ``with`` block."""

    def __enter__(self) -> list[str]:
        _OPENED.clear()
        _WATCHING.append(True)
        self.seen: list[str] = []
        return self.seen

    def __exit__(self, *exc: object) -> None:
        _WATCHING.pop()
        self.seen.extend(_OPENED)
        _OPENED.clear()


def assert_nothing_outside(opened: list[str], root: Path, outside: Path) -> None:
    root = str(root.resolve())
    for p in opened:
        if not p or p.startswith(("/proc", "/sys", "/dev", sys.prefix, sys.base_prefix)) or "site-packages" in p:
            continue
        assert not os.path.realpath(p).startswith(str(outside.resolve())), f"opened {p} outside {root}"


@pytest.fixture(autouse=True)
def _secret(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DETAUG_CACHE_SECRET", str(tmp_path_factory.getbasetemp() / "cache-secret"))
    monkeypatch.delenv("DETAUG_CACHE_DIR", raising=False)


def jpeg(path: Path, size: tuple[int, int] = (20, 30)) -> Path:
    Image.new("RGB", (size[1], size[0]), (200, 30, 30)).save(path, "JPEG")
    return path


def coco(names: list[str], **extra) -> dict:
    doc = {"images": [{"id": k + 1, "file_name": n, "width": 30, "height": 20} for k, n in enumerate(names)],
           "annotations": [{"id": k + 1, "image_id": k + 1, "category_id": 1, "bbox": [2, 2, 10, 10]}
                           for k in range(len(names))],
           "categories": [{"id": 1, "name": "thing"}]}
    doc.update(extra)
    return doc


@pytest.fixture
def world(tmp_path):
    """``root/`` (a dataset: ``images/a.jpg``, ``ann.json``) and ``outside/`` beside it, holding
    files detaug must never open: ``outside.jpg``, ``secret.txt``, ``outside.tar``."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "images" / "sub").mkdir(parents=True)
    outside.mkdir()
    jpeg(root / "images" / "a.jpg")
    jpeg(outside / "outside.jpg")
    (outside / "secret.txt").write_text("the secret text\n")
    (outside / "outside.tar").write_bytes(b"\0" * 4096)
    return root, outside


# -- 1. paths a COCO file names --------------------------------------------------------------------

OUTSIDE_NAMES = [
    "../../outside/outside.jpg", "../outside/outside.jpg", "../../../../../../../../tmp/outside.jpg",
    "/etc/passwd", "/tmp/outside.jpg", "//etc/passwd", "/", "..", "../", "./..", "./../x.jpg",
    "a/../../x.jpg", "sub/../../x.jpg", "sub/./../../x.jpg", "sub//..//..//x.jpg", "./sub/../../../x",
    "../images/a.jpg", "../root/images/a.jpg", "a.jpg/../../..", "x\0.jpg", "a.jpg\0../../etc/passwd",
    "\0", "/" + "a" * 300, "../" * 50 + "etc/passwd", "sub/" * 20 + "../" * 21 + "x.jpg",
]
INSIDE_NAMES = [
    "a.jpg", "./a.jpg", "sub/../a.jpg", "sub/./../a.jpg", "..a.jpg", "a..jpg", "...", ".../a.jpg",
    "..\\x.jpg", "sub\\..\\..\\x.jpg", "C:/x.jpg", "~/x.jpg", "$HOME/x.jpg", "a" * 300 + ".jpg",
    "sub/" * 30 + "../" * 30 + "a.jpg", "é/ü.jpg", " a.jpg", "a.jpg ", "file:///etc/passwd",
]


@pytest.mark.parametrize("cache", [False, True], ids=["parsed", "cached"])
@pytest.mark.parametrize("name", OUTSIDE_NAMES)
def test_a_file_name_outside_the_images_folder_is_an_error(world, name, cache):
    root, outside = world
    (root / "ann.json").write_text(json.dumps(coco(["a.jpg", name])))
    with Opens() as opened, pytest.raises(DatasetError) as info:
        CocoSource(root / "ann.json", root / "images", cache=cache)
    text = str(info.value)
    assert str(root / "ann.json") in text and "image_id 2" in text and v.PATH_OUTSIDE in text
    assert repr(name)[:40].strip("'\"")[:20] in text  # names the path
    assert_nothing_outside(opened, root, outside)


@pytest.mark.parametrize("name", INSIDE_NAMES)
def test_names_that_stay_inside_are_taken(world, name):
    root, _ = world
    (root / "ann.json").write_text(json.dumps(coco([name])))
    source = CocoSource(root / "ann.json", root / "images")
    assert source.file_of(0) == str(root / "images" / name)
    assert v.path_problem(name) is None


@pytest.mark.parametrize("name", ["../../outside/outside.jpg", "/OUT/outside.jpg"])
def test_allow_paths_outside_takes_them(world, name):
    root, outside = world
    name = name.replace("/OUT", str(outside))
    (root / "ann.json").write_text(json.dumps(coco(["a.jpg", name])))
    for cache in (False, True):
        source = CocoSource(root / "ann.json", root / "images", cache=cache, allow_paths_outside=True)
        with Opens() as opened:
            assert source.load(1)[0].size == (outside / "outside.jpg").stat().st_size
        with pytest.raises(AssertionError, match="outside"):  # the watch sees it: the other cases' checks can fail
            assert_nothing_outside(opened, root, outside)
    with pytest.raises(DatasetError, match="image_id 2"):  # the cache built with it does not open without it
        CocoSource(root / "ann.json", root / "images", cache=True)


def test_a_symlink_inside_the_root_is_followed(world):
    root, outside = world
    (root / "images" / "link.jpg").symlink_to(outside / "outside.jpg")
    (root / "ann.json").write_text(json.dumps(coco(["a.jpg", "link.jpg"])))
    source = CocoSource(root / "ann.json", root / "images")
    assert source.load(1)[0].size == (outside / "outside.jpg").stat().st_size  # documented: followed


def test_detaug_shards_copies_no_outside_file(world, tmp_path):
    root, outside = world
    (root / "ann.json").write_text(json.dumps(coco(["a.jpg", "../../outside/secret.txt"])))
    with Opens() as opened, pytest.raises(DatasetError, match="secret.txt"):
        write_shards(source_of(str(root / "ann.json"), images=str(root / "images")), tmp_path / "out", progress=False)
    assert_nothing_outside(opened, root, outside)
    assert not list((tmp_path).glob("out/*.tar"))
    summary = write_shards(source_of(str(root / "ann.json"), images=str(root / "images"), allow_paths_outside=True),
                           tmp_path / "out", progress=False)
    assert summary.samples == 1 and "secret.txt" in summary.skipped[0]["file"]  # not an image: never copied
    assert b"the secret text" not in b"".join(p.read_bytes() for p in (tmp_path / "out").glob("*.tar"))


def test_the_cli_flag_exists(world, tmp_path):
    from detaug.cli import main

    root, _ = world
    (root / "ann.json").write_text(json.dumps(coco(["a.jpg", "../../outside/outside.jpg"])))
    assert main(["shards", str(root / "ann.json"), str(tmp_path / "o"), "--images", str(root / "images"),
                 "--quiet", "--allow-paths-outside"]) == 0
    assert ShardSource(tmp_path / "o").report.images == 2
    assert main(["shards", str(root / "ann.json"), str(tmp_path / "p"), "--images", str(root / "images"),
                 "--quiet"]) != 0


def test_bench_data_refuses_outside_names_unless_allowed(world, tmp_path):
    from detaug.bench.dataset import prepare_dataset
    from detaug.bench.runner import build_parser

    root, outside = world
    jpeg(root / "images" / "a.jpg", (80, 80))  # the bench keeps images of 64 px a side or more
    jpeg(outside / "outside.jpg", (80, 80))
    doc = coco(["a.jpg", "../../outside/outside.jpg"])
    for image in doc["images"]:
        image["width"] = image["height"] = 80
    (root / "ann.json").write_text(json.dumps(doc))
    with Opens() as opened, pytest.raises(DatasetError, match="outside.jpg"):
        prepare_dataset(root / "ann.json", images_dir=root / "images", work_dir=tmp_path / "w", progress=False)
    assert_nothing_outside(opened, root, outside)
    dataset = prepare_dataset(root / "ann.json", images_dir=root / "images", work_dir=tmp_path / "w",
                              progress=False, allow_paths_outside=True)
    assert dataset.num_images == 2
    args = build_parser().parse_args(["--data", str(root / "ann.json"), "--allow-paths-outside"])
    assert args.allow_paths_outside is True


def test_bench_train_refuses_outside_names_unless_allowed(world):
    from detaug.bench.session import run_bench

    root, outside = world
    jpeg(root / "images" / "a.jpg", (80, 80))
    jpeg(outside / "outside.jpg", (80, 80))
    doc = coco(["a.jpg", "../../outside/outside.jpg"])
    for image in doc["images"]:
        image["width"] = image["height"] = 80
    (root / "ann.json").write_text(json.dumps(doc))
    run = dict(data=root / "ann.json", images_dir=root / "images", device="cpu", train=True, only=["ceiling"],
               batch_sizes=[2], warmup=1, steps=1, progress=False, log=lambda msg: None)
    with pytest.raises(DatasetError, match="outside.jpg"):
        run_bench(**run)
    report = run_bench(**run, allow_paths_outside=True)
    assert report.dataset.num_images == 2  # the outside image too
    assert [(r.row.name, r.status) for r in report.results] == [("ceiling", "ok")]


def test_a_million_names_are_checked_at_once():
    names = [f"train/{k:07d}.jpg" for k in range(1_000_000)]
    assert v.outside_paths(names) == []  # one search of the joined names
    for k, bad in ((123456, "../x.jpg"), (0, "/x.jpg"), (999_999, "a\0b"), (5, "sub/../../x")):
        names[k] = bad
    assert v.outside_paths(names) == [0, 5, 123456, 999_999]
    names[0] = "a\n/b"  # a newline before "/" inside a name: looked at closer, and inside
    assert v.outside_paths(names) == [5, 123456, 999_999]


# -- 2. shard folders ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    (base / "images").mkdir()
    names = []
    for k in range(4):
        jpeg(base / "images" / f"{k}.jpg")
        names.append(f"{k}.jpg")
    (base / "ann.json").write_text(json.dumps(coco(names)))
    write_shards(CocoSource(base / "ann.json", base / "images"), base / "out", progress=False, shard_size="1GB")
    return base / "out"


@pytest.fixture
def shards(shard_folder, tmp_path):
    out = tmp_path / "shards"
    shutil.copytree(shard_folder, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(out / "shard-000000.tar", outside / "outside.tar")
    shutil.copy(out / "shard-000000.idx", outside / "outside.idx")
    return out, outside


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


BAD_TAR_NAMES = ["../outside/outside.tar", "../../outside/outside.tar", "/etc/passwd", "OUT/outside.tar",
                 "sub/../../outside/outside.tar", "./../outside/outside.tar", "shard\0.tar", ".."]


@pytest.mark.parametrize("name", BAD_TAR_NAMES)
@pytest.mark.parametrize("where", ["meta", "dataset", "both", "index"])
def test_a_shard_folder_names_no_file_outside(shards, name, where):
    out, outside = shards
    name = name.replace("OUT", str(outside))

    def set_dataset(d):
        d["shards"][0]["index" if where == "index" else "tar"] = name

    if where in ("meta", "both"):
        _edit_json(out / "manifest" / "meta.json", lambda m: m.__setitem__("shards", [name]))
    if where in ("dataset", "both", "index"):
        _edit_json(out / "dataset.json", set_dataset)
    with Opens() as opened, pytest.raises(DatasetError) as info:
        ShardSource(out)
    assert "meta.json" in str(info.value) or "dataset.json" in str(info.value)
    assert_nothing_outside(opened, out, outside)
    if where != "meta":
        with pytest.raises(DatasetError):
            list(iter_webdataset(out))
        shutil.rmtree(out / "manifest")
        with Opens() as opened, pytest.raises(DatasetError, match="dataset.json"):
            ShardSource(out)
        assert_nothing_outside(opened, out, outside)


def test_allow_paths_outside_reads_an_outside_tar(shards):
    out, outside = shards
    _edit_json(out / "manifest" / "meta.json", lambda m: m.__setitem__("shards", ["../outside/outside.tar"]))
    _edit_json(out / "dataset.json", lambda d: d["shards"][0].__setitem__("tar", "../outside/outside.tar"))
    source = ShardSource(out, allow_paths_outside=True)
    assert source.load(0)[0].size > 0


def _edit_array(out: Path, name: str, edit) -> None:
    path = out / "manifest" / f"{name}.npy"
    array = np.load(path).copy()
    array = edit(array)
    np.save(path, array)


MANIFEST_ERRORS = {
    "nan box": ("boxes", lambda a: _set(a, (0, 0), np.nan), v.NON_FINITE),
    "inf box": ("boxes", lambda a: _set(a, (1, 2), np.inf), v.NON_FINITE),
    "label 999": ("labels", lambda a: _set(a, 0, 999), v.UNKNOWN_CATEGORY),
    "label -5": ("labels", lambda a: _set(a, 1, -5), v.NEGATIVE_LABEL),
    "duplicate id": ("image_ids", lambda a: _set(a, 1, a[0]), v.DUPLICATE_IMAGE_ID),
    "negative size": ("sizes", lambda a: _set(a, (0, 0), -3), v.BAD_SIZE),
    "half size": ("sizes", lambda a: _set(a, (0, 1), 0), v.BAD_SIZE),
}
MANIFEST_STRUCTURE = {
    "box_starts backwards": ("box_starts", lambda a: _set(a, 1, 3)),
    "box_starts too long": ("box_starts", lambda a: np.append(a, a[-1])),
    "box_starts past the boxes": ("box_starts", lambda a: _set(a, -1, 99)),
    "labels short": ("labels", lambda a: a[:-1]),
    "boxes 1-D": ("boxes", lambda a: a.reshape(-1)),
    "boxes as ints": ("boxes", lambda a: a.astype(np.int64)),
    "ids as floats": ("image_ids", lambda a: a.astype(np.float64)),
    "offset past the tar": ("offsets", lambda a: _set(a, 0, 10**12)),
    "negative offset": ("offsets", lambda a: _set(a, 1, -1)),
    "negative length": ("lengths", lambda a: _set(a, 2, -10)),
    "length past the tar": ("lengths", lambda a: _set(a, 3, 10**12)),
    "unknown extension": ("exts", lambda a: _set(a, 0, 7)),
    "offsets short": ("offsets", lambda a: a[:-1]),
}


def _set(a, index, value):
    a[index] = value
    return a


@pytest.mark.parametrize("case", list(MANIFEST_ERRORS))
def test_manifest_values_are_checked(shards, case):
    out, _ = shards
    name, edit, reason = MANIFEST_ERRORS[case]
    _edit_array(out, name, edit)
    with pytest.raises(DatasetError) as info:
        ShardSource(out)
    assert reason in str(info.value) and str(out) in str(info.value) and "image_id" in str(info.value)


@pytest.mark.parametrize("case", list(MANIFEST_STRUCTURE))
def test_manifest_structure_is_checked(shards, case):
    out, _ = shards
    name, edit = MANIFEST_STRUCTURE[case]
    _edit_array(out, name, edit)
    with pytest.raises(DatasetError, match=str(out)):
        ShardSource(out)


@pytest.mark.parametrize("box, reason, kept", [
    ([5, 5, 2, 9], v.EMPTY_BOX, 0),          # inverted
    ([5, 5, 5, 9], v.EMPTY_BOX, 0),          # zero width
    ([0, 0, 1e30, 1e30], v.BOX_CLIPPED, 1),  # the 1e30 box: clipped, counted
    ([-5, -5, 10, 10], v.BOX_CLIPPED, 1),
    ([100, 100, 200, 200], v.BOX_OUTSIDE, 0),
])
def test_manifest_boxes_are_repaired_and_counted(shards, box, reason, kept):
    out, _ = shards
    _edit_array(out, "boxes", lambda a: _set(a, 0, box))
    with pytest.warns(DataWarning, match=reason):
        source = ShardSource(out)
    assert source.report.counts[reason] == 1 and source.report.repairs == {reason: 1}
    boxes = source.load(0)[1]
    assert len(boxes) == kept and (boxes[:, 2:] <= [30, 20]).all() and np.isfinite(boxes).all()
    assert len(source.samples[0].labels) == kept


def test_a_repaired_manifest_is_the_same_in_a_worker(shards):
    import pickle

    out, _ = shards
    _edit_array(out, "boxes", lambda a: _set(a, 1, [-5, -5, 1e30, 10]))
    with pytest.warns(DataWarning, match="clipped"):
        source = ShardSource(out)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # said once, by the process that built it
        again = pickle.loads(pickle.dumps(source))
    assert again.load(1)[1].tolist() == source.load(1)[1].tolist() == [[0, 0, 30, 10]]


@pytest.mark.parametrize("text", ["", "[", "{}", "[]", '{"shards": 5}', "null", '{"version": 1}', "\xff"])
def test_a_broken_dataset_json_is_a_dataset_error(shards, text):
    out, _ = shards
    (out / "dataset.json").write_text(text, errors="surrogateescape") if text != "\xff" else (
        out / "dataset.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DatasetError, match="dataset.json|manifest"):
        ShardSource(out)


DATASET_EDITS = {
    "key_width huge": lambda d: d.__setitem__("key_width", 10**9),
    "key_width zero": lambda d: d.__setitem__("key_width", 0),
    "bytes not a number": lambda d: d["shards"][0].__setitem__("bytes", "many"),
    "shards not a list": lambda d: d.__setitem__("shards", 5),
    "shard not an object": lambda d: d.__setitem__("shards", [5]),
    "categories not pairs": lambda d: d.__setitem__("categories", [5]),
    "extensions missing": lambda d: d.pop("extensions"),
    "fields of objects": lambda d: d.__setitem__("fields", [["iscrowd", "|O", []], ["area", "<f4", []]]),
    "orientation unknown": lambda d: d.__setitem__("orientation", "sideways"),
    "another tar list": lambda d: d["shards"].append(dict(d["shards"][0])),
}


@pytest.mark.parametrize("case", list(DATASET_EDITS))
def test_a_tampered_dataset_json_is_a_dataset_error(shards, case):
    out, _ = shards
    _edit_json(out / "dataset.json", DATASET_EDITS[case])
    with pytest.raises((DatasetError, ValueError)) as info:
        ShardSource(out)
    assert str(out) in str(info.value) or case == "orientation unknown"


@pytest.mark.parametrize("text", ['{"version": 1}', '{"version": 9, "shards": []}', "[1]"])
def test_a_broken_manifest_meta_is_a_dataset_error(shards, text):
    out, _ = shards
    (out / "manifest" / "meta.json").write_text(text)
    with pytest.raises(DatasetError, match="manifest"):
        ShardSource(out)


@pytest.mark.parametrize("where", ["manifest/meta.json", "dataset.json", "manifest/boxes.npy", "shard-000000.idx",
                                   "fifo:manifest/labels.npy", "fifo:dataset.json", "fifo:shard-000000.idx"])
def test_a_device_or_pipe_planted_in_a_shard_folder_is_refused(shards, where):
    out, _ = shards
    fifo = where.startswith("fifo:")
    path = out / where.removeprefix("fifo:")
    path.unlink()
    if fifo:
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    if where.endswith(".idx"):
        shutil.rmtree(out / "manifest")
    if where == "manifest/meta.json":  # no manifest there: rebuilt from the tars
        assert len(ShardSource(out)) == 4
        return
    with pytest.raises(DatasetError, match="regular file"):
        ShardSource(out)


@pytest.mark.parametrize("name", ["meta.json", "boxes.npy", "fifo:boxes.npy", "fifo:meta.json"])
def test_a_device_or_pipe_planted_in_a_cache_is_rebuilt(tmp_path, name):
    path = _dataset(tmp_path)
    _quiet_load(path)
    target = cache_folder(path) / name.removeprefix("fifo:")
    target.unlink()
    if name.startswith("fifo:"):
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    columns, said = _quiet_load(path)
    assert any("rebuilt" in m for m in said) and len(columns) == 3


def test_a_rebuilt_manifest_is_checked_too(shards):
    out, _ = shards
    shutil.rmtree(out / "manifest")
    rebuild_manifest(out)
    assert len(ShardSource(out)) == 4


INDEX_TAMPERING = {
    "not an index": lambda text: "hello\n",
    "empty": lambda text: "",
    "offset not a number": lambda text: text.replace(" ", " x", 2),
    "negative offset": lambda text: _field(text, 1, "-5"),
    "offset past the tar": lambda text: _field(text, 1, str(10**9)),
    "count too large": lambda text: text.replace(text.split()[1], "99", 1),
    "a missing field": lambda text: text.replace(text.splitlines()[1], " ".join(text.splitlines()[1].split()[:-1])),
}


def _field(text: str, k: int, value: str) -> str:
    lines = text.splitlines()
    parts = lines[1].split()
    parts[k] = value
    lines[1] = " ".join(parts)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", list(INDEX_TAMPERING))
def test_a_tampered_index_is_named_when_the_manifest_is_rebuilt(shards, case):
    out, _ = shards
    index = out / "shard-000000.idx"
    index.write_text(INDEX_TAMPERING[case](index.read_text()))
    shutil.rmtree(out / "manifest")
    with pytest.raises(DatasetError) as info:
        ShardSource(out)
    assert "shard-000000" in str(info.value)


@pytest.mark.parametrize("record", [b"nonsense", b"[1, 2]", b'{"boxes": 5}', b'{"image_id": "x", "boxes": [], "labels": []}',
                                    b'{"image_id": 1, "boxes": [[1, 2, 3, 4]], "labels": []}',
                                    b'{"image_id": 1, "boxes": [[NaN, 2, 3, 4]], "labels": [1]}',
                                    b'{"image_id": 1, "boxes": [[1, 2, 3, 4]], "labels": [999]}'])
def test_a_tampered_sample_record_is_named_when_the_manifest_is_rebuilt(shards, record):
    out, _ = shards
    tar = out / "shard-000000.tar"
    from detaug.shards import read_index

    offset, size, member = read_index(out / "shard-000000.idx")[0]["json"]
    data = bytearray(tar.read_bytes())
    data[offset:offset + size] = record.ljust(size)[:size]
    tar.write_bytes(bytes(data))
    shutil.rmtree(out / "manifest")
    with pytest.raises(DatasetError) as info:
        ShardSource(out)
    assert str(out) in str(info.value)


# -- 3. caches that cannot lie ---------------------------------------------------------------------

def _dataset(tmp_path: Path, n: int = 3) -> Path:
    (tmp_path / "images").mkdir(parents=True, exist_ok=True)
    for k in range(n):
        jpeg(tmp_path / "images" / f"{k}.jpg")
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(coco([f"{k}.jpg" for k in range(n)])))
    return path


def _quiet_load(path: Path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        columns = load_coco_columns(path, **kw)
    return columns, [str(w.message) for w in caught if issubclass(w.category, DataWarning)]


def test_the_cache_is_used_when_it_is_this_files(tmp_path):
    path = _dataset(tmp_path)
    first, said = _quiet_load(path)
    assert said == [] and first.parsed_by == "cache"  # built, then opened
    key = (cache_folder(path) / "meta.json").stat().st_mtime_ns
    second, said = _quiet_load(path)
    assert said == [] and second.parsed_by == "cache"
    assert (cache_folder(path) / "meta.json").stat().st_mtime_ns == key  # not written again


def test_a_planted_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch):
    """A cache shipped beside the JSON, made by someone else (their secret), lying: NaN boxes,
    label -5, a file outside the images folder."""
    path = _dataset(tmp_path)
    monkeypatch.setenv("DETAUG_CACHE_SECRET", str(tmp_path / "their-secret"))
    _quiet_load(path)
    folder = cache_folder(path)
    np.save(folder / "boxes.npy", np.full((3, 4), np.nan, np.float32))
    np.save(folder / "labels.npy", np.full(3, -5, np.int32))
    shipped = tmp_path / "shipped"
    shutil.copytree(tmp_path, shipped, ignore=shutil.ignore_patterns("shipped", "their-secret"))
    monkeypatch.setenv("DETAUG_CACHE_SECRET", str(tmp_path / "my-secret"))
    columns, said = _quiet_load(shipped / "ann.json")
    assert columns.parsed_by == "cache" and any("not provably" in m and "rebuilt" in m for m in said)
    assert np.isfinite(columns.table.boxes).all() and (np.asarray(columns.table.labels) == 1).all()


@pytest.mark.parametrize("tamper", ["nan boxes", "label -5", "other boxes", "names", "meta image count",
                                    "meta max boxes", "meta categories", "meta keys", "delete an array",
                                    "extra array"])
def test_a_tampered_cache_is_rebuilt(tmp_path, tamper):
    path = _dataset(tmp_path)
    _quiet_load(path)
    folder = cache_folder(path)
    if tamper == "nan boxes":
        np.save(folder / "boxes.npy", np.full((3, 4), np.nan, np.float32))
    elif tamper == "label -5":
        np.save(folder / "labels.npy", np.full(3, -5, np.int32))
    elif tamper == "other boxes":
        np.save(folder / "boxes.npy", np.full((3, 4), [1, 1, 3, 3], np.float32))  # valid, but not what was built
    elif tamper == "names":
        blob = b"../../../etc/passwd" * 3
        np.save(folder / "names.npy", np.frombuffer(blob, np.uint8))
    elif tamper == "delete an array":
        (folder / "exif.npy").unlink()
    elif tamper == "extra array":
        np.save(folder / "zzz.npy", np.zeros(3))
    else:
        meta = json.loads((folder / "meta.json").read_text())
        if tamper == "meta image count":
            meta["report"]["images"] = 99
        if tamper == "meta max boxes":
            meta["max_boxes"] = 0
        if tamper == "meta categories":
            meta["categories"] = [[1, "thing"], [2, "other"]]
        meta["trusted"] = [[[0, 0, 0, 0, 0], []]] if tamper == "meta keys" else meta["trusted"]
        (folder / "meta.json").write_text(json.dumps(meta))
    columns, said = _quiet_load(path)
    if tamper == "meta keys":  # only the keys changed: renewed from the signed hashes, no rebuild
        assert said == [] and columns.parsed_by == "cache"
        return
    assert any("rebuilt" in m for m in said)
    assert columns.report.images == 3 and columns.table.max_boxes() == 1 and columns.categories == {1: "thing"}
    assert np.isfinite(columns.table.boxes).all() and columns.file_name(0) == "0.jpg"
    assert len(columns) == 3 and (np.asarray(columns.table.labels) == 1).all()
    assert (np.asarray(columns.table.boxes) == [2, 2, 12, 12]).all()


def test_an_edit_that_keeps_size_and_mtime_is_seen(tmp_path):
    path = _dataset(tmp_path)
    first, _ = _quiet_load(path)
    stat = path.stat()
    text = path.read_text().replace('"thing"', '"other"')  # same size
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # touch -r
    assert path.stat().st_size == stat.st_size
    columns, said = _quiet_load(path)
    assert columns.categories == {1: "other"} and any("changed" in m for m in said)


def test_an_edit_in_the_middle_of_a_large_file_is_seen(tmp_path):
    path = _dataset(tmp_path, 1)
    doc = coco(["0.jpg"], info={"pad": "x" * (5 << 20)})
    path.write_text(json.dumps(doc))
    _quiet_load(path)
    stat = path.stat()
    data = bytearray(path.read_bytes())
    middle = data.index(b"xxxx", 3 << 20)
    data[middle:middle + 1] = b"y"
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    _, said = _quiet_load(path)
    assert any("changed" in m for m in said)


def test_a_copied_dataset_keeps_its_cache(tmp_path):
    """Copying (new inodes) is not an edit: the signed hash matches, the arrays pass, the keys
    are renewed without a rebuild."""
    path = _dataset(tmp_path / "a")
    _quiet_load(path)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    columns, said = _quiet_load(tmp_path / "b" / "ann.json")
    assert said == [] and columns.parsed_by == "cache"
    again, said = _quiet_load(tmp_path / "b" / "ann.json")
    assert said == [] and again.parsed_by == "cache"


def _build_in_a_process(path: str, barrier, parsed) -> None:
    import detaug.formats.coco_cache as coco_cache
    import detaug.formats.coco_stream as coco_stream

    real = coco_stream._stream  # the streaming parse, in memory or into the cache being built

    def counting(*args, **kwargs):
        with parsed.get_lock():
            parsed.value += 1
        return real(*args, **kwargs)

    coco_stream._stream = counting  # read by the cache build when it runs
    barrier.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(coco_cache.load_coco_columns(path)) == 3


def test_ranks_starting_together_build_the_cache_once(tmp_path):
    import multiprocessing

    path = _dataset(tmp_path)
    ctx = multiprocessing.get_context("fork")
    barrier, parsed = ctx.Barrier(4), ctx.Value("i", 0)
    ranks = [ctx.Process(target=_build_in_a_process, args=(str(path), barrier, parsed)) for _ in range(4)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(60)
    assert [p.exitcode for p in ranks] == [0] * 4
    assert parsed.value == 1  # the others waited on the lock, then opened the cache


@pytest.mark.parametrize("meta", ["", "[", "[]", "null", '{"version": 3}', '{"version": 2}', '{"version": "3"}',
                                  '{"version": 3, "key": "x", "mac": 5}', '{"version": 3, "sha256": [], "mac": "x"}'])
def test_a_broken_cache_meta_is_rebuilt(tmp_path, meta):
    path = _dataset(tmp_path)
    _quiet_load(path)
    (cache_folder(path) / "meta.json").write_text(meta)
    columns, said = _quiet_load(path)
    assert said and len(columns) == 3 and columns.parsed_by == "cache"


# -- 4. malformed COCO files -----------------------------------------------------------------------

BAD_JSON = {
    "empty": "", "blank": "   ", "not json": "hello", "cut": '{"images": [', "list": "[]", "number": "5",
    "string": '"x"', "null": "null", "images not list": '{"images": 5}', "images missing": '{"annotations": []}',
    "deep list": '{"images": ' + "[" * 100000 + "]" * 100000 + "}",
    "deep object": '{"images": [], "info": ' + '{"a":' * 100000 + "1" + "}" * 100000 + "}",
    "NaN box": None, "Infinity box": None, "huge int id": None, "string id": None, "bool id": None,
    "duplicate id": None, "duplicate file": None, "label -5": None, "label 999": None, "label 2**40": None,
    "unknown image": None, "bbox of 3": None, "bbox strings": None, "bbox null": None, "no categories": None,
    "zero size": None, "negative size": None, "exif 9": None, "file_name number": None, "file_name empty": None,
    "utf-16 garbage": None, "nul bytes": "\0" * 100, "trailing data": '{"images": []} x',
    "huge integer": '{"images": [{"id": ' + "9" * 5000 + ', "file_name": "a.jpg"}]}',
}


def _bad_doc(case: str) -> str:
    text = BAD_JSON[case]
    if text is not None:
        return text
    doc = coco(["a.jpg", "b.jpg"])
    im, ann = doc["images"], doc["annotations"]
    if case == "NaN box":
        return json.dumps(doc).replace("[2, 2, 10, 10]", "[NaN, 2, 10, 10]", 1)
    if case == "Infinity box":
        return json.dumps(doc).replace("[2, 2, 10, 10]", "[2, 2, Infinity, 10]", 1)
    edits = {
        "huge int id": lambda: im[0].__setitem__("id", 2**70),
        "string id": lambda: im[0].__setitem__("id", "1"),
        "bool id": lambda: im[0].__setitem__("id", True),
        "duplicate id": lambda: im[1].__setitem__("id", 1),
        "duplicate file": lambda: im[1].__setitem__("file_name", "./a.jpg"),
        "label -5": lambda: ann[0].__setitem__("category_id", -5),
        "label 999": lambda: ann[0].__setitem__("category_id", 999),
        "label 2**40": lambda: ann[0].__setitem__("category_id", 2**40),
        "unknown image": lambda: ann[0].__setitem__("image_id", 77),
        "bbox of 3": lambda: ann[0].__setitem__("bbox", [1, 2, 3]),
        "bbox strings": lambda: ann[0].__setitem__("bbox", ["1", "2", "3", "4"]),
        "bbox null": lambda: ann[0].__setitem__("bbox", None),
        "no categories": lambda: doc.pop("categories"),
        "zero size": lambda: im[0].__setitem__("width", 0),
        "negative size": lambda: im[0].__setitem__("height", -20),
        "exif 9": lambda: im[0].__setitem__("exif_orientation", 9),
        "file_name number": lambda: im[0].__setitem__("file_name", 5),
        "file_name empty": lambda: im[0].__setitem__("file_name", ""),
    }
    if case == "utf-16 garbage":
        return "\ud800"  # written with surrogateescape below: not UTF-8
    edits[case]()
    return json.dumps(doc)


@pytest.mark.parametrize("cache", [False, True], ids=["parsed", "cached"])
@pytest.mark.parametrize("case", list(BAD_JSON))
def test_a_malformed_coco_file_is_a_dataset_error_naming_it(world, case, cache):
    root, outside = world
    path = root / "ann.json"
    text = _bad_doc(case)
    if case == "utf-16 garbage":
        path.write_bytes(b"\xff\xfe\xd8\x00\x00\xdc")
    else:
        path.write_text(text)
    with Opens() as opened, pytest.raises(DatasetError) as info:
        CocoSource(path, root / "images", cache=cache)
    assert str(path) in str(info.value)
    assert_nothing_outside(opened, root, outside)


# -- 5. recipe files (YAML, JSON) ------------------------------------------------------------------

def _alias_bomb(levels: int = 7, width: int = 9) -> str:
    lines = ["l0: &l0 {name: RandomHorizontalFlip}"]
    for k in range(1, levels + 1):
        lines.append(f"l{k}: &l{k} {{name: RandomOrder, transforms: [" + ", ".join([f"*l{k - 1}"] * width) + "]}")
    return "\n".join(lines) + f"\ntransforms: [*l{levels}]\n"


BAD_RECIPES = {
    "alias bomb 7": ("yaml", _alias_bomb(7)), "alias bomb 9": ("yaml", _alias_bomb(9)),
    "alias bomb wide": ("yaml", _alias_bomb(3, 60)),
    "recursive alias": ("yaml", "a: &a [*a]\n"),
    "python object": ("yaml", "transforms:\n  - !!python/object/apply:os.system ['echo pwned']\n"),
    "python name": ("yaml", "transforms: !!python/name:os.system\n"),
    "python module": ("yaml", "x: !!python/module:os\n"),
    "python tuple": ("yaml", "transforms: !!python/tuple [1, 2]\n"),
    "python new": ("yaml", "x: !!python/object/new:os.system [ls]\n"),
    "custom tag": ("yaml", "transforms: !mything [1]\n"),
    "binary": ("yaml", "transforms: !!binary aGVsbG8=\n"),
    "syntax": ("yaml", "transforms: [\n"),
    "tab": ("yaml", "transforms:\n\t- x\n"),
    "bad indent": ("yaml", "a:\n  b: 1\n c: 2\n"),
    "deep": ("yaml", "x: " + "[" * 5000 + "]" * 5000 + "\n"),
    "deep 100": ("yaml", "x: " + "[" * 100 + "]" * 100 + "\n"),
    "too big": ("yaml", "# " + "x" * (2 << 20) + "\ntransforms: []\n"),
    "scalar": ("yaml", "5\n"),
    "unknown transform": ("yaml", "transforms:\n  - name: Explode\n"),
    "json syntax": ("json", '{"transforms": [}'),
    "json deep": ("json", "[" * 100000 + "]" * 100000),
    "json too big": ("json", '{"transforms": [], "x": "' + "x" * (2 << 20) + '"}'),
    "json not recipe": ("json", "[5]"),
    "json NaN": ("json", '{"transforms": [{"name": "RandomHorizontalFlip", "p": NaN}]}'),
    "not utf-8": ("yaml", None),
}


@pytest.mark.parametrize("case", list(BAD_RECIPES))
def test_a_bad_recipe_file_is_a_recipe_error_naming_it(tmp_path, case):
    kind, text = BAD_RECIPES[case]
    path = tmp_path / f"recipe.{'yaml' if kind == 'yaml' else 'json'}"
    if text is None:
        path.write_bytes(b"transforms: [\xff\xfe]\n")
    else:
        path.write_text(text)
    with pytest.raises(RecipeError) as info:  # the 7-level bomb: was 90 s and 2.3 GB
        Compose.load(path)
    assert str(path) in str(info.value)
    if case.startswith(("python", "alias", "custom", "binary", "syntax", "unknown")):
        assert info.value.line is not None


def test_the_seven_level_alias_bomb_is_608_bytes_and_refused_fast(tmp_path):
    text = _alias_bomb(7)
    assert len(text) < 700
    with pytest.raises(RecipeError, match="expands to more than"):
        Compose.from_yaml(text, file="bomb.yaml")


def test_the_cli_refuses_the_bomb_naming_the_file(tmp_path):
    from detaug.cli import CliError, read_recipe

    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(7))
    with pytest.raises(CliError, match="bomb.yaml"):
        read_recipe(path)


def test_a_plain_recipe_with_a_few_aliases_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("flip: &flip {name: RandomHorizontalFlip, p: 0.5}\ntransforms: [*flip, *flip]\n"
                    .replace("flip: &flip", "transforms_defaults: &flip").replace("transforms_defaults", "x"))
    with pytest.raises(RecipeError, match="unknown recipe key"):  # the anchor's own key is no recipe key
        Compose.load(path)
    path.write_text("transforms:\n  - &flip {name: RandomHorizontalFlip, p: 0.5}\n  - *flip\n")
    assert len(Compose.load(path).transforms) == 2


# -- 6. VOC XML ------------------------------------------------------------------------------------

OBJ = "<object><name>cat</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object>"
BAD_XML = {
    "xxe": '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x SYSTEM "file:///OUT/secret.txt">]><annotation>'
           "<filename>&x;</filename></annotation>",
    "billion laughs": '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;'
                      '&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><annotation><filename>&c;</filename>'
                      "</annotation>",
    "xinclude": '<annotation xmlns:xi="http://www.w3.org/2001/XInclude"><xi:include href="/OUT/secret.txt" '
                'parse="text"/></annotation>',
    "deep": "<annotation>" + "<a>" * 100000 + "</a>" * 100000 + "</annotation>",
    "too many objects": "<annotation><filename>x.jpg</filename><size><width>30</width><height>20</height>"
                        "</size>" + OBJ * 10001 + "</annotation>",
    "not annotation": "<html></html>", "empty": "", "cut": "<annotation><object>", "binary": "\0\0\0",
    "filename outside": "<annotation><filename>../../OUT/outside.jpg</filename><size><width>30</width>"
                        "<height>20</height></size>" + OBJ + "</annotation>",
    "filename absolute": "<annotation><filename>/OUT/outside.jpg</filename><size><width>30</width>"
                         "<height>20</height></size>" + OBJ + "</annotation>",
    "external dtd": '<?xml version="1.0"?><!DOCTYPE annotation SYSTEM "file:///OUT/secret.txt"><annotation>'
                    "</annotation>",
    "parameter entity": '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY % p SYSTEM "file:///OUT/secret.txt"> %p;]>'
                        "<annotation></annotation>",
}


@pytest.mark.parametrize("case", list(BAD_XML))
def test_a_hostile_voc_file_is_skipped_and_named(tmp_path, case):
    from detaug.sources import VocSource

    root, outside = tmp_path / "voc", tmp_path / "outside"
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("the secret text")
    jpeg(outside / "outside.jpg")
    jpeg(root / "JPEGImages" / "good.jpg")
    (root / "Annotations" / "good.xml").write_text(
        "<annotation><filename>good.jpg</filename><size><width>30</width><height>20</height></size>"
        + OBJ + "</annotation>")
    jpeg(root / "JPEGImages" / "bad.jpg")
    (root / "Annotations" / "bad.xml").write_text(BAD_XML[case].replace("/OUT", str(outside)))
    with Opens() as opened, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = VocSource(root)
    assert_nothing_outside(opened, root, outside)
    files = [source.file_of(i) for i in range(len(source))]
    assert all(str(outside) not in f for f in files)
    assert "the secret text" not in repr([s.image for s in source.samples])
    conversion = source.report.conversion
    skipped = dict(conversion.images_skipped)
    if case in ("deep", "too many objects", "not annotation", "empty", "cut", "binary"):
        assert len(source) == 1 and sum(skipped.values()) == 1, conversion.summary()
        assert "Annotations/bad.xml" in repr(conversion)  # names the file
        if case == "too many objects":
            assert skipped == {"too many objects": 1}
    else:  # entities, includes and DTDs are not resolved; <filename> cannot leave the folder
        assert sorted(Path(f).name for f in files) == ["bad.jpg", "good.jpg"]


@pytest.mark.parametrize("entry", ["../../outside/evil", "/OUT/evil", "a/../../../outside/evil", "../Annotations/good"])
def test_a_voc_split_entry_stays_inside(tmp_path, entry):
    from detaug.sources import VocSource

    root, outside = tmp_path / "voc", tmp_path / "outside"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (root / sub).mkdir(parents=True)
    outside.mkdir()
    good = "<annotation><filename>{}.jpg</filename><size><width>30</width><height>20</height></size>" + OBJ + "</annotation>"
    (outside / "evil.xml").write_text(good.format("evil"))
    jpeg(outside / "evil.jpg")
    (root / "Annotations" / "good.xml").write_text(good.format("good"))
    jpeg(root / "JPEGImages" / "good.jpg")
    (root / "ImageSets" / "Main" / "train.txt").write_text("good\n" + entry.replace("/OUT", str(outside)) + "\n")
    with Opens() as opened, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = VocSource(root, "train")
    assert_nothing_outside(opened, root, outside)
    assert [Path(source.file_of(i)).name for i in range(len(source))] == ["good.jpg"]
    assert sum(source.report.conversion.images_skipped.values()) == 1  # the entry is named, skipped


# -- 7. images -------------------------------------------------------------------------------------

def jpeg_header(width: int, height: int) -> bytes:
    """A tiny JPEG whose SOF0 header claims any size (the probe reads headers only)."""
    sof = struct.pack(">BHHB", 8, height, width, 3) + bytes([1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1])
    sos = bytes([3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0])
    return (b"\xff\xd8\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof
            + b"\xff\xda" + struct.pack(">H", len(sos) + 2) + sos + b"\x12\x34" * 8 + b"\xff\xd9")


def png_header(width: int, height: int) -> bytes:
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


IMAGES = {
    "jpeg 29999 x 29999": (jpeg_header(29999, 29999), I.TOO_LARGE),
    "jpeg 20000 x 20000": (jpeg_header(20000, 20000), I.TOO_LARGE),
    "jpeg 65535 x 1": (jpeg_header(65535, 1), I.TOO_LARGE),
    "jpeg 1 x 40000": (jpeg_header(1, 40000), I.TOO_LARGE),
    "jpeg 16385 x 16384": (jpeg_header(16385, 16384), I.TOO_LARGE),
    "jpeg 65535 x 65535": (jpeg_header(65535, 65535), I.TOO_LARGE),
    "png 29999 x 29999": (png_header(29999, 29999), I.TOO_LARGE),
    "png 2**31 - 1 wide": (png_header(2**31 - 1, 1), I.TOO_LARGE),
    "png 100000 x 10": (png_header(100000, 10), I.TOO_LARGE),
    "jpeg 0 x 0": (jpeg_header(0, 0), I.unreadable_header("JPEG")),
    "empty": (b"", I.EMPTY),
    "text": (b"hello, not an image", I.NOT_AN_IMAGE),
    "jpeg cut": (jpeg_header(10, 10)[:-2], I.TRUNCATED_JPEG),
    "jpeg no SOF": (b"\xff\xd8\xff\xd9", I.unreadable_header("JPEG")),
    "png cut": (png_header(10, 10)[:-12], I.TRUNCATED_PNG),
    "gif": (b"GIF89a" + b"\0" * 20, "GIF: not a format DALI decodes"),
    "nul bytes": (b"\0" * 1000, I.NOT_AN_IMAGE),
    "jpeg 16384 x 16384 is fine": (jpeg_header(16384, 16384), None),
}


@pytest.mark.parametrize("case", list(IMAGES))
def test_an_image_header_is_judged_before_dali(case):
    data, problem = IMAGES[case]
    assert I.probe_image(data).problem == problem


def test_a_29999_square_jpeg_is_skipped_and_named_by_the_loader(tmp_path):
    (tmp_path / "images").mkdir()
    for k in range(3):
        jpeg(tmp_path / "images" / f"{k}.jpg")
    (tmp_path / "images" / "huge.jpg").write_bytes(jpeg_header(29999, 29999))
    (tmp_path / "ann.json").write_text(json.dumps(coco(["0.jpg", "1.jpg", "2.jpg", "huge.jpg"])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # the boxes of the huge image's declared size
        source = CocoSource(tmp_path / "ann.json", tmp_path / "images")
    loader = DetectionLoader(source, T.Compose([T.Resize((16, 16))]), 2, device="cpu")
    with pytest.warns(DataWarning, match="huge.jpg"):
        batches = list(loader)
    assert sum(len(t) for _, t in batches) == 4  # the batch keeps its size: a good image replaces it
    assert [(Path(s["file"]).name, s["reason"]) for s in loader.skipped] == [("huge.jpg", I.TOO_LARGE)]
