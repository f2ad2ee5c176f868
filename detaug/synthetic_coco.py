"""Write a COCO-style JPEG detection dataset of synthetic scenes (:func:`write_coco_dataset`).

COCO boxes are ``bbox = [x0, y0, x1 - x0, y1 - y0]`` for the box ``(x0, y0, x1, y1)`` of
:mod:`detaug.synthetic_scenes` (continuous pixels: pixel ``i`` spans ``[i, i + 1)``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from detaug.synthetic_scenes import (
    DEFAULT_CLASSES,
    PALETTE,
    SizeSpec,
    _check_classes,
    _check_int,
    _check_size,
    _draw_size,
    _save_image,
    make_scene,
)

__all__ = ["write_coco_dataset"]


def write_coco_dataset(
    root: str | os.PathLike[str],
    *,
    num_images: int = 2048,
    size: tuple[SizeSpec, SizeSpec] = (600, 420),
    min_objects: int = 1,
    max_objects: int = 11,
    seed: int = 0,
    classes: Sequence[str] = DEFAULT_CLASSES,
    jpeg_quality: int = 90,
    progress: bool = True,
) -> Path:
    """Write a COCO-style JPEG detection dataset of synthetic scenes.

    Layout::

        root/images/<id:06d>.jpg   JPEG, quality ``jpeg_quality``, 4:2:0 chroma (as most photos)
        root/annotations.json      COCO instances file

    The JSON holds ``info``, ``licenses``, ``images`` (``id`` from 1, ``file_name`` relative to
    ``root/images``, ``width``, ``height``, ``license``), ``annotations`` (``id`` from 1,
    ``image_id``, ``category_id``, ``bbox = [x, y, w, h]`` in absolute pixels with pixel ``i``
    spanning ``[i, i + 1)``, ``area = w * h``, ``iscrowd = 0``, and the rectangle as a
    ``segmentation`` polygon) and ``categories`` (``id`` from 1 in the order of ``classes``,
    ``name``, ``supercategory``). Every image has at least ``min_objects`` annotations. The
    output is the same for the same seed and arguments.

    Args:
        root: output folder, created if missing; existing files of the same names are replaced.
        num_images: number of images (``>= 1``). 2048 images of 600x420 take roughly 10 s.
        size: ``(width, height)``; each entry is a fixed pixel count or an inclusive
            ``(low, high)`` range drawn uniformly per image.
        min_objects: fewest objects per image (``>= 1``).
        max_objects: most objects per image (``<= len(PALETTE)``).
        seed: seed of ``np.random.default_rng``.
        classes: category names; category ``k`` (1-based) is ``classes[k - 1]``.
        jpeg_quality: JPEG quality, 1..100.
        progress: show a tqdm progress bar.

    Returns:
        The path of ``annotations.json`` (the images are in ``root / "images"``).
    """
    _check_int("num_images", num_images, low=1)
    _check_int("jpeg_quality", jpeg_quality, low=1, high=100)
    _check_int("max_objects", max_objects, low=1, high=len(PALETTE))
    _check_int("min_objects", min_objects, low=1, high=max_objects)
    classes = _check_classes(classes)
    _check_size(size)

    root = Path(root)
    images_dir = root / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    category_ids = {name: k for k, name in enumerate(classes, start=1)}

    rng = np.random.default_rng(seed)
    images: list[dict] = []
    annotations: list[dict] = []
    for image_id in tqdm(
        range(1, num_images + 1), desc="synthetic COCO", unit="img", disable=not progress
    ):
        name = f"{image_id:06d}"
        width, height = _draw_size(rng, size)
        image, meta = make_scene(
            rng, width, height, max_objects, classes, min_objects=min_objects, name=name
        )
        file_name = f"{name}.jpg"
        _save_image(image, images_dir / file_name, jpeg_quality=jpeg_quality, subsampling=2)
        images.append(
            {"id": image_id, "file_name": file_name, "width": width, "height": height, "license": 1}
        )
        for obj in meta.objects:
            x0, y0, x1, y1 = obj.box_xyxy
            w, h = x1 - x0, y1 - y0
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category_ids[obj.label],
                    "bbox": [x0, y0, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                }
            )

    dataset = {
        "info": {
            "description": "detaug synthetic detection dataset",
            "version": "1.0",
            "contributor": "detaug.synthetic",
            "url": "",
        },
        "licenses": [{"id": 1, "name": "Synthetic data, no restrictions", "url": ""}],
        "images": images,
        "annotations": annotations,
        "categories": [
            {"id": k, "name": name, "supercategory": "object"} for name, k in category_ids.items()
        ],
    }
    annotations_path = root / "annotations.json"
    with annotations_path.open("w", encoding="utf-8") as f:
        json.dump(dataset, f)
    return annotations_path
