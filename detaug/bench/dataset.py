"""The COCO-style JPEG dataset every variant reads: what the user has, or a generated one.

Every variant (DALI's COCO reader, detaug's sources, the DataLoader peers) reads one layout::

    root/images/*.jpg
    root/annotations.json      COCO instances; bbox = [x, y, w, h] in absolute pixels

:func:`prepare_dataset` takes

* nothing: a synthetic dataset (:func:`detaug.synthetic.write_coco_dataset`), generated once
  and cached;
* a folder already in that layout (used as it is unless ``repeat_to`` asks for more images);
* a Pascal VOC folder (``Annotations/`` + ``JPEGImages/``, read with ``voc2coco``'s rules as
  :class:`detaug.sources.VocSource` reads it), or several (``--realdata``: the VOC folders
  under one folder, category ids merged by name);
* a COCO JSON file with its images folder anywhere (``images_dir``; default: ``images/`` next
  to the JSON, else the JSON's own folder).

The last three are written as the layout above into a work folder: a COCO JSON of the images
kept, repeated in order up to ``repeat_to`` images, whose ``images/`` entries are symbolic links
to the original files (``<k:06d>_<name>``; no image bytes are copied). Kept: readable baseline
or progressive JPEGs with at least one box, at least :data:`MIN_SIDE` pixels a side, no EXIF
rotation (cv2 would apply it, torchvision and DALI's reader paths not all alike) and a declared
size equal to the stored one; everything left out is counted by reason in
:attr:`BenchDataset.left_out`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from detaug.formats.box_formats import xywh_to_xyxy

__all__ = [
    "MIN_SIDE",
    "BenchDataset",
    "Record",
    "default_cache_dir",
    "load_records",
    "prepare_dataset",
    "realdata_folders",
    "write_resized_dataset",
]

GENERATED_SIZE = (600, 420)
GENERATED_OBJECTS = (1, 11)
#: Images with a side under this many pixels are left out of a bench dataset (their decode and
#: crop are not the workload a detector trains on).
MIN_SIDE = 64


@dataclass(frozen=True)
class Record:
    """One annotated image, as the CPU peers read it.

    ``boxes_xyxy`` is float32 ``[N, 4]`` in absolute pixels (pixel ``i`` spans ``[i, i + 1)``);
    ``labels`` is int64 ``[N]`` (COCO ``category_id``).
    """

    path: str
    width: int
    height: int
    boxes_xyxy: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class BenchDataset:
    """A dataset folder and a summary of it for the report."""

    root: Path
    images_dir: Path
    annotations_file: Path
    num_images: int
    num_boxes: int
    max_boxes: int
    min_size: tuple[int, int]
    max_size: tuple[int, int]
    total_bytes: int
    generated: bool
    source: str = ""
    unique_images: int | None = None
    left_out: dict[str, int] = field(default_factory=dict)
    temporary: Path | None = None  # a folder made for this dataset, for the caller to remove

    def describe(self) -> str:
        """One line: count, sizes, boxes per image, mean JPEG size, origin and path."""
        if self.min_size == self.max_size:
            sizes = f"{self.min_size[0]}x{self.min_size[1]}"
        else:
            sizes = f"{self.min_size[0]}x{self.min_size[1]} to {self.max_size[0]}x{self.max_size[1]}"
        per_image = self.num_boxes / max(self.num_images, 1)
        kib = self.total_bytes / max(self.num_images, 1) / 1024
        origin = "generated (detaug.synthetic)" if self.generated else f"from {self.source or self.root}"
        repeated = ""
        if self.unique_images is not None and self.unique_images != self.num_images:
            repeated = f" ({self.unique_images} distinct, repeated)"
        left = ""
        if self.left_out:
            left = "; left out: " + ", ".join(f"{n} {why}" for why, n in sorted(self.left_out.items()))
        return (
            f"{self.num_images} COCO-style JPEGs{repeated}, {sizes}, {per_image:.1f} boxes/image "
            f"(max {self.max_boxes}), {kib:.0f} KiB/image, {origin}: {self.root}{left}"
        )

    def to_dict(self) -> dict:
        return {
            "root": str(self.root),
            "num_images": self.num_images,
            "num_boxes": self.num_boxes,
            "max_boxes": self.max_boxes,
            "min_size_wh": list(self.min_size),
            "max_size_wh": list(self.max_size),
            "total_bytes": self.total_bytes,
            "generated": self.generated,
            "source": self.source or str(self.root),
            "unique_images": self.unique_images if self.unique_images is not None else self.num_images,
            "left_out": dict(self.left_out),
        }


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/detaug/bench`` (``~/.cache/detaug/bench`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "detaug" / "bench"


def prepare_dataset(
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    *,
    images_dir: str | os.PathLike[str] | None = None,
    allow_paths_outside: bool = False,
    repeat_to: int | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    num_images: int = 2048,
    cache_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    progress: bool = True,
) -> BenchDataset:
    """The dataset every variant reads (see the module docstring for what ``data`` may be).

    Args:
        data: a folder in the bench layout, a Pascal VOC folder, a COCO JSON file, or a list of
            VOC folders; ``None`` generates ``num_images`` synthetic 600x420 JPEGs with 1-11
            boxes each into ``cache_dir/synthetic-coco-<num_images>-600x420-seed<seed>`` (reused
            when present).
        images_dir: the images folder of a COCO JSON ``data`` (``file_name`` is relative to it).
        allow_paths_outside: accept ``file_name`` entries that are absolute or leave it
            (docs/security.md; default: a ``DatasetError`` naming them).
        repeat_to: the images of the dataset, in order, repeated (or cut) to this many.
        work_dir: where a dataset written from ``data`` goes (``work_dir/bench-data``); ``None``:
            a new temporary folder, named in :attr:`BenchDataset.root` (the caller removes it).
        num_images: images to generate when ``data`` is ``None`` (``>= 1``).
        cache_dir: where generated datasets are kept; :func:`default_cache_dir` by default.
        seed: generator seed.
        progress: show the generator's progress bar.

    Raises:
        ValueError: ``data`` is none of the above, an option does not fit it, or no image is left.
        detaug.errors.DatasetError: the annotations cannot be read.
    """
    if repeat_to is not None and (isinstance(repeat_to, bool) or not isinstance(repeat_to, int) or repeat_to < 1):
        raise ValueError(f"--repeat-to should be a positive int, got {repeat_to!r}")
    if data is None:
        if images_dir is not None:
            raise ValueError("--images-dir goes with --data FILE.json (a COCO JSON)")
        if not isinstance(num_images, int) or num_images < 1:
            raise ValueError(f"num_images should be a positive int, got {num_images!r}")
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        width, height = GENERATED_SIZE
        root = cache / f"synthetic-coco-{num_images}-{width}x{height}-seed{seed}"
        if not (root / "annotations.json").is_file():
            _generate(root, num_images=num_images, seed=seed, progress=progress)
        generated = _summarize(root, generated=True)
        if repeat_to is None:
            return generated
        samples, categories, left_out = _coco_samples(generated.annotations_file, generated.images_dir)
        return _write(samples, categories, left_out, repeat_to, work_dir, source=str(root), generated=True)
    if isinstance(data, (list, tuple)):
        if images_dir is not None:
            raise ValueError("--images-dir goes with --data FILE.json (a COCO JSON)")
        samples, categories, left_out = _voc_samples([Path(d) for d in data], skip_unreadable=True)
        source = ", ".join(str(d) for d in data) if len(data) <= 3 else f"{len(data)} VOC folders under {Path(data[0]).parent}"
        return _write(samples, categories, left_out, repeat_to, work_dir, source=source)
    root = Path(data)
    layout = root.is_dir() and (root / "annotations.json").is_file() and (root / "images").is_dir()
    if layout and repeat_to is None and images_dir is None:
        return _summarize(root, generated=False)
    if layout or root.is_file():
        json_file = root / "annotations.json" if layout else root
        if images_dir is not None:
            images = Path(images_dir)
        elif layout:
            images = root / "images"
        else:
            images = root.parent / "images" if (root.parent / "images").is_dir() else root.parent
        if not images.is_dir():
            raise ValueError(f"--images-dir {images}: not a folder")
        samples, categories, left_out = _coco_samples(json_file, images, allow_paths_outside)
        return _write(samples, categories, left_out, repeat_to, work_dir, source=f"{json_file} (images in {images})")
    if root.is_dir() and (root / "Annotations").is_dir():
        if images_dir is not None:
            raise ValueError("--images-dir goes with --data FILE.json (a COCO JSON), not a VOC folder")
        samples, categories, left_out = _voc_samples([root], skip_unreadable=False)
        return _write(samples, categories, left_out, repeat_to, work_dir, source=str(root))
    raise ValueError(
        f"--data {root} should hold annotations.json and images/ (the layout "
        "detaug.synthetic.write_coco_dataset writes), be a Pascal VOC folder (Annotations/, "
        "JPEGImages/) or a COCO JSON file (its images in --images-dir)"
    )


def realdata_folders(root: str | os.PathLike[str]) -> list[Path]:
    """The Pascal VOC folders (``Annotations/`` and ``JPEGImages/``) directly under ``root``, sorted.

    Raises:
        ValueError: ``root`` is not a folder or holds none.
    """
    base = Path(root)
    if not base.is_dir():
        raise ValueError(f"--realdata {base}: not a folder")
    found = sorted(p for p in base.iterdir() if (p / "Annotations").is_dir() and (p / "JPEGImages").is_dir())
    if not found:
        raise ValueError(f"--realdata {base}: no Pascal VOC folder (Annotations/, JPEGImages/) in it")
    return found


# ------------------------------------------------------------------------------------------
# reading what the user has, writing the bench layout
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sample:
    """One kept image: its file, stored ``(width, height)``, xyxy float32 boxes, category names."""

    path: str
    size_wh: tuple[int, int]
    boxes_xyxy: np.ndarray
    names: tuple[str, ...]


def _coco_samples(json_file: Path, images_dir: Path,
                  allow_paths_outside: bool = False) -> tuple[list[_Sample], list[str], dict[str, int]]:
    from detaug.formats.coco import load_coco
    from detaug.sources import coco_to_samples

    dataset = load_coco(json_file, allow_paths_outside=allow_paths_outside)
    samples = coco_to_samples(dataset, images_dir)
    left_out: dict[str, int] = {}
    kept = [k for s in samples if (k := _keep(s, dataset.categories, left_out)) is not None]
    return kept, sorted(set(dataset.categories.values())), left_out


def _voc_samples(roots: list[Path], *, skip_unreadable: bool) -> tuple[list[_Sample], list[str], dict[str, int]]:
    from detaug.errors import DatasetError
    from detaug.sources import VocSource

    kept: list[_Sample] = []
    names: set[str] = set()
    left_out: dict[str, int] = {}
    for root in roots:
        try:
            source = VocSource(root)
        except (DatasetError, OSError, ValueError) as err:
            if not skip_unreadable:
                raise
            reason = f"VOC folders not read ({root.name}: {str(err).splitlines()[0][:80]})"
            left_out[reason] = left_out.get(reason, 0) + 1
            continue
        names.update(source.categories.values())
        kept += [k for s in source.samples if (k := _keep(s, source.categories, left_out)) is not None]
    return kept, sorted(names), left_out


def _keep(sample, categories: dict[int, str], left_out: dict[str, int]) -> _Sample | None:
    """The sample as a :class:`_Sample`, or ``None`` (counted in ``left_out`` by reason)."""
    from detaug.formats.images import probe_file

    def leave(reason: str) -> None:
        left_out[reason] = left_out.get(reason, 0) + 1

    if not isinstance(sample.image, str):
        leave("not image files")
        return None
    info = probe_file(sample.image)
    if info.problem is not None or (info.format or "").upper() != "JPEG":
        leave("not readable JPEGs")
        return None
    if info.orientation != 1:
        leave("EXIF-rotated")
        return None
    h, w = info.stored_hw
    if min(h, w) < MIN_SIDE:
        leave(f"under {MIN_SIDE} px a side")
        return None
    if sample.size is not None and tuple(sample.size) != (h, w):
        leave("declared size not the file's")
        return None
    boxes = np.asarray(sample.boxes, dtype=np.float32).reshape(-1, 4).copy()
    boxes[:, 0::2] = boxes[:, 0::2].clip(0, w)
    boxes[:, 1::2] = boxes[:, 1::2].clip(0, h)
    good = ((boxes[:, 2:] - boxes[:, :2]) >= 1.0).all(axis=1)
    if not good.all():
        left_out["boxes under 1 px"] = left_out.get("boxes under 1 px", 0) + int((~good).sum())
    if not good.any():
        leave("without boxes")
        return None
    labels = np.asarray(sample.labels).reshape(-1)[good]
    return _Sample(sample.image, (w, h), boxes[good], tuple(categories[int(c)] for c in labels))


def _write(
    samples: list[_Sample],
    names: list[str],
    left_out: dict[str, int],
    repeat_to: int | None,
    work_dir: str | os.PathLike[str] | None,
    *,
    source: str,
    generated: bool = False,
) -> BenchDataset:
    """Write ``samples`` (repeated to ``repeat_to``) as the bench layout; see the module docstring."""
    if not samples:
        why = "; ".join(f"{n} {r}" for r, n in sorted(left_out.items())) or "none listed"
        raise ValueError(f"--data {source}: no usable image (left out: {why})")
    temporary = work_dir is None
    base = Path(tempfile.mkdtemp(prefix="detaug-bench-")) if temporary else Path(work_dir)
    root = base / "bench-data"
    if root.exists():
        shutil.rmtree(root)
    (root / "images").mkdir(parents=True)
    category_ids = {name: k + 1 for k, name in enumerate(names)}
    count = repeat_to if repeat_to is not None else len(samples)
    images, annotations = [], []
    for k in range(count):
        s = samples[k % len(samples)]
        file_name = f"{k:06d}_{os.path.basename(s.path)}"
        _link(os.path.abspath(s.path), root / "images" / file_name)
        images.append({"id": k + 1, "file_name": file_name, "width": s.size_wh[0], "height": s.size_wh[1]})
        for box, name in zip(s.boxes_xyxy.tolist(), s.names):
            x0, y0, x1, y1 = box
            annotations.append({
                "id": len(annotations) + 1, "image_id": k + 1, "category_id": category_ids[name],
                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0,
            })
    coco = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i, "name": n} for n, i in category_ids.items()],
    }
    with open(root / "annotations.json", "w", encoding="utf-8") as f:
        json.dump(coco, f)
    summary = _summarize(root, generated=generated)
    from dataclasses import replace

    return replace(
        summary, source=source, unique_images=len({s.path for s in samples[:count]}),
        left_out=dict(left_out), temporary=base if temporary else None,
    )


def _link(target: str, link: Path) -> None:
    """A symbolic link to ``target`` (a hard link, then a copy, where symbolic links fail)."""
    try:
        os.symlink(target, link)
    except OSError:
        try:
            os.link(target, link)
        except OSError:
            shutil.copyfile(target, link)


def write_resized_dataset(
    dataset: BenchDataset,
    megapixels: float,
    out_dir: str | os.PathLike[str],
    *,
    max_unique: int = 32,
    num_images: int | None = None,
    quality: int = 90,
) -> BenchDataset:
    """The first ``max_unique`` distinct photos of ``dataset`` resized (aspect ratio kept,
    Lanczos) to about ``megapixels`` million pixels each, boxes scaled with them, written as JPEGs
    of ``quality`` into ``out_dir``, then repeated to ``num_images`` (default: as many as
    ``dataset``) in the bench layout: the megapixel rows of ``detaug bench --scaling``."""
    from PIL import Image

    if megapixels <= 0:
        raise ValueError(f"megapixels should be > 0, got {megapixels}")
    records = load_records(dataset)
    with open(dataset.annotations_file, encoding="utf-8") as f:
        categories = {c["id"]: c["name"] for c in json.load(f)["categories"]}
    out = Path(out_dir)
    unique_dir = out / "resized"
    unique_dir.mkdir(parents=True, exist_ok=True)
    seen: dict[str, _Sample] = {}
    for r in records:
        real = os.path.realpath(r.path)
        if real in seen:
            continue
        scale = (megapixels * 1e6 / (r.width * r.height)) ** 0.5
        w, h = max(1, round(r.width * scale)), max(1, round(r.height * scale))
        target = unique_dir / f"{len(seen):04d}.jpg"
        with Image.open(real) as im:
            im.convert("RGB").resize((w, h), Image.LANCZOS).save(target, quality=quality)
        boxes = r.boxes_xyxy * np.asarray([w / r.width, h / r.height] * 2, dtype=np.float32)
        boxes = np.minimum(boxes, np.asarray([w, h, w, h], dtype=np.float32))  # float rounding
        seen[real] = _Sample(str(target), (w, h), boxes, tuple(categories[int(c)] for c in r.labels))
        if len(seen) >= max_unique:
            break
    result = _write(
        list(seen.values()), sorted(set(categories.values())), {}, num_images or dataset.num_images, out,
        source=f"{dataset.source or dataset.root} resized to {megapixels:g} MP",
    )
    return result


def _generate(root: Path, *, num_images: int, seed: int, progress: bool) -> None:
    """Write the dataset into a sibling temporary folder, then rename it into place."""
    from detaug.synthetic import write_coco_dataset

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
    try:
        write_coco_dataset(
            tmp,
            num_images=num_images,
            size=GENERATED_SIZE,
            min_objects=GENERATED_OBJECTS[0],
            max_objects=GENERATED_OBJECTS[1],
            seed=seed,
            progress=progress,
        )
        try:
            tmp.rename(root)
        except OSError:  # another process finished first
            if not (root / "annotations.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _summarize(root: Path, *, generated: bool) -> BenchDataset:
    with open(root / "annotations.json", encoding="utf-8") as f:
        coco = json.load(f)
    counts: dict[int, int] = {}
    for ann in coco["annotations"]:
        counts[ann["image_id"]] = counts.get(ann["image_id"], 0) + 1
    images = coco["images"]
    if not images:
        raise ValueError(f"{root / 'annotations.json'} lists no images")
    sizes = [(int(im["width"]), int(im["height"])) for im in images]
    total_bytes = 0
    for im in images:
        try:
            total_bytes += (root / "images" / im["file_name"]).stat().st_size
        except OSError as exc:
            raise ValueError(f"image listed in annotations.json is missing: {exc}") from exc
    return BenchDataset(
        root=root,
        images_dir=root / "images",
        annotations_file=root / "annotations.json",
        num_images=len(images),
        num_boxes=sum(counts.values()),
        max_boxes=max(counts.values(), default=0),
        min_size=min(sizes, key=lambda s: s[0] * s[1]),
        max_size=max(sizes, key=lambda s: s[0] * s[1]),
        total_bytes=total_bytes,
        generated=generated,
    )


def load_records(dataset: BenchDataset) -> list[Record]:
    """Images with at least one box, boxes converted to absolute xyxy (as DALI's
    ``readers.coco(skip_empty=True)`` sees them), in file order."""
    with open(dataset.annotations_file, encoding="utf-8") as f:
        coco = json.load(f)
    by_image: dict[int, list[dict]] = {}
    for ann in coco["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    records = []
    for im in coco["images"]:
        anns = by_image.get(im["id"], [])
        if not anns:
            continue
        xywh = np.asarray([a["bbox"] for a in anns], dtype=np.float32).reshape(-1, 4)
        boxes = xywh_to_xyxy(xywh)
        labels = np.asarray([a["category_id"] for a in anns], dtype=np.int64)
        records.append(
            Record(
                path=str(dataset.images_dir / im["file_name"]),
                width=int(im["width"]),
                height=int(im["height"]),
                boxes_xyxy=boxes,
                labels=labels,
            )
        )
    return records
