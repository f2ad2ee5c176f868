"""The column store: a :class:`SampleTable` (one array per field for a whole dataset) written as a
folder of ``.npy`` files and a ``meta.json`` (:func:`save_columns`) and opened memory-mapped
(:func:`load_columns`), and :class:`SampleView`, the ``source.samples`` of a columnar source.

The layout is described in :mod:`detaug.formats.columnar`.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detaug.formats.samples import Sample


def save_columns(folder: str | os.PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                 *, stamp: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None) -> Path:
    """Write ``arrays`` (one ``NAME.npy`` each) and ``meta`` (``meta.json``) into ``folder``,
    replacing it atomically (written next to it, then renamed). ``stamp(folder written so
    far, meta) -> meta``: what ``meta.json`` holds, from the written arrays. Returns the
    folder."""
    def write(tmp: Path) -> Mapping[str, Any]:
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
        return meta

    return _write_folder(folder, write, stamp)


def _write_folder(folder: str | os.PathLike, write: Callable[[Path], Mapping[str, Any]],
                  stamp: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None) -> Path:
    """:func:`save_columns` of what ``write(folder being written) -> meta`` writes (the arrays'
    ``.npy`` files): nothing of it is left behind when ``write`` raises."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        meta = write(tmp)
        meta = stamp(tmp, dict(meta)) if stamp is not None else meta
        (tmp / "meta.json").write_text(json.dumps(dict(meta), separators=(",", ":")))
        if folder.exists():
            old = folder.with_name(folder.name + f".old-{os.getpid()}")
            folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load_columns(folder: str | os.PathLike, names: Sequence[str] | None = None,
                 *, mmap_mode: str | None = "r") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of a folder written by :func:`save_columns`; the arrays memory-mapped
    read-only (``mmap_mode=None``: read into memory). ``OSError`` when a file is missing."""
    folder = Path(folder)
    meta = json.loads(_read_regular(folder / "meta.json", _META_BYTES))
    names = list(names) if names is not None else [p.stem for p in sorted(folder.glob("*.npy"))]
    arrays = {}
    for name in names:
        path = folder / f"{name}.npy"
        if not stat.S_ISREG(path.stat().st_mode):  # a pipe would block, a device never end
            raise ValueError(f"{path}: not a regular file")
        # np.load cannot map an empty file; small arrays are read
        arrays[name] = array = np.load(path, mmap_mode=mmap_mode if path.stat().st_size > 4096 else None,
                                       allow_pickle=False)
        _random_access(array)
    return arrays, meta


#: Largest ``meta.json`` read (a cache's or a manifest's is a few kB to a few MB).
_META_BYTES = 64 << 20


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``ValueError`` naming it for a
    device, a pipe (a link to ``/dev/zero`` planted in a dataset) or a larger file."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # checked before opening: opening a pipe blocks
        raise ValueError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size} bytes, more than the {limit} a meta.json may have")
        return f.read(limit + 1)


def _random_access(array: np.ndarray) -> None:
    """Tell the kernel a mapped array is read at random (no read-ahead around each page read:
    a sample's few bytes would otherwise make megabytes resident)."""
    mapped = getattr(array, "_mmap", None)
    advice = getattr(mmap, "MADV_RANDOM", None)
    if mapped is not None and advice is not None:
        try:
            mapped.madvise(advice)
        except (OSError, ValueError):  # pragma: no cover - platforms without madvise
            pass


@dataclass
class SampleTable:
    """The annotations of ``n`` images as columns (shapes and dtypes in the module docstring)."""

    image_ids: np.ndarray
    sizes: np.ndarray
    box_starts: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray

    FIELDS = ("image_ids", "sizes", "box_starts", "boxes", "labels")

    def __len__(self) -> int:
        return len(self.image_ids)

    def boxes_of(self, i: int) -> np.ndarray:
        """float32 ``[N, 4]`` xyxy boxes of image ``i`` (a copy)."""
        a, b = int(self.box_starts[i]), int(self.box_starts[i + 1])
        return np.array(self.boxes[a:b], dtype=np.float32).reshape(-1, 4)

    def labels_of(self, i: int) -> np.ndarray:
        """int64 ``[N]`` category ids of image ``i``."""
        a, b = int(self.box_starts[i]), int(self.box_starts[i + 1])
        return np.asarray(self.labels[a:b], dtype=np.int64)

    def size_of(self, i: int) -> tuple[int, int] | None:
        """The declared ``(height, width)`` of image ``i``, or ``None``."""
        h, w = int(self.sizes[i, 0]), int(self.sizes[i, 1])
        return (h, w) if h > 0 else None

    def present_labels(self) -> np.ndarray:
        """int64: the distinct labels of all boxes, sorted (one pass over ``labels``, once; a
        cache's table has them from its ``meta.json``)."""
        known = self.__dict__.get("known_labels")
        if known is None:
            known = self.__dict__["known_labels"] = np.unique(np.asarray(self.labels)).astype(np.int64)
        return known.copy()

    def max_boxes(self) -> int:
        """The largest number of boxes of one image (computed once)."""
        most = self.__dict__.get("known_max_boxes")
        if most is None:
            most = self.__dict__["known_max_boxes"] = int(np.diff(np.asarray(self.box_starts)).max(initial=0))
        return most

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> SampleTable:
        return cls(*(arrays[name] for name in cls.FIELDS))


class SampleView(Sequence):
    """``source.samples`` of a columnar source: a read-only sequence of
    :class:`~detaug.formats.samples.Sample` built on demand from a :class:`SampleTable`.

    Args:
        table: the columns.
        image_of: position -> the sample's ``image`` (a path, or a description such as
            ``"shard-000001.tar:000000042.jpg"`` for an image inside a tar file).
        rows: int64 ``[k]`` table rows of the view's positions (``None``: all, in order).
        fields_of: ``(first box row, end box row, boxes [N, 4]) -> {name: [N, ...]}``: the
            sample's per-box fields (``Sample.fields``); ``None``: none.
    """

    def __init__(self, table: SampleTable, image_of: Callable[[int], Any], rows: np.ndarray | None = None,
                 fields_of: Callable[[int, int, np.ndarray], dict[str, np.ndarray]] | None = None) -> None:
        self.table, self.image_of, self.rows, self.fields_of = table, image_of, rows, fields_of

    def __len__(self) -> int:
        return len(self.table) if self.rows is None else len(self.rows)

    def row(self, index: int) -> int:
        """The table row of position ``index`` (``IndexError`` out of range)."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample {index} out of range for {n} samples")
        index %= n
        return index if self.rows is None else int(self.rows[index])

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        r = self.row(int(index))
        t = self.table
        boxes = t.boxes_of(r)
        fields = {} if self.fields_of is None else self.fields_of(int(t.box_starts[r]), int(t.box_starts[r + 1]), boxes)
        return Sample(self.image_of(r), boxes, t.labels_of(r), int(t.image_ids[r]), t.size_of(r), fields)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self) -> dict[str, Any]:
        """A view of cached COCO columns is pickled without its table (the columns map it again)."""
        state = dict(self.__dict__)
        columns = getattr(self.image_of, "columns", None)
        if columns is not None and getattr(columns, "cache", None) is not None and self.table is columns.table:
            state["table"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.setdefault("fields_of", None)  # pickled before views had fields
        self.__dict__.update(state)
        if self.table is None:
            self.table = self.image_of.columns.table
