"""Class indices for the model from the source's category ids, and back (one place for both adapters).

A source's labels are category ids (``source.categories``: id -> name; COCO ids start at 1 and may
have gaps, e.g. 1..90 for 80 classes). A model wants class indices in a fixed range:

* KerasHub detectors (``DetectionSequence``) one-hot ``0 .. num_classes - 1``;
* torchvision detectors (``DetectionLoader``) take ``1 .. num_classes - 1``, index 0 being the
  background (torchvision's ``num_classes`` counts it).

:class:`LabelMap` maps the category ids to class indices (``label_map``):

``None`` (default): the identity: a label is the category id itself, as the source holds it.
    Index ``k`` stands for category id ``k``; indices that are no category id (gaps) stand for
    nothing.
``"contiguous"``: the category ids sorted ascending get ``first, first + 1, ...`` in that order
    (``first`` is 0 for Keras, 1 for torchvision), so ``n`` categories use ``first .. first + n - 1``.

The categories are the keys of ``source.categories``; when the source has none (a sample list
without names), the labels present in its samples, sorted, whose names are then ``str(id)``.

Both adapters expose the mapping as two lists indexed by class index (``class_names[label]`` and
``category_ids[label]`` work for every label the adapter yields):

``class_names``: the category's name; ``"__background__"`` at index 0 of a torchvision loader
    when index 0 is no category (torchvision's own convention); ``None`` for an identity gap.
``category_ids``: the category id (COCOeval's ``category_id``), ``-1`` where the index stands for
    no category (the background slot, an identity gap). With ``label_map=None`` it is the identity
    on the category ids: ``category_ids[k] == k`` for every category id ``k``.

``len(class_names)`` is the smallest ``num_classes`` a model can have for these labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["BACKGROUND", "LABEL_MAPS", "PAD_LABEL", "LabelMap"]

#: ``label_map`` values: ``None`` (category ids as they are) or ``"contiguous"``.
LABEL_MAPS = (None, "contiguous")

#: Name of torchvision's background class (index 0 of ``DetectionLoader``'s ``class_names``).
BACKGROUND = "__background__"

#: Padding label of Keras targets and KerasHub predictions: :meth:`LabelMap.to_category_ids` keeps it.
PAD_LABEL = -1

#: Longest identity ``class_names`` / ``category_ids`` lists (category ids up to this - 1).
MAX_IDENTITY_CLASSES = 1 << 20


class LabelMap:
    """Category ids <-> class indices for one source (see the module docstring).

    Args:
        categories: the source's names by category id (``source.categories``; may be empty).
        present: int ``[M]`` the labels found in the source's samples (any order, repeats allowed).
        label_map: ``None`` or ``"contiguous"`` (:data:`LABEL_MAPS`).
        first: the first class index of ``"contiguous"``: 0 (Keras, KerasHub), 1 (torchvision,
            0 being the background). With ``first=1``, index 0 is the background unless it is a
            category id (identity only).

    Raises:
        ValueError: an unknown ``label_map``; with ``"contiguous"``, a label present in the
            samples that is not one of ``categories``.
    """

    def __init__(self, categories: Mapping[int, str], present: np.ndarray, label_map: str | None = None,
                 *, first: int = 0) -> None:
        if label_map not in LABEL_MAPS:
            raise ValueError(f"label_map must be None or 'contiguous', got {label_map!r}")
        if first not in (0, 1):
            raise ValueError(f"first must be 0 or 1, got {first!r}")
        present = np.unique(np.asarray(present, dtype=np.int64).reshape(-1))
        if categories:
            names = {int(k): str(v) for k, v in categories.items()}
            ids = np.array(sorted(names), dtype=np.int64)
            unknown = np.setdiff1d(present, ids)
            if len(unknown):
                if label_map is not None:
                    raise ValueError(
                        f"label(s) {unknown[:5].tolist()} of the samples are not category ids of the source "
                        f"({_few(ids)}): label_map='contiguous' cannot map them")
                ids = np.union1d(ids, unknown)
                names.update({int(k): str(int(k)) for k in unknown})
        else:
            ids = present
            names = {int(k): str(int(k)) for k in ids}
        self.mode = label_map
        self.first = first
        self.ids = ids  # int64 [n] the categories, sorted
        self.names = names  # category id -> name
        self._lists: tuple[list[str | None], list[int]] | None = None

    @classmethod
    def from_source(cls, source: Any, label_map: str | None = None, *, first: int = 0) -> LabelMap:
        """The mapping of a source of :mod:`detaug.sources` (its ``categories`` and samples' labels)."""
        present = np.asarray(source.present_labels(), dtype=np.int64)  # columnar sources: no pass over samples
        return cls(getattr(source, "categories", None) or {}, present, label_map, first=first)

    # -- the two lists ----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """``len(class_names)``: one more than the largest class index (the smallest ``num_classes``)."""
        if self.mode == "contiguous":
            return self.first + len(self.ids)
        return max(int(self.ids[-1]) + 1 if len(self.ids) else 0, self.first)

    @property
    def class_names(self) -> list[str | None]:
        """Name of each class index (module docstring); a new list."""
        return list(self._build_lists()[0])

    @property
    def category_ids(self) -> list[int]:
        """Category id of each class index, ``-1`` for none (module docstring); a new list."""
        return list(self._build_lists()[1])

    def _build_lists(self) -> tuple[list[str | None], list[int]]:
        if self._lists is None:
            size = self.size
            if size > MAX_IDENTITY_CLASSES:
                raise ValueError(
                    f"category ids up to {int(self.ids[-1])} give {size} class indices with label_map=None; "
                    "pass label_map='contiguous' for class_names and category_ids")
            cids = np.full(size, -1, dtype=np.int64)
            cids[self.map(self.ids)] = self.ids
            names: list[str | None] = [None if c < 0 else self.names[int(c)] for c in cids.tolist()]
            if self.first == 1 and cids[0] < 0:
                names[0] = BACKGROUND
            self._lists = (names, cids.tolist())
        return self._lists

    # -- mapping ----------------------------------------------------------------------------------

    def map(self, labels: np.ndarray) -> np.ndarray:
        """int64 class indices of category ids ``labels`` (any shape; vectorised).

        Raises:
            ValueError: with ``"contiguous"``, a label that is not a category id.
        """
        labels = np.asarray(labels, dtype=np.int64)
        if self.mode is None:
            return labels
        k = np.searchsorted(self.ids, labels)
        found = k < len(self.ids)
        found[found] = self.ids[k[found]] == labels[found]
        if not found.all():
            raise ValueError(f"label(s) {np.unique(labels[~found])[:5].tolist()} are not category ids "
                             f"of the source ({_few(self.ids)})")
        return k + self.first

    def to_category_ids(self, indices: Any) -> np.ndarray:
        """int64 category ids of class indices ``indices`` (any shape; e.g. a model's predicted
        labels), for COCOeval: ``category_ids[index]`` for each. ``-1`` stays ``-1`` (the
        padding of Keras targets and KerasHub predictions); an index that stands for no category
        (the background, an identity gap) gives ``-1``.

        Raises:
            ValueError: an index outside ``-1 .. len(class_names) - 1`` (a model whose
                ``num_classes`` does not match these labels), named.
        """
        indices = np.asarray(indices)
        if indices.dtype.kind not in "iub":
            raise TypeError(f"class indices must be integers, got dtype {indices.dtype}")
        indices = indices.astype(np.int64, copy=False)
        bad = (indices < PAD_LABEL) | (indices >= self.size)
        if bad.any():
            raise ValueError(
                f"class index(es) {np.unique(indices[bad])[:5].tolist()} are outside 0..{self.size - 1}, the "
                f"labels of this mapping (label_map={self.mode!r}): does the model's num_classes match?")
        if self.mode == "contiguous":
            table = np.concatenate([np.full(self.first, -1, np.int64), self.ids, [PAD_LABEL]])
            return table[indices]  # index -1 picks the last entry: the padding
        out = indices.copy()
        pos = np.searchsorted(self.ids, out)
        known = pos < len(self.ids)
        known[known] = self.ids[pos[known]] == out[known]
        out[~known] = -1
        return out

    # -- checks -----------------------------------------------------------------------------------

    def check_num_classes(self, num_classes: int, *, adapter: str = "DetectionSequence") -> int:
        """``num_classes`` when every class index of this mapping fits a model with that many
        classes: ``0 .. num_classes - 1`` (``first=0``, KerasHub), ``1 .. num_classes - 1``
        (``first=1``, torchvision: ``num_classes`` counts the background, and no category may
        take index 0). Every category counts, also one without a box in the samples.

        Raises:
            ValueError: naming the first offending class index, its category id and name, and
                the fixes (``label_map="contiguous"``, a larger ``num_classes``).
            TypeError: ``num_classes`` not an integer.
        """
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
            raise TypeError(f"num_classes must be an integer or None, got {num_classes!r}")
        num_classes = int(num_classes)
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        indices = self.map(self.ids)
        lowest = self.first
        wanted = f"labels {lowest}..{num_classes - 1}" + (" (0 is the background)" if self.first else "")
        fixes = []
        if self.mode is None:
            fixes.append(f"label_map='contiguous' (labels {self.first}..{self.first + len(self.ids) - 1}, "
                         f"num_classes >= {self.first + len(self.ids)})")
        bad = (indices >= num_classes) | (indices < lowest)
        if not bad.any():
            return num_classes
        j = int(np.flatnonzero(bad)[0])
        label, cid = int(indices[j]), int(self.ids[j])
        if label < lowest:  # identity on a torchvision loader: category id 0 is the background
            raise ValueError(
                f"{adapter}: label {label} (category id {cid}, {self.names[cid]!r}) is the background of a "
                f"torchvision detector, which takes {wanted}; pass " + " or ".join(fixes))
        fixes.append(f"num_classes >= {self.size}")
        raise ValueError(
            f"{adapter}: label {label} (category id {cid}, {self.names[cid]!r}) does not fit num_classes="
            f"{num_classes}: the model takes {wanted}, and {int(bad.sum())} of the {len(self.ids)} categories "
            f"get labels >= {num_classes}; pass " + " or ".join(fixes))

    def __repr__(self) -> str:
        return f"LabelMap({self.mode!r}, first={self.first}, {len(self.ids)} categories: {_few(self.ids)})"


def _few(ids: np.ndarray) -> str:
    listed = ", ".join(map(str, ids[:8].tolist()))
    return f"ids {listed}" + (f", ... ({len(ids)} in all)" if len(ids) > 8 else "") if len(ids) else "no categories"
