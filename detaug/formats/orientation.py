"""EXIF orientation geometry and the frame of an annotation's boxes: the stored-to-displayed
matrix of each orientation (:func:`exif_matrix`), boxes mapped by it (:func:`orient_boxes`),
orientations in words, and which frame, stored or displayed, an annotation's boxes are in
(:func:`annotation_frame`, :func:`explain_frame`). Conventions: :mod:`detaug.formats.images`.
numpy is imported when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from detaug.formats.image_info import ImageInfo

__all__ = ["ORIENTATIONS", "exif_matrix", "orient_boxes", "annotation_frame", "explain_frame",
           "describe_orientation"]

#: How the frame of an image's boxes is chosen (see :func:`annotation_frame`).
ORIENTATIONS = ("auto", "apply", "ignore")


def exif_matrix(orientation: int, stored_hw: tuple[int, int]) -> np.ndarray:
    """float64 ``[3, 3]``: homogeneous stored pixel coordinates ``(x, y, 1)`` -> displayed
    coordinates, for an image of stored ``(height, width)``, continuous coordinates (the
    corner ``(0, 0)`` and ``(W, H)`` map to corners).

    ====  ====================================  =======================
    k     to display the stored pixels          displayed ``(x', y')``
    ====  ====================================  =======================
    1     nothing                               ``(x, y)``
    2     mirror left-right                     ``(W - x, y)``
    3     rotate 180°                           ``(W - x, H - y)``
    4     mirror top-bottom                     ``(x, H - y)``
    5     transpose (mirror + rotate 90° CCW)   ``(y, x)``
    6     rotate 90° clockwise                  ``(H - y, x)``
    7     transverse (mirror + rotate 90° CW)   ``(H - y, W - x)``
    8     rotate 90° counter-clockwise          ``(y, W - x)``
    ====  ====================================  =======================

    This is what ``PIL.ImageOps.exif_transpose`` and DALI's decoder do (tested on all eight).
    """
    import numpy as np

    h, w = float(stored_hw[0]), float(stored_hw[1])
    rows = {
        1: ((1, 0, 0), (0, 1, 0)),
        2: ((-1, 0, w), (0, 1, 0)),
        3: ((-1, 0, w), (0, -1, h)),
        4: ((1, 0, 0), (0, -1, h)),
        5: ((0, 1, 0), (1, 0, 0)),
        6: ((0, -1, h), (1, 0, 0)),
        7: ((0, -1, h), (-1, 0, w)),
        8: ((0, 1, 0), (-1, 0, w)),
    }.get(orientation)
    if rows is None:
        raise ValueError(f"EXIF orientation must be 1..8, got {orientation!r}")
    return np.array([*rows, (0, 0, 1)], dtype=np.float64)


_ORIENTATION_TEXTS = {
    1: "as stored", 2: "mirrored left-right", 3: "rotated 180°", 4: "mirrored top-bottom",
    5: "transposed", 6: "rotated 90° clockwise", 7: "transversed",
    8: "rotated 90° counter-clockwise",
}


def describe_orientation(orientation: int) -> str:
    """How an EXIF orientation displays the stored pixels, in words (``6``: "rotated 90°
    clockwise")."""
    return _ORIENTATION_TEXTS.get(orientation, f"unknown orientation {orientation}")


def orient_boxes(boxes_xyxy: Any, orientation: int, stored_hw: tuple[int, int]) -> np.ndarray:
    """float32 ``[N, 4]``: ``xyxy`` boxes of the stored frame mapped to the displayed frame
    (:func:`exif_matrix`; each orientation maps axis-aligned boxes to axis-aligned boxes)."""
    import numpy as np

    boxes = np.asarray(boxes_xyxy, dtype=np.float64)
    if boxes.size % 4 or (boxes.ndim != 1 and boxes.shape[-1] != 4):
        raise ValueError(f"boxes must be [N, 4] xyxy, got shape {boxes.shape}")
    boxes = boxes.reshape(-1, 4)
    m = exif_matrix(orientation, stored_hw)
    corners = np.stack([boxes[:, [0, 1]], boxes[:, [2, 3]]], axis=1)  # [N, 2, 2]
    mapped = corners @ m[:2, :2].T + m[:2, 2]
    return np.concatenate([mapped.min(axis=1), mapped.max(axis=1)], axis=1).astype(np.float32)


# Why a frame was chosen (stable texts: reports count them).
WHY_APPLY = 'orientation "apply"'
WHY_IGNORE = 'orientation "ignore"'
WHY_DECLARED_STORED = "declared size is the stored size"
WHY_DECLARED_DISPLAYED = "declared size is the displayed size"
WHY_NO_DECLARED = "no declared size (default: stored)"
WHY_SAME_SIZE = "stored and displayed sizes are equal (default: stored)"
WHY_NEITHER = "declared size is neither the stored nor the displayed size (default: stored)"


def explain_frame(declared_hw: tuple[int, int] | None, info: ImageInfo,
                  orientation: str) -> tuple[str, str]:
    """``(frame, why)``: :func:`annotation_frame` and the rule that decided it (one of the
    ``WHY_*`` texts of this module)."""
    if orientation == "apply":
        return "displayed", WHY_APPLY
    if orientation == "ignore":
        return "stored", WHY_IGNORE
    if orientation != "auto":
        raise ValueError(f"orientation must be one of {', '.join(ORIENTATIONS)}, "
                         f"got {orientation!r}")
    stored, displayed = tuple(info.stored_hw), info.displayed_hw
    if declared_hw is None:
        return "stored", WHY_NO_DECLARED
    declared = (int(declared_hw[0]), int(declared_hw[1]))
    if stored == displayed:
        return "stored", WHY_SAME_SIZE
    if declared == stored:
        return "stored", WHY_DECLARED_STORED
    if declared == displayed:
        return "displayed", WHY_DECLARED_DISPLAYED
    return "stored", WHY_NEITHER


def annotation_frame(declared_hw: tuple[int, int] | None, info: ImageInfo,
                     orientation: str) -> str:
    """``"stored"`` or ``"displayed"``: the frame an annotation's boxes are in.

    ``orientation="apply"``: displayed; ``"ignore"``: stored; ``"auto"``: the declared
    ``(height, width)`` decides (equal to the stored size and not the displayed one: stored;
    the reverse: displayed); undecidable (no declared size, a square image or an orientation
    that keeps the size, a declared size matching neither) gives "stored", what Pillow,
    labelImg and ``torchvision.io.decode_jpeg`` show by default. Raises ``ValueError`` for an
    ``orientation`` not in :data:`ORIENTATIONS`.
    """
    return explain_frame(declared_hw, info, orientation)[0]
