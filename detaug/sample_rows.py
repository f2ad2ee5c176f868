"""Per-sample rows of arrays joined over a batch's samples, each made when it is read.

A plan that comes back from a planning worker carries its boxes, labels and per-box fields joined
over the batch (one array a column, ``counts[i]`` rows for sample ``i``: :mod:`detaug.plan_ahead`).
The PyTorch loader takes them joined as they are; only other readers (the Keras targets' overflow
check, tests, a user's own code) want them per sample. :class:`SampleRows` gives them per sample
without slicing every sample up front: sample ``i``'s rows are a view of the joined array, made
when read. (Slicing them up front cost the planning pool's result thread, which holds the
trainer's interpreter lock while it works, 37-64 us of a batch of 64's 115 us unpacking on the
development machine.) :class:`Chained` joins such sequences end to end without reading them (a
run of several batches, :func:`detaug.pipeline_runs.join_run`).

Both read as lists: ``len``, iteration, indexing (negative too), slicing (a list), ``==`` with a
list or another sequence of the same items, and ``+`` (a list).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Chained", "SampleRows", "row_ends"]


def row_ends(counts: Sequence[int]) -> list[int]:
    """Where each sample's rows end in columns joined over the samples: the running sum of
    ``counts`` (a list of ints)."""
    return np.cumsum(np.asarray(counts, dtype=np.int64)).tolist()


class _ListLike(Sequence):
    """A read-only sequence that compares and adds as a list does; subclasses give
    ``__len__`` and ``_item(i)`` for ``0 <= i < len``."""

    __slots__ = ()

    def _item(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {index} of {n}")
        return self._item(i)

    def __iter__(self):
        return (self._item(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment] - mutable-looking, as a list

    def __add__(self, other: Sequence) -> list:
        return [*self, *other]

    def __radd__(self, other: Sequence) -> list:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class SampleRows(_ListLike):
    """Sample ``i``'s rows of ``columns`` (arrays joined over the samples, ``counts[i]`` rows
    each, in sample order): with ``name``, ``columns[name][start_i:end_i]`` (an array, a view);
    without, a dict of every column's rows of sample ``i`` (``{}`` where ``columns`` is empty).

    Args:
        columns: ``{name: [N, ...]}``, ``N = sum(counts)``.
        counts: rows per sample (``B`` entries); ``None`` where ``ends`` is given.
        name: the column read, or ``None`` for dicts of all of them.
        ends: ``ends[i]``, where sample ``i``'s rows end (the running sum of ``counts``): several
            sequences over one batch's columns share one list (:func:`row_ends`).
    """

    __slots__ = ("columns", "ends", "name")

    def __init__(self, columns: dict[str, np.ndarray], counts: Sequence[int] | None = None, name: str | None = None,
                 *, ends: list[int] | None = None) -> None:
        self.columns, self.name = columns, name
        self.ends = row_ends(counts) if ends is None else ends

    def __len__(self) -> int:
        return len(self.ends)

    def _item(self, i: int) -> Any:
        start, end = (self.ends[i - 1] if i else 0), self.ends[i]
        if self.name is not None:
            return self.columns[self.name][start:end]
        return {name: array[start:end] for name, array in self.columns.items()}


class Chained(_ListLike):
    """The items of ``parts`` end to end, each read from its part when read."""

    __slots__ = ("parts", "ends")

    def __init__(self, parts: Sequence[Sequence]) -> None:
        self.parts = list(parts)
        self.ends = row_ends([len(p) for p in self.parts])

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def _item(self, i: int) -> Any:
        k = bisect.bisect_right(self.ends, i)
        return self.parts[k][i - (self.ends[k - 1] if k else 0)]
