"""A batch read and checked, before it is planned: the pieces :class:`~detaug.planning.BatchPlanner`
builds a batch from (the steps are those of :mod:`detaug.planning`'s module docstring).

:class:`_Rows` (an image's labels and fields, row for row), :class:`_Findings` (what a batch
records of the images it reads), :class:`_Gathered` (a batch ready for ``plan_batch``),
:func:`_row_labels` (step 6), the output boxes' clean-up (:func:`_boxes_from_masks`,
:func:`_without_noise`, step 7), the boxes checked against a decoded image
(:func:`_clip_to_image`), the placeholder image of a partner not needed and the reason an
image could not be read.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from detaug.formats.report import BOX_CLIPPED, BOX_OUTSIDE, Report
from detaug.formats.validation import check_boxes
from detaug.masks import masks_to_boxes
from detaug.plan import Partners


_PLACEHOLDERS: dict[bool, np.ndarray] = {}


def _placeholder(decoded: bool) -> np.ndarray:
    """A 1x1 grey (114) image: ``uint8 [1, 1, 3]``, or its PNG bytes ``uint8 [L]`` (read-only, cached)."""
    if decoded not in _PLACEHOLDERS:
        pixel = np.full((1, 1, 3), 114, dtype=np.uint8)
        if decoded:
            image = pixel
        else:
            from PIL import Image

            buffer = io.BytesIO()
            Image.fromarray(pixel).save(buffer, format="PNG")
            image = np.frombuffer(buffer.getvalue(), dtype=np.uint8)
        image.flags.writeable = False
        _PLACEHOLDERS[decoded] = image
    return _PLACEHOLDERS[decoded]


@dataclass
class _Rows:
    """An image's boxes' labels (int64 ``[N]``) and fields (``{name: [N, ...]}``), row for row."""

    labels: np.ndarray
    fields: dict[str, np.ndarray]

    def take(self, rows: np.ndarray) -> _Rows:
        """The rows ``rows`` (indices or a boolean mask)."""
        return _Rows(self.labels[rows], {name: arr[rows] for name, arr in self.fields.items()})


class _Findings:
    """What one batch records of the images it reads (*Findings* in :mod:`detaug.planning`):
    the skipped images and repaired boxes of the positions ``records(position)`` says are its
    own, each position once."""

    def __init__(self, records: Any) -> None:
        self.records = records
        self.skipped: list[dict[str, Any]] = []
        self.repaired: list[dict[str, Any]] = []
        self.last: dict[str, Any] | None = None  # the last unreadable image met, recorded or not
        self._seen: set[tuple[str, int]] = set()

    def skip(self, position: int, found: dict[str, Any]) -> None:
        """Image ``position`` cannot be read (``found``: its image id, file and reason)."""
        self.last = found
        if self._first("skip", position):
            self.skipped.append(found)

    def repair(self, position: int, found: list[dict[str, Any]]) -> None:
        """Boxes of image ``position`` were repaired when it was read (``found``: by reason)."""
        if found and self._first("repair", position):
            self.repaired.extend(found)

    def _first(self, kind: str, position: int) -> bool:
        key = (kind, int(position))
        if key in self._seen or not self.records(position):
            return False
        self._seen.add(key)
        return True


@dataclass
class _Gathered:
    """A batch read and checked, not yet planned (:meth:`~detaug.planning.BatchPlanner._gather`): what
    :meth:`~detaug.transforms.Compose.plan_batch` takes (``shapes``, ``boxes``, ``rows``,
    ``keys``, ``partners``), and what the plan is assembled with (``lookup``: per sample the
    labels and fields its kept rows index; the data, positions and findings)."""

    epoch: int
    step: int
    positions: np.ndarray
    image_ids: np.ndarray
    keys: np.ndarray
    data: list[np.ndarray]
    shapes: list[tuple[int, int]]
    boxes: list[np.ndarray]
    rows: list[np.ndarray]
    lookup: list[_Rows]
    partners: Partners | None
    partner_data: list[list[np.ndarray] | None]
    partner_positions: np.ndarray
    skipped: list[dict[str, Any]]
    repaired: list[dict[str, Any]]

    def plan_inputs(self) -> tuple[list, list, list, np.ndarray, Partners | None]:
        """The arguments of ``plan_batch`` for these samples."""
        return self.shapes, self.boxes, self.rows, self.keys, self.partners

    @staticmethod
    def joined_inputs(batches: list[_Gathered]) -> tuple[list, list, list, np.ndarray, Partners | None]:
        """The arguments of one ``plan_batch`` call for the samples of ``batches``, in order
        (partner slots must not be batch positions)."""
        partners = None
        if batches[0].partners is not None:
            slots = range(len(batches[0].partners.shapes))
            partners = Partners(*([[x for g in batches for x in getattr(g.partners, name)[k]] for k in slots]
                                  for name in ("shapes", "boxes", "labels")))
        return ([s for g in batches for s in g.shapes], [b for g in batches for b in g.boxes],
                [r for g in batches for r in g.rows], np.concatenate([g.keys for g in batches]), partners)


def _row_labels(tables: list[_Rows], partner_tables: list[list[_Rows]]) -> tuple[list[list[np.ndarray]], list[_Rows]]:
    """The labels to plan with, and what the kept ones index (step 6 of :mod:`detaug.planning`).

    Sample ``i``'s boxes (its own, then each partner slot's) are numbered ``0 .. T_i - 1`` in
    that order: ``rows[0][i]`` are its own rows, ``rows[1 + k][i]`` partner slot ``k``'s; the
    labels and fields of all of them, concatenated in the same order, are ``lookup[i]``, so
    that the kept rows index them whatever order the recipe returns its boxes in."""
    j = len(partner_tables)
    rows: list[list[np.ndarray]] = [[] for _ in range(1 + j)]
    lookup = []
    for i, own in enumerate(tables):
        parts = [own] + [partner_tables[k][i] for k in range(j)]
        start = 0
        for slot, part in enumerate(parts):
            rows[slot].append(np.arange(start, start + len(part.labels), dtype=np.int64))
            start += len(part.labels)
        if j == 0:
            lookup.append(own)
            continue
        fields = {}
        for name, arr in own.fields.items():  # a partner without the field (not of the source's kind): -1 rows
            fields[name] = np.concatenate([
                part.fields[name] if name in part.fields else np.full((len(part.labels), *arr.shape[1:]), -1, arr.dtype)
                for part in parts])
        lookup.append(_Rows(np.concatenate([part.labels for part in parts]), fields))
    return rows, lookup


def _boxes_from_masks(boxes: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """float32 ``[M, 4]``: each box replaced by its moved mask's bounds
    (:func:`detaug.masks.masks_to_boxes`), kept where its mask is empty."""
    tight = masks_to_boxes(masks)
    empty = ~np.asarray(masks).reshape(len(masks), -1).any(axis=1)
    return np.where(empty[:, None], boxes, tight).astype(np.float32)


def _without_noise(boxes: np.ndarray) -> np.ndarray:
    """float32 ``[M, 4]`` xyxy output boxes with each near edge that lies below float32's
    resolution at its far edge (``|x1| < spacing(x2) / 2``, likewise ``y1``) set to 0 (step 7 of
    :mod:`detaug.planning`: the float64 rounding of the exact border rule, ``1e-15`` for 0)."""
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    near, far = b[:, :2], b[:, 2:]
    noise = (near != 0) & (np.abs(near) < np.spacing(np.abs(far)) / 2)
    if not noise.any():
        return b
    b = b.copy()
    b[:, :2][noise] = 0.0
    return b


def _clip_to_image(boxes: np.ndarray, hw: tuple[int, int], file: str, image_id: int,
                   repaired: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Boxes checked against the decoded image ``hw`` by the sources' own rule
    (:func:`detaug.formats.validation.check_boxes`: clipped, or dropped when no area is left):
    ``(the boxes kept, bool [N] which rows were kept)``; each repair is recorded with its count."""
    report = Report(file)
    sizes = np.tile(np.asarray(hw, dtype=np.float64), (len(boxes), 1))
    checked, keep = check_boxes(boxes, sizes, report, lambda j: (file, image_id, None))
    for reason in (BOX_CLIPPED, BOX_OUTSIDE):
        if report.counts[reason]:
            repaired.append({"image_id": image_id, "file": file, "reason": reason, "count": report.counts[reason]})
    return checked[keep], keep


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError):  # the ImageError names the file: the cause's words, without the path again
        cause = err.__cause__ if isinstance(err.__cause__, OSError) else err
        return f"cannot read the file: {cause.strerror or cause}"
    return str(err)
