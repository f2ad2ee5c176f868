"""The instance masks of the ``masks`` recipe's rows (``detaug bench --recipes masks``).

The bench's photos (the real Pascal VOC folders, the synthetic scenes) have boxes only, so each
box is given a mask: the polygon of the ellipse inscribed in it (:data:`ELLIPSE_POINTS` vertices,
COCO ``segmentation`` polygon form, in the box's continuous pixel coordinates). The loader reads
them with ``CocoSource(..., masks=True)``, rasterises them with pycocotools when an image is read
and moves them with their boxes (:mod:`detaug.masks`): the row times that work beside the
default recipe's, on the same photos.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["ELLIPSE_POINTS", "ellipse_polygon", "write_ellipse_masks"]

#: Vertices of each ellipse polygon.
ELLIPSE_POINTS = 32


def ellipse_polygon(bbox: list[float], points: int = ELLIPSE_POINTS) -> list[float]:
    """The COCO polygon ``[x1, y1, x2, y2, ...]`` of the ellipse inscribed in the COCO box
    ``bbox`` ``[x, y, w, h]`` (continuous pixels): ``points`` vertices, counter-clockwise from
    the right end of its horizontal axis."""
    x, y, w, h = (float(c) for c in bbox)
    t = np.linspace(0.0, 2.0 * np.pi, points, endpoint=False)
    xs, ys = x + w / 2 * (1 + np.cos(t)), y + h / 2 * (1 - np.sin(t))
    return np.stack([xs, ys], axis=1).reshape(-1).tolist()


def write_ellipse_masks(annotations_file: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write to ``out`` the COCO file ``annotations_file`` with each annotation's
    ``segmentation`` the polygon of the ellipse inscribed in its ``bbox`` (one polygon each);
    returns ``out``."""
    doc = json.loads(Path(annotations_file).read_text(encoding="utf-8"))
    for ann in doc.get("annotations", []):
        ann["segmentation"] = [ellipse_polygon(ann["bbox"])]
    out = Path(out)
    out.write_text(json.dumps(doc), encoding="utf-8")
    return out
