"""Generated detection datasets with exactly known boxes.

Every image is a flat grey background with solid-coloured, non-overlapping rectangles. Each object
in an image has its own colour from :data:`PALETTE`, so its pixels can be found again by colour
after augmentation, and its box is known exactly because the rectangle has integer pixel edges.

Box conventions
---------------
* In Python (``SyntheticObject.box_xyxy``) and in COCO files, boxes live in continuous pixel
  coordinates: pixel ``i`` spans ``[i, i + 1)``. A rectangle filling pixel columns ``x0 .. x1 - 1``
  and rows ``y0 .. y1 - 1`` has box ``(x0, y0, x1, y1)``; in COCO this is
  ``bbox = [x0, y0, x1 - x0, y1 - y0]``.
* VOC XML files hold 1-based inclusive pixel indices: ``xmin = x0 + 1``, ``ymin = y0 + 1``,
  ``xmax = x1``, ``ymax = y1``. Back to boxes: ``x0 = xmin - 1``, ``w = xmax - xmin + 1``.

Entry points
------------
* :func:`make_scene` draws one image in memory.
* :func:`write_voc_dataset` writes a small VOC-style folder (for converter and pipeline tests).
* :func:`write_coco_dataset` writes a COCO-style JPEG dataset (for benchmarks and the demo).

All generators are deterministic for a given seed and arguments.

Modules: :mod:`detaug.synthetic_scenes` draws the scenes (and holds the checks the writers
share), :mod:`detaug.synthetic_voc` and :mod:`detaug.synthetic_coco` write the datasets; every
public name is importable from here.
"""

from __future__ import annotations

from detaug.synthetic_coco import write_coco_dataset
from detaug.synthetic_scenes import (
    BACKGROUND,
    DEFAULT_CLASSES,
    PALETTE,
    SizeSpec,  # noqa: F401 - public before the split
    SyntheticImage,
    SyntheticObject,
    make_scene,
)
from detaug.synthetic_voc import DEFAULT_SPLITS, write_voc_dataset  # noqa: F401 - DEFAULT_SPLITS: public before the split

__all__ = [
    "BACKGROUND",
    "DEFAULT_CLASSES",
    "PALETTE",
    "SyntheticImage",
    "SyntheticObject",
    "make_scene",
    "write_coco_dataset",
    "write_voc_dataset",
]
