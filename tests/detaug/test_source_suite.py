"""One suite, every source kind: CocoSource, the columnar (cached) COCO source, VocSource,
SampleListSource, ShardSource and YoloSource must keep the same rules: exact epochs and equal ranks, the
seed contract, bad images named and skipped (or raised), and state_dict resume.

The epoch and rank rules are checked on :class:`~detaug.planning.BatchPlanner` (what both
loaders run, no DALI); one real CPU ``DetectionLoader`` per kind checks the end to end path,
the bad images and the resume. Datasets: a dozen 64x48 synthetic JPEGs (the YOLO folder is
written from the COCO one by :func:`write_yolo_folder`).
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import detaug.transforms as T
from detaug import DataWarning, ImageError
from detaug.formats.box_formats import from_xyxy
from detaug.formats.samples import Source
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug.shards import ShardSource, read_index, write_shards
from detaug.sources import CocoSource, SampleListSource, VocSource, YoloSource
from detaug.synthetic import write_coco_dataset, write_voc_dataset
from detaug.torch import DetectionLoader

KINDS = ["coco", "coco-cache", "voc", "list", "shards", "yolo"]
RECIPE = T.Compose([T.RandomHorizontalFlip(), T.RandomAffine(degrees=10, scale=(0.8, 1.2)), T.Resize((40, 48))])
N = 12
BAD_TEXT = b"this is not an image"


def _build(kind: str, coco: Path, voc: Path, work: Path) -> object:
    """The source of ``kind`` over the COCO folder (or the VOC folder for ``voc``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        if kind == "coco":
            return CocoSource(coco / "annotations.json", coco / "images")
        if kind == "coco-cache":
            return CocoSource(coco / "annotations.json", coco / "images", cache=work / "cache")
        if kind == "voc":
            return VocSource(voc)
        base = CocoSource(coco / "annotations.json", coco / "images")
        if kind == "yolo":
            return YoloSource(write_yolo_folder(base, work / "yolo"))
        if kind == "list":
            return SampleListSource(list(base.samples), base.categories)
        write_shards(base, work / "shards", shard_size=6000, verify=False, progress=False)  # several tars
        return ShardSource(work / "shards")


def write_yolo_folder(source: CocoSource, root: Path) -> Path:
    """A YOLO-txt folder of ``source``'s images (copied) and boxes (``class cx cy w h`` fractions
    of the declared size, class = the category's position), with ``classes.txt``."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    ids = sorted(source.categories)
    (root / "classes.txt").write_text("".join(f"{source.categories[i]}\n" for i in ids))
    for s in source.samples:
        image = Path(s.image)
        shutil.copy(image, root / "images" / image.name)
        rows = from_xyxy(s.boxes, "yolo", s.size).astype(np.float64)
        (root / "labels" / f"{image.stem}.txt").write_text("".join(
            f"{ids.index(int(label))} {' '.join(repr(float(x)) for x in row)}\n" for label, row in zip(s.labels, rows)))
    return root


def _spoil(source) -> str:
    """Overwrite the image of the source's third sample with text; its file name."""
    image = Path(source.file_of(2))
    image.write_bytes(BAD_TEXT)
    return image.name


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    write_coco_dataset(root / "coco", num_images=N, size=(64, 48), max_objects=3, progress=False)
    write_voc_dataset(root / "voc", num_images=N, size=(64, 48), max_objects=3)
    shutil.copytree(root / "coco", root / "coco-bad")
    shutil.copytree(root / "voc", root / "voc-bad")
    bad = {"coco": _spoil(CocoSource(root / "coco-bad" / "annotations.json", root / "coco-bad" / "images")),
           "voc": _spoil(VocSource(root / "voc-bad"))}
    return root, bad


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def source(kind, data):
    root, _ = data
    return _build(kind, root / "coco", root / "voc", root / f"work-{kind}")


@pytest.fixture(scope="module")
def bad_source(kind, data):
    root, bad = data
    return _build(kind, root / "coco-bad", root / "voc-bad", root / f"work-bad-{kind}"), bad["voc" if kind == "voc" else "coco"]


def test_every_kind_is_a_source(source):
    assert isinstance(source, Source)
    assert len(source.samples) == len(source) and set(source.present_labels()) <= set(source.categories)


def _ids(source) -> list[int]:
    return [int(source.samples[i].image_id) for i in range(len(source))]



@pytest.mark.parametrize("world, batch, drop_last", [(1, 5, False), (3, 2, False), (5, 2, True)])
def test_exact_epochs_and_equal_ranks(source, world, batch, drop_last):
    ids = _ids(source)
    n = len(ids)
    assert len(set(ids)) == n >= N - 2  # VOC leaves out an image without objects
    epochs = []
    for epoch in range(2):
        seen: Counter[int] = Counter()
        lengths = set()
        for rank in range(world):
            spec = EpochSpec(len(source), batch, rank, world, shuffle=True, drop_last=drop_last, seed=5)
            planner = BatchPlanner(source, RECIPE, spec)
            lengths.add(len(spec))
            sizes = []
            for step in range(len(spec)):
                planned = planner.plan(epoch, step)
                sizes.append(len(planned.image_ids))
                seen.update(planned.image_ids.tolist())
            assert all(k == batch for k in sizes[:-1]) and 0 < sizes[-1] <= batch
            per_rank = n // world if drop_last else -(-n // world)
            assert sum(sizes) == (per_rank // batch * batch if drop_last else per_rank)
        assert len(lengths) == 1  # every rank yields as many batches
        if drop_last:
            assert max(seen.values()) == 1 and len(seen) == (n // world) * world
        else:
            assert set(seen) == set(ids) and sum(seen.values()) - n == -n % world  # at most W - 1 repeats
        epochs.append(seen)


def test_seed_contract_augmentation_depends_on_seed_epoch_and_id_only(source):
    """The same image gets the same boxes whichever rank and position it has; another seed or
    epoch gives others."""
    def boxes(world, seed, epoch):
        found = {}
        for rank in range(world):
            spec = EpochSpec(len(source), 4, rank, world, shuffle=True, seed=seed)
            planner = BatchPlanner(source, RECIPE, spec)
            for step in range(len(spec)):
                p = planner.plan(epoch, step)
                found.update({int(i): b for i, b in zip(p.image_ids, p.boxes)})
        return found

    one, two = boxes(1, 3, 0), boxes(2, 3, 0)
    assert set(one) == set(two)
    assert all(np.array_equal(one[i], two[i]) for i in one)
    other_seed, other_epoch = boxes(1, 4, 0), boxes(1, 3, 1)
    assert any(not np.array_equal(one[i], other_seed[i]) for i in one if len(one[i]))
    assert any(not np.array_equal(one[i], other_epoch[i]) for i in one if len(one[i]))


def test_loader_epoch_and_resume(source):
    """A real CPU pipeline: every sample once per epoch; a loader resumed from state_dict after
    one batch yields exactly the batches an unbroken run yields."""
    def run(loader, count=None):
        out = []
        for k, (images, targets) in enumerate(loader):
            assert len(images) == len(targets)
            out.append([(t["image_id"], t["boxes"].cpu().numpy()) for t in targets])
            if count is not None and k + 1 == count:
                break
        return out

    loader = DetectionLoader(source, RECIPE, 5, device="cpu", shuffle=True, seed=11, num_threads=1)
    full = run(loader)
    assert sorted(i for batch in full for i, _ in batch) == sorted(_ids(source))
    first = DetectionLoader(source, RECIPE, 5, device="cpu", shuffle=True, seed=11, num_threads=1)
    head = run(first, 1)
    state = first.state_dict()
    resumed = DetectionLoader(source, RECIPE, 5, device="cpu", shuffle=True, seed=11, num_threads=1)
    resumed.load_state_dict(state)
    tail = run(resumed)
    together = head + tail
    assert [[i for i, _ in b] for b in together] == [[i for i, _ in b] for b in full]
    assert all(np.array_equal(x, y) for a, b in zip(together, full) for (_, x), (_, y) in zip(a, b))


def test_bad_image_is_named_and_skipped_or_raised(bad_source, source):
    bad, name = bad_source
    assert len(bad) == len(source)  # every kind keeps it (VocSource too: the converter's skip is the loader's)
    if isinstance(bad, VocSource):  # the conversion report counts it as voc2coco does
        assert [Path(str(m.path)).stem for m in bad.conversion_report.messages_of("image")] == [Path(name).stem]
    source = bad
    loader = DetectionLoader(source, RECIPE, 4, device="cpu", num_threads=1)
    with pytest.warns(DataWarning, match="not an image"):
        sizes = [len(targets) for _, targets in loader]
    n = len(source)
    assert sizes == [4] * (n // 4) + [n % 4] * (n % 4 > 0)  # replaced by the next readable sample: sizes kept
    assert len(loader.skipped) == 1
    skipped = loader.skipped[0]
    assert "not an image" in skipped["reason"]
    # the file is named: the image file, or for shards the tar member written from it
    if isinstance(source, ShardSource):
        assert ".tar:" in skipped["file"]
        member = int(skipped["file"].rsplit(":", 1)[1].split(".")[0])
        assert Path(json.loads(_json_of(source, member))["file"]).name == name
    else:
        assert skipped["file"].endswith(name)
    strict = DetectionLoader(source, RECIPE, 4, device="cpu", num_threads=1, on_error="raise")
    with pytest.raises(ImageError, match="not an image"):
        for _ in strict:
            pass


def _json_of(source: ShardSource, index: int) -> bytes:
    """The ``<key>.json`` member of sample ``index``, found through its tar's DALI index file."""
    shard = source.shard_of(index)
    within = index - sum(source.shard_sizes[:shard])
    offset, size, _ = read_index(Path(source.tars[shard]).with_suffix(".idx"))[within]["json"]
    with open(source.tars[shard], "rb") as f:
        f.seek(offset)
        return f.read(size)


def test_shard_source_says_which_images_were_left_out_when_written(tmp_path):
    """write_shards probes every image and leaves out those the loaders would skip (named in
    its summary); a ShardSource over the folder says so too, when it is built."""
    write_coco_dataset(tmp_path / "coco", num_images=4, size=(64, 48), max_objects=2, progress=False)
    base = CocoSource(tmp_path / "coco" / "annotations.json", tmp_path / "coco" / "images")
    name = _spoil(base)
    summary = write_shards(base, tmp_path / "shards", verify=True, progress=False)
    assert [Path(s["file"]).name for s in summary.skipped] == [name]
    with pytest.warns(DataWarning, match=rf"1 image\(s\) left out when the shards were written, e\.g\. .*{name} "
                                         rf"\(image_id {base.samples[2].image_id}\): not an image"):
        shards = ShardSource(tmp_path / "shards")
    assert len(shards) == len(base) - 1 and [Path(s["file"]).name for s in shards.skipped_when_written] == [name]
