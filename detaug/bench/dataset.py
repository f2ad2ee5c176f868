"""The COCO-style JPEG dataset every variant reads: an existing folder or a generated one.

Layout (as written by :func:`detaug.synthetic.write_coco_dataset`)::

    root/images/*.jpg
    root/annotations.json      COCO instances; bbox = [x, y, w, h] in absolute pixels
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["BenchDataset", "Record", "default_cache_dir", "load_records", "prepare_dataset"]

GENERATED_SIZE = (600, 420)
GENERATED_OBJECTS = (1, 11)


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

    def describe(self) -> str:
        """One line: count, sizes, boxes per image, mean JPEG size, origin and path."""
        if self.min_size == self.max_size:
            sizes = f"{self.min_size[0]}x{self.min_size[1]}"
        else:
            sizes = f"{self.min_size[0]}x{self.min_size[1]} to {self.max_size[0]}x{self.max_size[1]}"
        per_image = self.num_boxes / max(self.num_images, 1)
        kib = self.total_bytes / max(self.num_images, 1) / 1024
        origin = "generated (detaug.synthetic)" if self.generated else "given with --data"
        return (
            f"{self.num_images} COCO-style JPEGs, {sizes}, {per_image:.1f} boxes/image "
            f"(max {self.max_boxes}), {kib:.0f} KiB/image, {origin}: {self.root}"
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
        }


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/detaug/bench`` (``~/.cache/detaug/bench`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "detaug" / "bench"


def prepare_dataset(
    data: str | os.PathLike[str] | None = None,
    *,
    num_images: int = 2048,
    cache_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    progress: bool = True,
) -> BenchDataset:
    """Return the dataset at ``data``, or generate (once) and cache a synthetic one.

    Args:
        data: folder holding ``annotations.json`` and ``images/``; ``None`` generates
            ``num_images`` synthetic 600x420 JPEGs with 1-11 boxes each into
            ``cache_dir/synthetic-coco-<num_images>-600x420-seed<seed>`` (reused when present).
        num_images: images to generate when ``data`` is ``None`` (``>= 1``).
        cache_dir: where generated datasets are kept; :func:`default_cache_dir` by default.
        seed: generator seed.
        progress: show the generator's progress bar.
    """
    if data is not None:
        root = Path(data)
        if not (root / "annotations.json").is_file() or not (root / "images").is_dir():
            raise ValueError(
                f"--data {root} should hold annotations.json and images/ "
                "(the layout detaug.synthetic.write_coco_dataset writes)"
            )
        return _summarize(root, generated=False)
    if not isinstance(num_images, int) or num_images < 1:
        raise ValueError(f"num_images should be a positive int, got {num_images!r}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    width, height = GENERATED_SIZE
    root = cache / f"synthetic-coco-{num_images}-{width}x{height}-seed{seed}"
    if not (root / "annotations.json").is_file():
        _generate(root, num_images=num_images, seed=seed, progress=progress)
    return _summarize(root, generated=True)


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
        boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
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
