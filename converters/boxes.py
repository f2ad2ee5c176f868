"""VOC ``<bndbox>`` -> COCO ``bbox``: the coordinate convention, clipping and degenerate boxes.

COCO ``bbox`` is ``[x, y, w, h]`` in continuous pixel coordinates: pixel ``i`` spans ``[i, i + 1)``,
so an image of width ``W`` spans ``[0, W]``.

Two conventions for the values written in ``<bndbox>``:

* ``"voc"`` (default, the VOC devkit's): 1-based inclusive pixel indices. Pixel ``xmin`` of VOC is
  pixel ``xmin - 1`` of COCO and the box ends after pixel ``xmax``::

      x = xmin - 1      w = xmax - xmin + 1
      y = ymin - 1      h = ymax - ymin + 1

  A single-point box (``xmin == xmax``, ``ymin == ymax``) is one pixel, 1x1.
* ``"raw"``: the values are continuous corner coordinates already (CVAT/pylabel-style exports)::

      x = xmin          w = xmax - xmin
      y = ymin          h = ymax - ymin

Processing order, one box at a time:

1. convention -> corners ``(x0, y0, x1, y1)`` in COCO space;
2. ``x1 <= x0`` or ``y1 <= y0`` -> skipped, reason ``zero-size box``;
3. clip the corners to ``[0, W] x [0, H]``; a warning ``box clipped to the image`` if one moved;
4. nothing left after clipping -> skipped, reason ``box outside the image``;
5. ``[x0, y0, x1 - x0, y1 - y0]``, rounded to 1e-6 px (drops float noise such as
   ``38.99000000000001``); ``area = w * h``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from converters import report as R

Coords = Literal["voc", "raw"]
COORDS: tuple[str, ...] = ("voc", "raw")

_DECIMALS = 6


class CocoBox(NamedTuple):
    """Outcome for one box: ``bbox`` (``[x, y, w, h]``) and ``area``, or ``skip_reason``.

    ``clipped`` says whether step 3 moved a corner; ``corners`` are the step-1 corners
    ``(x0, y0, x1, y1)`` before clipping, for messages.
    """

    bbox: list[float] | None
    area: float
    clipped: bool
    skip_reason: str | None
    corners: tuple[float, float, float, float]


def voc_box_to_coco(box_voc: tuple[float, float, float, float], coords: Coords,
                    width: int, height: int) -> CocoBox:
    """Convert ``(xmin, ymin, xmax, ymax)`` as written in VOC into a COCO box in a
    ``width x height`` image, following the numbered steps of the module docstring."""
    xmin, ymin, xmax, ymax = box_voc
    # 1. corners (``+ 0.0`` makes floats of ints and 0.0 of -0.0)
    if coords == "voc":
        x0, y0, x1, y1 = xmin - 1.0, ymin - 1.0, xmax + 0.0, ymax + 0.0
    else:
        x0, y0, x1, y1 = xmin + 0.0, ymin + 0.0, xmax + 0.0, ymax + 0.0
    corners = (x0, y0, x1, y1)
    # 2. empty before clipping
    if x1 <= x0 or y1 <= y0:
        return CocoBox(None, 0.0, False, R.ZERO_SIZE_BOX, corners)
    # 3. clip (inlined: this runs once per box)
    right, bottom = float(width), float(height)
    cx0 = 0.0 if x0 <= 0.0 else (right if x0 > right else x0)
    cy0 = 0.0 if y0 <= 0.0 else (bottom if y0 > bottom else y0)
    cx1 = 0.0 if x1 <= 0.0 else (right if x1 > right else x1)
    cy1 = 0.0 if y1 <= 0.0 else (bottom if y1 > bottom else y1)
    clipped = cx0 != x0 or cy0 != y0 or cx1 != x1 or cy1 != y1
    # 4. empty after clipping
    if cx1 <= cx0 or cy1 <= cy0:
        return CocoBox(None, 0.0, clipped, R.BOX_OUTSIDE_IMAGE, corners)
    # 5. xywh (integer corners need no rounding: the common case, kept fast)
    if cx0.is_integer() and cy0.is_integer() and cx1.is_integer() and cy1.is_integer():
        w, h = cx1 - cx0, cy1 - cy0
        return CocoBox([cx0, cy0, w, h], w * h, clipped, None, corners)
    w = round(cx1 - cx0, _DECIMALS)
    h = round(cy1 - cy0, _DECIMALS)
    if w <= 0.0 or h <= 0.0:  # thinner than the rounding step
        return CocoBox(None, 0.0, clipped, R.ZERO_SIZE_BOX, corners)
    bbox = [round(cx0, _DECIMALS), round(cy0, _DECIMALS), w, h]
    return CocoBox(bbox, round(w * h, _DECIMALS), clipped, None, corners)
