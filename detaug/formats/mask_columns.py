"""COCO segmentations as columns (:class:`MaskColumns`): the ``segmentation`` of every box of a
dataset, not decoded, as plain number arrays with offsets (no Python object, no pickle), so that
the annotation cache (:mod:`detaug.formats.coco_cache`) holds them memory-mapped.

For ``M`` boxes, ``P`` polygons (every box's, back to back)::

    seg_kind    int8    [M]      0 polygons, 1 RLE with a list of counts, 2 RLE with a counts string
    seg_size    int64   [M, 2]   an RLE's declared [h, w]; (0, 0) for polygons
    seg_polys   int64   [M + 1]  box j's polygons are polygons seg_polys[j]:seg_polys[j + 1]
    poly_starts int64   [P + 1]  polygon p's coordinates are poly_coords[poly_starts[p]:poly_starts[p + 1]]
    poly_coords float64 [C]      x1, y1, x2, y2, ... as the JSON gives them (ints kept exactly)
    seg_ints    int64   [M + 1]  box j's RLE counts (kind 1) are rle_ints[seg_ints[j]:seg_ints[j + 1]]
    rle_ints    int64   [I]
    seg_chars   int64   [M + 1]  box j's RLE counts string (kind 2) is rle_chars[seg_chars[j]:seg_chars[j + 1]], UTF-8
    rle_chars   uint8   [B]

:meth:`MaskColumns.segmentation` gives box ``j``'s value back as ``load_coco(..., masks=True)``
reads it (an RLE as ``{"size": [h, w], "counts": ...}``: other keys of the JSON dict are not
kept; pycocotools reads only these two); :meth:`MaskColumns.check` checks the arrays of a cache
as a fresh parse checks the JSON (:func:`detaug.masks.segmentation_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The arrays' names (as the cache's ``.npy`` files are named).
SEG_ARRAYS = ("seg_kind", "seg_size", "seg_polys", "poly_starts", "poly_coords", "seg_ints", "rle_ints",
              "seg_chars", "rle_chars")
POLYGONS, RLE_INTS, RLE_STRING = 0, 1, 2


@dataclass
class MaskColumns:
    """The ``segmentation`` of ``M`` boxes as columns (the layout in the module docstring)."""

    seg_kind: np.ndarray
    seg_size: np.ndarray
    seg_polys: np.ndarray
    poly_starts: np.ndarray
    poly_coords: np.ndarray
    seg_ints: np.ndarray
    rle_ints: np.ndarray
    seg_chars: np.ndarray
    rle_chars: np.ndarray

    def __len__(self) -> int:
        return len(self.seg_kind)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in SEG_ARRAYS}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> MaskColumns | None:
        """The columns among ``arrays`` (``None``: they hold no segmentations)."""
        if "seg_kind" not in arrays:
            return None
        return cls(*(arrays[name] for name in SEG_ARRAYS))

    @classmethod
    def from_segmentations(cls, segmentations: Sequence[Any]) -> MaskColumns:
        """The columns of well-formed segmentation values (:func:`detaug.masks.segmentation_problem`
        says none); ``ValueError`` for a number beyond int64."""
        m = len(segmentations)
        kind = np.zeros(m, np.int8)
        size = np.zeros((m, 2), np.int64)
        polys, ints, chars = np.zeros(m + 1, np.int64), np.zeros(m + 1, np.int64), np.zeros(m + 1, np.int64)
        lengths: list[int] = []
        coords: list[float] = []
        counts: list[int] = []
        text: list[bytes] = []
        n_ints = n_chars = 0
        for j, seg in enumerate(segmentations):
            if isinstance(seg, dict):
                size[j] = [int(x) for x in seg["size"]]
                if isinstance(seg["counts"], str):
                    kind[j] = RLE_STRING
                    text.append(seg["counts"].encode("utf-8"))
                    n_chars += len(text[-1])
                else:
                    kind[j] = RLE_INTS
                    counts.extend(seg["counts"])
                    n_ints += len(seg["counts"])
            else:
                for poly in seg:
                    lengths.append(len(poly))
                    coords.extend(poly)
            polys[j + 1], ints[j + 1], chars[j + 1] = len(lengths), n_ints, n_chars
        try:
            rle_ints = np.array(counts, dtype=np.int64)
        except OverflowError:
            raise ValueError("an RLE count beyond int64") from None
        return cls(kind, size, polys, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
                   np.array(coords, dtype=np.float64), ints, rle_ints, chars,
                   np.frombuffer(b"".join(text), np.uint8).copy())

    def segmentation(self, j: int) -> Any:
        """Box ``j``'s ``segmentation``: polygons ``[[x1, y1, ...], ...]`` (floats) or an RLE
        ``{"size": [h, w], "counts": [...] or "..."}``."""
        kind = int(self.seg_kind[j])
        if kind == POLYGONS:
            a, b = int(self.seg_polys[j]), int(self.seg_polys[j + 1])
            starts = np.asarray(self.poly_starts[a:b + 1], dtype=np.int64)
            if not len(starts):
                return []
            flat = np.asarray(self.poly_coords[starts[0]:starts[-1]], dtype=np.float64)
            return [flat[s - starts[0]:e - starts[0]].tolist() for s, e in zip(starts[:-1], starts[1:])]
        size = [int(x) for x in self.seg_size[j]]
        if kind == RLE_INTS:
            return {"size": size, "counts": np.asarray(self.rle_ints[int(self.seg_ints[j]):int(self.seg_ints[j + 1])],
                                                       dtype=np.int64).tolist()}
        chars = self.rle_chars[int(self.seg_chars[j]):int(self.seg_chars[j + 1])]
        return {"size": size, "counts": bytes(chars).decode("utf-8")}

    def check(self, count: int) -> str:
        """Why these columns are not the segmentations of ``count`` boxes that a fresh parse
        would accept (``""``: they are): shapes and dtypes, offsets that start at 0, never
        decrease and end at their array's length, kinds 0..2, each box's offsets of other kinds
        empty, and every value rebuilt passing :func:`detaug.masks.segmentation_problem`."""
        from detaug.masks import segmentation_problem

        dtypes = {"seg_kind": np.int8, "seg_size": np.int64, "poly_coords": np.float64, "rle_chars": np.uint8}
        for name in SEG_ARRAYS:
            arr = getattr(self, name)
            if arr.dtype != np.dtype(dtypes.get(name, np.int64)):
                return f"{name} is {arr.dtype}"
        if self.seg_kind.shape != (count,) or self.seg_size.shape != (count, 2):
            return f"seg_kind / seg_size do not have one row per box ({count})"
        for offsets, target in (("seg_polys", len(self.poly_starts) - 1), ("poly_starts", len(self.poly_coords)),
                                ("seg_ints", len(self.rle_ints)), ("seg_chars", len(self.rle_chars))):
            o = np.asarray(getattr(self, offsets))
            rows = count + 1 if offsets != "poly_starts" else len(o)
            if o.ndim != 1 or len(o) != rows or not len(o) or o[0] != 0 or o[-1] != target or (np.diff(o) < 0).any():
                return f"{offsets} are not offsets into their array"
        kind = np.asarray(self.seg_kind)
        if not np.isin(kind, (POLYGONS, RLE_INTS, RLE_STRING)).all():
            return "a seg_kind other than 0, 1, 2"
        for offsets, own in (("seg_polys", POLYGONS), ("seg_ints", RLE_INTS), ("seg_chars", RLE_STRING)):
            if (np.diff(np.asarray(getattr(self, offsets)))[kind != own] != 0).any():
                return f"{offsets} give a box values of another kind"
        if ((kind == POLYGONS) & np.asarray(self.seg_size).any(axis=1)).any():
            return "a polygons box with an RLE size"
        for j in range(count):
            try:
                seg = self.segmentation(j)
            except UnicodeDecodeError:
                return f"box {j}: an RLE counts string that is not UTF-8"
            why = segmentation_problem(seg)
            if why:
                return f"box {j}: {why}"
        return ""
