"""Columnar annotations: one array per field for a whole dataset, not a Python object per sample.

A dataset of ``n`` images and ``M`` boxes is held as (:class:`SampleTable`)::

    image_ids  int64   [n]        the images' ids
    sizes      int32   [n, 2]     declared (height, width); (0, 0) where none was declared
    box_starts int64   [n + 1]    image i's boxes are rows box_starts[i]:box_starts[i + 1]
    boxes      float32 [M, 4]     absolute xyxy, continuous pixels (pixel i spans [i, i + 1))
    labels     int32   [M]        category ids (handed out as int64)

plus, for COCO (:class:`CocoColumns`), the file names as one UTF-8 blob with offsets, the EXIF
orientation entries, crowd flags and annotation ids. A table is written as a folder of ``.npy``
files and a ``meta.json`` (:func:`save_columns`) and opened memory-mapped (:func:`load_columns`):
opening costs the same for 1k and 10M images, and a process touches (keeps resident) only the
pages of the samples it reads; processes on one host share them through the page cache.

COCO files are parsed once (:func:`parse_coco_columns`: streamed in chunks, each chunk parsed
with ``orjson`` where installed, else ``json``; the validation rules of
:mod:`detaug.formats.validation` applied column-wise) and the result cached
(:func:`load_coco_columns`; built in bounded memory: the chunks' columns spilled to files in the
folder being written, only 32 bytes an image and a block of boxes in memory, the arrays the bytes
the in-memory parse would save): the second start-up of a 10M-image COCO file opens the cache. A file
the fast path does not take (anything beyond plain ints, floats and strings where COCO has them,
or any error) is parsed by :func:`detaug.formats.coco.load_coco` instead, which names every
problem; a clean result of that is cached the same way (in memory, as ``load_coco`` reads it).

:class:`SampleView` is the ``source.samples`` of a columnar source: ``len``, indexing (builds the
:class:`~detaug.formats.samples.Sample` on demand) and iteration.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detaug.errors import DatasetError, DataWarning
from detaug.boxes import box_area
from detaug.formats import validation as v
from detaug.formats.box_formats import xywh_to_xyxy
from detaug.formats.samples import Sample

__all__ = [
    "CACHE_VERSION", "CocoColumns", "SampleTable", "SampleView", "cache_folder", "coco_view",
    "load_coco_columns", "load_columns", "parse_coco_columns", "save_columns",
]

#: Bumped whenever the cache layout or the rules that fill it change (old caches are rebuilt).
CACHE_VERSION = 3
#: Bytes of the annotation file parsed at once by the streaming parser.
CHUNK_BYTES = 32 << 20

try:  # orjson parses 2-3x faster than json; optional
    import orjson as _orjson

    _loads: Callable[[bytes], Any] = _orjson.loads
    _LOAD_ERRORS: tuple[type[BaseException], ...] = (_orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _LOAD_ERRORS = (ValueError,)


# -- the column store ------------------------------------------------------------------------------

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


# -- sample tables ---------------------------------------------------------------------------------

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


# -- COCO as columns -------------------------------------------------------------------------------

@dataclass
class CocoColumns:
    """A checked COCO detection dataset as columns: what :func:`~detaug.formats.coco.load_coco`
    gives, without an object per image.

    Attributes:
        source: the file (as messages name it).
        table: the images (in the JSON's order) and their boxes (crowd boxes included).
        names: uint8 ``[L]`` the ``file_name`` entries, UTF-8, back to back; ``name_starts``
            int64 ``[n + 1]`` their offsets.
        exif: int8 ``[n]`` the entries' ``exif_orientation``, 0 where absent.
        iscrowd: bool ``[M]``; annotation_ids: int64 ``[M]`` (-1 where an annotation has no id).
        categories: names by category id, in the JSON's order.
        report: the checks' findings.
    """

    source: str
    table: SampleTable
    names: np.ndarray
    name_starts: np.ndarray
    exif: np.ndarray
    iscrowd: np.ndarray
    annotation_ids: np.ndarray
    categories: dict[int, str]
    report: v.Report

    EXTRA = ("names", "name_starts", "exif", "iscrowd", "annotation_ids")
    #: How it was read: "stream" (the fast path), "load_coco" or "cache".
    parsed_by: str = "cache"

    def __len__(self) -> int:
        return len(self.table)

    def file_name(self, i: int) -> str:
        """The ``file_name`` of image ``i``."""
        return bytes(self.names[int(self.name_starts[i]):int(self.name_starts[i + 1])]).decode("utf-8")

    def arrays(self) -> dict[str, np.ndarray]:
        return {**self.table.arrays(), **{name: getattr(self, name) for name in self.EXTRA}}

    def __getstate__(self) -> dict[str, Any]:
        """Columns read from a cache are pickled as its folder (worker processes map it again)."""
        state = dict(self.__dict__)
        if state.get("cache") is not None:
            state["table"] = None
            state.update(dict.fromkeys(self.EXTRA))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if state.get("cache") is not None:
            arrays, meta = load_columns(state["cache"])
            self.table = CocoColumns.from_columns(arrays, meta).table
            for name in self.EXTRA:
                setattr(self, name, arrays[name])

    def meta(self) -> dict[str, Any]:
        return {"source": self.source, "categories": [[k, n] for k, n in self.categories.items()],
                "report": _report_to_json(self.report), "present_labels": self.table.present_labels().tolist(),
                "max_boxes": self.table.max_boxes()}

    @classmethod
    def from_columns(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> CocoColumns:
        table = SampleTable.from_arrays(arrays)
        table.known_labels = np.asarray(meta["present_labels"], dtype=np.int64)  # type: ignore[attr-defined]
        table.known_max_boxes = int(meta["max_boxes"])  # type: ignore[attr-defined]
        return cls(meta["source"], table, *(arrays[n] for n in cls.EXTRA),
                   {int(k): str(n) for k, n in meta["categories"]}, _report_from_json(meta["report"]))

    @classmethod
    def from_dataset(cls, dataset: Any) -> CocoColumns:
        """The columns of a :class:`~detaug.formats.coco.CocoDataset`."""
        images = dataset.images
        if any(getattr(im, "keypoints", None) is not None for im in images):
            raise DatasetError(_NO_KEYPOINTS.format(source=dataset.source))
        counts = np.array([len(im.boxes) for im in images], dtype=np.int64)

        def cat(parts: list[np.ndarray], dtype: Any, shape: tuple[int, ...] = ()) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros((0, *shape), dtype)

        encoded = [im.file_name.encode("utf-8") for im in images]
        table = SampleTable(
            np.array([im.id for im in images], dtype=np.int64).reshape(-1),
            np.array([im.size or (0, 0) for im in images], dtype=np.int32).reshape(-1, 2),
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            cat([im.boxes for im in images], np.float32, (4,)).reshape(-1, 4),
            cat([im.labels for im in images], np.int32),
        )
        return cls(dataset.source, table, np.frombuffer(b"".join(encoded), np.uint8).copy(),
                   np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64),
                   np.array([im.exif_orientation or 0 for im in images], dtype=np.int8),
                   cat([im.iscrowd for im in images], bool), cat([im.annotation_ids for im in images], np.int64),
                   dict(dataset.categories), dataset.report)


def _report_to_json(report: v.Report) -> dict[str, Any]:
    return {"source": report.source, "images": report.images, "boxes": report.boxes,
            "counts": dict(report.counts),
            "examples": {r: [[f.file, f.image_id, f.annotation, f.detail] for f in fs] for r, fs in report.examples.items()}}


def _report_from_json(data: Mapping[str, Any]) -> v.Report:
    report = v.Report(data["source"])
    report.images, report.boxes = int(data["images"]), int(data["boxes"])
    report.counts.update({r: int(n) for r, n in data["counts"].items()})
    report.examples = {r: [v.Finding(r, *f) for f in fs] for r, fs in data["examples"].items()}
    return report


def _add_many(report: v.Report, reason: str, count: int, example: Callable[[int], tuple[str, int | None, Any]],
              detail: str = "") -> None:
    """Count ``count`` findings of ``reason``; the first :data:`~validation.MAX_EXAMPLES` with
    their details (``example(k) -> (file, image_id, annotation)``)."""
    if count <= 0:
        return
    shown = min(count, max(0, v.MAX_EXAMPLES - len(report.examples.get(reason, []))))
    for k in range(shown):
        file, image_id, annotation = example(k)
        report.add(reason, file, image_id=image_id, annotation=annotation, detail=detail)
    report.counts[reason] += count - shown


# -- the streaming parser --------------------------------------------------------------------------

class _Irregular(Exception):
    """The file is not in the plain form the fast path takes: ``load_coco`` parses it."""


_WS = re.compile(rb"[ \t\r\n]*")


def _skip_ws(buf: Any, pos: int) -> int:
    """The position of the first non-blank byte at or after ``pos``."""
    if isinstance(buf, bytes):
        return _WS.match(buf, pos).end()  # type: ignore[union-attr]
    while True:
        piece = buf[pos:pos + 4096]
        k = _WS.match(piece).end()  # type: ignore[union-attr]
        if k < len(piece) or not piece:
            return pos + k
        pos += k


class _File:
    """A file read by position (``pread``): slices are bytes, nothing of it stays mapped (a
    memory map would count the whole file in the resident size)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.size = fd, os.fstat(fd).st_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, part: slice) -> bytes:
        start, stop = max(0, part.start or 0), min(self.size, part.stop if part.stop is not None else self.size)
        if stop <= start:
            return b""
        out = bytearray()
        while start + len(out) < stop:
            got = os.pread(self.fd, stop - start - len(out), start + len(out))
            if not got:
                break
            out += got
        return bytes(out)


def _value_end(buf: Any, pos: int) -> tuple[Any, int]:
    """Decode the (small) JSON value starting at ``pos`` of ``buf``: ``(value, end)``."""
    size = 1 << 16
    while True:
        piece = bytes(buf[pos:pos + size])
        text = piece.decode("utf-8", "surrogateescape")
        try:
            value, end = json.JSONDecoder().raw_decode(text)
        except json.JSONDecodeError:
            if pos + size >= len(buf):
                raise _Irregular("a value does not parse") from None
            size *= 4
            continue
        return value, pos + len(text[:end].encode("utf-8", "surrogateescape"))


def _array_chunks(buf: Any, pos: int, chunk: int) -> Iterator[list[Any]]:
    """The elements (objects) of the JSON array starting at ``buf[pos] == "["``, parsed a chunk
    of about ``chunk`` bytes at a time. A chunk is cut after a ``}`` followed by ``,`` or ``]``
    and parsed as an array: a cut inside a string or a nested value leaves it unbalanced, so a
    chunk that parses ends on an element boundary (and a chunk that ran past the array's end
    reports where it ended). The generator's return value: the position after ``]``."""
    pos = _skip_ws(buf, pos + 1)
    if buf[pos:pos + 1] == b"]":
        return pos + 1
    total = len(buf)
    while True:
        end = min(total, pos + chunk)
        window = buf[pos:end]
        q, tries = len(window), 0
        while True:
            q = window.rfind(b"}", 0, q)
            if q < 0 or tries > 64:
                if end >= total:
                    raise _Irregular("an array element is not an object")
                chunk *= 4
                break
            after = _skip_ws(window, q + 1)
            if after >= len(window) or window[after:after + 1] not in (b",", b"]"):
                continue
            tries += 1
            wrapped = b"[" + window[:q + 1] + b"]"
            try:
                items = _loads(wrapped)
            except _LOAD_ERRORS as err:  # the array may have ended inside the window
                p = getattr(err, "pos", None)
                j = wrapped.rfind(b"]", 0, p) if isinstance(p, int) and p > 0 else -1
                if j < 2:
                    continue
                try:
                    items = _loads(wrapped[:j + 1])
                except _LOAD_ERRORS:
                    continue
                yield items
                return pos + j  # the array's "]" is window[j - 1]
            yield items
            pos = _skip_ws(buf, pos + after + 1)
            if window[after:after + 1] == b"]":
                return pos
            break


def _top_level(buf: Any, chunk: int, on_images: Callable[[list[Any]], None],
               on_annotations: Callable[[list[Any]], None]) -> dict[str, Any]:
    """Walk the top-level object: stream ``images`` and ``annotations`` into the callbacks,
    decode the other values; returns ``{key: value}`` of those (and ``"images"`` /
    ``"annotations"`` as ``True`` when streamed)."""
    pos = _skip_ws(buf, 0)
    if buf[pos:pos + 1] != b"{":
        raise _Irregular("the top level is not an object")
    pos, found = _skip_ws(buf, pos + 1), {}
    if buf[pos:pos + 1] == b"}":
        return found
    while True:
        key, pos = _value_end(buf, pos)
        if not isinstance(key, str) or key in found:
            raise _Irregular("a key repeats")
        pos = _skip_ws(buf, pos)
        if buf[pos:pos + 1] != b":":
            raise _Irregular("no colon")
        pos = _skip_ws(buf, pos + 1)
        if key in ("images", "annotations") and buf[pos:pos + 1] == b"[":
            sink = on_images if key == "images" else on_annotations
            stream = _array_chunks(buf, pos, chunk)
            while True:
                try:
                    sink(next(stream))
                except StopIteration as stop:
                    pos = stop.value
                    break
            found[key] = True
        else:
            found[key], pos = _value_end(buf, pos)
        pos = _skip_ws(buf, pos)
        sep = buf[pos:pos + 1]
        pos = _skip_ws(buf, pos + 1)
        if sep == b"}":
            if _skip_ws(buf, pos) != len(buf):
                raise _Irregular("data after the top-level object")
            return found
        if sep != b",":
            raise _Irregular("no comma")


def _plain(values: list[Any], types: tuple[type, ...]) -> None:
    if not set(map(type, values)).issubset(types):
        raise _Irregular("a value of another type")


def _needs_norm(name: str) -> bool:
    return "//" in name or "/." in name or name.startswith(".") or name.endswith("/")


class _Column:
    """One column of a parse, appended a chunk at a time: kept in memory, or (``path`` given)
    appended to a raw file there and read back a block at a time (bounded memory)."""

    def __init__(self, dtype: Any, shape: tuple[int, ...] = (), path: Path | None = None) -> None:
        self.dtype, self.shape, self.path = np.dtype(dtype), shape, path
        self.width = int(np.prod(shape, dtype=np.int64))
        self.rows = 0
        self.parts: list[np.ndarray] = []
        self.file = open(path, "xb") if path is not None else None

    def append(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, dtype=self.dtype).reshape(-1, *self.shape)
        if self.file is not None:
            self.file.write(_raw(array))
        else:
            self.parts.append(array)
        self.rows += len(array)

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` (in memory: a view of the joined column; from a file: read)."""
        stop = self.rows if stop is None else min(stop, self.rows)
        start = min(start, stop)
        if self.file is None:
            if len(self.parts) != 1:
                self.parts = [_cat(self.parts, self.dtype, self.shape).reshape(-1, *self.shape)]
            return self.parts[0][start:stop]
        self.file.flush()
        data = np.fromfile(self.path, self.dtype, count=(stop - start) * self.width,
                           offset=start * self.width * self.dtype.itemsize)
        return data.reshape(-1, *self.shape)

    def close(self) -> None:
        """Free the column (and remove its file: the disk a build needs stays near twice the cache)."""
        if self.file is not None:
            self.file.close()
            self.path.unlink(missing_ok=True)  # type: ignore[union-attr]
        self.parts = []


def _raw(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, not copied (empty ones too)."""
    return memoryview(array.reshape(-1).view(np.uint8))


class _Out:
    """The arrays a parse builds: kept in memory, or (``folder`` given) written there as
    ``NAME.npy`` files as they come, the same bytes ``np.save`` writes (the shape, known
    first, in the header; the rows appended)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self.parts: dict[str, list[np.ndarray]] = {}
        self.files: dict[str, Any] = {}
        self.expected: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}

    def start(self, name: str, dtype: Any, shape: tuple[int, ...]) -> None:
        dtype, shape = np.dtype(dtype), tuple(int(s) for s in shape)
        self.expected[name] = (dtype, shape, 0)
        if self.folder is None:
            self.parts[name] = []
            return
        f = self.files[name] = open(self.folder / f"{name}.npy", "xb")
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                 "fortran_order": False, "shape": shape})

    def write(self, name: str, array: np.ndarray) -> None:
        dtype, shape, rows = self.expected[name]
        array = np.ascontiguousarray(array, dtype=dtype).reshape(-1, *shape[1:])
        self.expected[name] = (dtype, shape, rows + len(array))
        if self.folder is None:
            self.parts[name].append(array)
        else:
            self.files[name].write(_raw(array))

    def put(self, name: str, array: np.ndarray) -> np.ndarray:
        """The whole array ``name`` at once; returns it as it can be read back (from a folder:
        memory-mapped, its pages read only where they are used)."""
        self.start(name, array.dtype, array.shape)
        self.write(name, array)
        if self.folder is None:
            return array
        self.files[name].flush()
        return self.result_of(name)

    def result_of(self, name: str) -> np.ndarray:
        path = self.folder / f"{name}.npy"  # type: ignore[operator]
        return np.load(path, mmap_mode="r" if path.stat().st_size > 4096 else None, allow_pickle=False)

    def result(self) -> dict[str, np.ndarray]:
        """The arrays (from a folder: its files, closed, memory-mapped)."""
        arrays = {}
        for name, (dtype, shape, rows) in self.expected.items():
            if rows != shape[0]:  # pragma: no cover - a defect of the parse, not of the file
                raise AssertionError(f"{name}: {rows} rows written, {shape[0]} announced")
            if self.folder is None:
                arrays[name] = _cat(self.parts.pop(name), dtype, shape[1:]).reshape(shape)
            else:
                self.files.pop(name).close()
                arrays[name] = self.result_of(name)
        return arrays

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files, self.parts = {}, {}


class _Collector:
    """Columns of the images and annotations chunks, checked the plain way (any doubt:
    :class:`_Irregular`): in memory, or (``spill`` given: a folder made for them, removed by
    :meth:`close`) in raw files there."""

    def __init__(self, allow_paths_outside: bool = False, spill: Path | None = None) -> None:
        self.allow_paths_outside = allow_paths_outside
        self.spill = spill
        if spill is not None:
            spill.mkdir()
        self.outside = 0  # names that leave the images folder (counted when allowed)
        self.ids = self.column("ids", np.int64)
        self.sizes = self.column("sizes", np.int32, (2,))
        self.exif = self.column("exif", np.int8)
        self.names = self.column("names", np.uint8)
        self.name_lengths = self.column("name_lengths", np.int64)
        self.name_hashes = self.column("name_hashes", np.int64)
        self.ann = {k: self.column(f"ann_{k}", dtype, shape) for k, dtype, shape in (
            ("id", np.int64, ()), ("image_id", np.int64, ()), ("category_id", np.int64, ()),
            ("iscrowd", bool, ()), ("bbox", np.float32, (4,)))}

    def column(self, name: str, dtype: Any, shape: tuple[int, ...] = ()) -> _Column:
        """A new column (a file of the spill folder, where there is one)."""
        return _Column(dtype, shape, None if self.spill is None else self.spill / f"{name}.bin")

    def close(self) -> None:
        """Free the columns and remove the spill folder."""
        for column in (self.ids, self.sizes, self.exif, self.names, self.name_lengths, self.name_hashes,
                       *self.ann.values()):
            column.close()
        if self.spill is not None:
            shutil.rmtree(self.spill, ignore_errors=True)

    def images(self, items: list[Any]) -> None:
        _plain(items, (dict,))
        ids = [im.get("id") for im in items]
        _plain(ids, (int,))
        names = [im.get("file_name") for im in items]
        _plain(names, (str,))
        if not all(names):
            raise _Irregular("an empty file_name")
        outside = v.outside_paths(names)
        if outside and not self.allow_paths_outside:
            raise _Irregular("a file_name outside the images folder")  # load_coco names it
        self.outside += len(outside)
        heights = [im.get("height") for im in items]
        widths = [im.get("width") for im in items]
        _plain(heights, (int, type(None)))
        _plain(widths, (int, type(None)))
        if (None in heights) != (None in widths) or any((h is None) != (w is None) for h, w in zip(heights, widths)):
            raise _Irregular("height without width")
        exif = [im.get("exif_orientation") for im in items]
        _plain(exif, (int, type(None)))
        try:
            id_array = np.array(ids, dtype=np.int64)
            hw = np.array([[h or 0, w or 0] for h, w in zip(heights, widths)], dtype=np.int64).reshape(-1, 2)
            ex = np.array([e or 0 for e in exif], dtype=np.int64)
        except OverflowError:
            raise _Irregular("an integer beyond int64") from None
        declared = hw[:, 0] != 0
        if ((hw < 0) | (hw > v.INT32_MAX)).any() or (declared & (hw == 0).any(axis=1)).any() or (
                (~declared) & (hw[:, 1] != 0)).any():
            raise _Irregular("a size that is not positive")
        if any(e is not None and not 1 <= e <= 8 for e in exif):
            raise _Irregular("an exif_orientation beyond 1..8")
        keys = [os.path.normpath(n) if _needs_norm(n) else n for n in names]
        blob = "".join(names).encode("utf-8")
        lengths = np.fromiter(map(len, names), np.int64, len(names))
        if len(blob) != int(lengths.sum()):  # non-ASCII names: their byte lengths
            lengths = np.fromiter((len(n.encode("utf-8")) for n in names), np.int64, len(names))
        self.names.append(np.frombuffer(blob, np.uint8))
        self.name_lengths.append(lengths)
        self.name_hashes.append(np.fromiter(map(hash, keys), np.int64, len(keys)))
        self.ids.append(id_array)
        self.sizes.append(hw.astype(np.int32))
        self.exif.append(ex.astype(np.int8))

    def annotations(self, items: list[Any]) -> None:
        _plain(items, (dict,))
        if any("keypoints" in a for a in items):
            raise _Irregular("keypoints")  # load_coco reads them; the cache then refuses them (_NO_KEYPOINTS)
        aid = [a.get("id", -1) for a in items]
        iid = [a.get("image_id") for a in items]
        cid = [a.get("category_id") for a in items]
        crowd = [a.get("iscrowd", 0) for a in items]
        bbox = [a.get("bbox") for a in items]
        _plain(aid, (int,))
        _plain(iid, (int,))
        _plain(cid, (int,))
        _plain(crowd, (int, bool, float))
        _plain(bbox, (list,))
        if any(len(b) != 4 for b in bbox):
            raise _Irregular("a bbox of another length")
        _plain([c for b in bbox for c in b], (int, float))
        try:
            columns = (np.array(aid, dtype=np.int64), np.array(iid, dtype=np.int64), np.array(cid, dtype=np.int64))
            xywh = np.array(bbox, dtype=np.float64).reshape(-1, 4)
            with np.errstate(over="ignore", invalid="ignore"):  # xyxy in float64, kept in float32 (beyond: inf)
                xyxy = xywh_to_xyxy(xywh).astype(np.float32)
        except OverflowError:
            raise _Irregular("an integer beyond int64") from None
        c = np.array(crowd, dtype=np.float64)
        if not np.isin(c, (0.0, 1.0)).all():
            raise _Irregular("iscrowd not 0/1")
        for key, column in zip(("id", "image_id", "category_id"), columns):
            self.ann[key].append(column)
        self.ann["bbox"].append(xyxy)
        self.ann["iscrowd"].append(c == 1)


#: Boxes checked at once when a COCO file is parsed into columns.
_CHECK_ROWS = 1 << 21
#: Kept boxes grouped by image at once when a cache is built (bounded memory: about 90 bytes
#: each; more boxes are first split into files of images with at most this many boxes).
_GROUP_ROWS = 1 << 21
#: A kept box while its image's boxes are grouped: its image's row, the checked box and the
#: columns that go with it.
_KEPT = np.dtype([("owner", np.int64), ("box", np.float32, (4,)), ("label", np.int32), ("crowd", bool),
                  ("aid", np.int64)])


def _cat(parts: list[np.ndarray], dtype: Any, shape: tuple[int, ...] = ()) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros((0, *shape), dtype)


#: A keypoints file asked to be cached: said, not dropped silently (issue 41: the cache holds no keypoints yet).
_NO_KEYPOINTS = ("{source}: a COCO keypoints file (its categories name keypoints): the annotation cache does not "
                 "hold keypoints yet; read it with CocoSource(..., cache=False)")


def parse_coco_columns(path: str | os.PathLike, *, name: str | None = None, chunk_bytes: int = CHUNK_BYTES,
                       allow_paths_outside: bool = False) -> CocoColumns:
    """Read and check a COCO detection JSON file into columns (the same result, repairs and
    report as :func:`~detaug.formats.coco.load_coco`, which parses the files the streaming
    path does not take; see the module docstring). ``allow_paths_outside``: as ``load_coco``'s.

    Raises:
        DatasetError: the file's errors, as ``load_coco`` names them.
    """
    path = Path(path)
    try:
        columns = _stream(path, name, chunk_bytes, allow_paths_outside, None)
    except (_Irregular, RecursionError):  # RecursionError: a value nested too deeply
        columns = _by_load_coco(path, name, allow_paths_outside)
    return columns


def _by_load_coco(path: Path, name: str | None, allow_paths_outside: bool) -> CocoColumns:
    """The columns of a file the streaming parser does not take, read by ``load_coco``."""
    from detaug.formats.coco import load_coco

    columns = CocoColumns.from_dataset(load_coco(path, name=name, allow_paths_outside=allow_paths_outside))
    columns.parsed_by = "load_coco"
    columns.outside = _count_outside(columns)  # type: ignore[attr-defined]
    return columns


def _stream(path: Path, name: str | None, chunk_bytes: int, allow_paths_outside: bool,
            folder: Path | None) -> CocoColumns:
    """The streaming parse (:class:`_Irregular` where it does not take the file): in memory, or
    with ``folder`` in bounded memory, the chunks' columns spilled to files in ``folder/build/``
    (removed at the end) and the arrays written there as ``NAME.npy`` files."""
    source = name or str(path)
    collector = _Collector(allow_paths_outside, None if folder is None else folder / "build")
    out = _Out(folder)
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise _Irregular("empty file")
            found = _top_level(_File(f.fileno()), chunk_bytes, collector.images, collector.annotations)
        columns = _finish(source, found, collector, out, _GROUP_ROWS if folder is not None else None)
    finally:
        out.close()
        collector.close()
    columns.parsed_by = "stream"
    columns.outside = collector.outside  # type: ignore[attr-defined]
    return columns


def _count_outside(columns: CocoColumns) -> int:
    """How many ``file_name`` of ``columns`` leave the images folder."""
    return len(v.outside_paths([columns.file_name(i) for i in range(len(columns))]))


def _finish(source: str, found: dict[str, Any], c: _Collector, out: _Out, group_rows: int | None) -> CocoColumns:
    """Check the collected columns as a whole and build the dataset into ``out`` (or
    :class:`_Irregular`). With ``out`` a folder, what stays in memory is the images' id order,
    sorted ids, sizes and box counts (32 bytes an image), a block of :data:`_CHECK_ROWS` boxes
    and a group of at most ``group_rows`` kept boxes (whole images; ``None``: all at once),
    grouped by image in the annotations' order."""
    from detaug.formats.coco import _Parser

    if found.get("images") is not True or "annotations" in found and found["annotations"] is not True:
        raise _Irregular("images / annotations are not arrays")
    categories_raw = found.get("categories")
    if not isinstance(categories_raw, list) and not (categories_raw is None and not c.ann["id"].rows):
        raise _Irregular("categories are not a list")
    if any(isinstance(cat, dict) and "keypoints" in cat for cat in categories_raw or []):
        raise DatasetError(_NO_KEYPOINTS.format(source=source))
    parser = _Parser(source)
    categories = parser.categories(categories_raw or [])
    report = parser.report
    if report.total:
        raise _Irregular("the categories have errors")
    if not c.ids.rows:
        raise _Irregular("no images")
    hashes = np.sort(c.name_hashes.read())
    c.name_hashes.close()
    if (hashes[1:] == hashes[:-1]).any():
        raise _Irregular("duplicate (or colliding) file names")
    del hashes
    ids = c.ids.read()
    c.ids.close()
    n = len(ids)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    if (sorted_ids[1:] == sorted_ids[:-1]).any():
        raise _Irregular("duplicate image ids")
    ids = out.put("image_ids", ids)  # from a folder: mapped, read only where a finding names an id
    sizes = c.sizes.read()  # read at random (each box's image): kept in memory
    out.put("sizes", sizes)
    c.sizes.close()
    name_starts = out.put("name_starts", np.concatenate([[0], np.cumsum(c.name_lengths.read())]).astype(np.int64))
    c.name_lengths.close()

    def file_of(i: int) -> str:
        return f"{source}: {bytes(c.names.read(int(name_starts[i]), int(name_starts[i + 1]))).decode('utf-8')}"

    undeclared = np.flatnonzero(sizes[:, 0] == 0)
    _add_many(report, v.SIZE_NOT_DECLARED, len(undeclared),
              lambda k: (file_of(int(undeclared[k])), int(ids[undeclared[k]]), None), detail="no width/height")
    del undeclared

    # the boxes, a block at a time in the annotations' order: owner, checks, the kept ones set aside
    known = np.fromiter(categories, np.int64, len(categories))
    kept = c.column("kept", _KEPT)
    counts = np.zeros(n, np.int64)
    for a in range(0, c.ann["image_id"].rows, _CHECK_ROWS):
        b = a + _CHECK_ROWS
        image_of = c.ann["image_id"].read(a, b)
        slot = np.minimum(np.searchsorted(sorted_ids, image_of), n - 1)
        if (sorted_ids[slot] != image_of).any():
            raise _Irregular("an annotation of an unknown image")
        owner = order[slot]
        del slot, image_of
        labels = c.ann["category_id"].read(a, b)
        if not np.isin(labels, known).all():
            raise _Irregular("an unknown category id")
        ann_ids = c.ann["id"].read(a, b)

        def where(j: int, a: int = a, owner: np.ndarray = owner, ann_ids: np.ndarray = ann_ids
                  ) -> tuple[str, int | None, int | str | None]:
            annotation = int(ann_ids[j]) if ann_ids[j] != -1 else f"annotations[{j + a}]"
            return file_of(int(owner[j])), int(ids[owner[j]]), annotation

        hw = sizes[owner].astype(np.float32)
        hw[hw[:, 0] == 0] = np.nan
        boxes, keep = v.check_boxes(c.ann["bbox"].read(a, b), hw, report, where)
        rows = np.flatnonzero(keep)
        block = np.empty(len(rows), _KEPT)
        block["owner"], block["box"], block["label"] = owner[rows], boxes[rows], labels[rows]
        block["crowd"], block["aid"] = c.ann["iscrowd"].read(a, b)[rows], ann_ids[rows]
        kept.append(block)
        counts += np.bincount(block["owner"], minlength=n)
    del order, sorted_ids
    for column in c.ann.values():
        column.close()
    report.raise_errors()
    box_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    max_boxes = int(counts.max(initial=0))
    del counts
    total = int(box_starts[-1])

    del sizes
    out.put("box_starts", box_starts)
    for name, column in (("names", c.names), ("exif", c.exif)):
        out.start(name, column.dtype, (column.rows,))
        for a in range(0, column.rows, _CHECK_ROWS * 16):
            out.write(name, column.read(a, a + _CHECK_ROWS * 16))
    for name, dtype, shape in (("boxes", np.float32, (total, 4)), ("labels", np.int32, (total,)),
                               ("iscrowd", bool, (total,)), ("annotation_ids", np.int64, (total,))):
        out.start(name, dtype, shape)
    present = np.zeros(0, np.int64)
    for group in _grouped(kept, box_starts, group_rows, c):
        group = group[np.argsort(group["owner"], kind="stable")]  # by image, in the annotations' order
        out.write("boxes", group["box"])
        out.write("labels", group["label"])
        out.write("iscrowd", group["crowd"])
        out.write("annotation_ids", group["aid"])
        present = np.union1d(present, np.unique(group["label"]).astype(np.int64))
    kept.close()
    report.images, report.boxes = n, total
    arrays = out.result()
    table = SampleTable.from_arrays(arrays)
    table.known_labels, table.known_max_boxes = present, max_boxes  # type: ignore[attr-defined]
    return CocoColumns(source, table, *(arrays[name] for name in CocoColumns.EXTRA), categories, report)


def _grouped(kept: _Column, box_starts: np.ndarray, group_rows: int | None, c: _Collector) -> Iterator[np.ndarray]:
    """The kept boxes (:data:`_KEPT`) in groups of whole images, the images in order, each
    group's boxes in the annotations' order: all at once where they are at most ``group_rows``
    (``None``: no bound), else first split into a file per group of images."""
    total = int(box_starts[-1])
    if group_rows is None or total <= group_rows:
        yield kept.read()
        return
    firsts = [0]  # each group's first image: at most group_rows boxes, or a single image
    while firsts[-1] < len(box_starts) - 1:
        i = firsts[-1]
        firsts.append(max(i + 1, int(np.searchsorted(box_starts, box_starts[i] + group_rows, side="right")) - 1))
    firsts.pop()
    parts = [c.column(f"group{g}", _KEPT) for g in range(len(firsts))]
    bounds = np.asarray(firsts, np.int64)
    for a in range(0, kept.rows, _CHECK_ROWS):
        block = kept.read(a, a + _CHECK_ROWS)
        group = np.searchsorted(bounds, block["owner"], side="right") - 1
        by_group = np.argsort(group, kind="stable")
        ends = np.cumsum(np.bincount(group, minlength=len(parts)))
        for g, (s, e) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends)):
            if e > s:
                parts[g].append(block[by_group[s:e]])
    kept.close()
    for part in parts:
        yield part.read()
        part.close()


# -- the cache -------------------------------------------------------------------------------------
#
# A cache is used only when it provably belongs to this very file (docs/security.md):
#
# * fast path: ``meta.json``'s ``trusted`` holds the annotation file's ``[size, mtime_ns, ctime_ns,
#   device, inode]`` with the same of each of the cache's ``.npy`` files, as they were when it was
#   built (or renewed: up to :data:`_TRUSTED_KEYS` such pairs), and its MAC (HMAC-SHA256 with a
#   secret of this user, :func:`_secret`) over everything else it says is valid. No copy,
#   extraction or edit keeps a file's inode and ctime (ctime cannot be set), and a cache made
#   elsewhere has no valid MAC, so a cache shipped with a dataset, or an edited file or cache,
#   never takes this path. Nothing is read but ``meta.json`` and the secret: opening stays as
#   fast as before.
# * otherwise (the file was touched, copied, moved to another disk): the SHA-256 of the file and
#   of the arrays are computed and compared with those signed at build; then the arrays are
#   checked as any source's (:func:`_check_cached`) and the new keys kept; anything else rebuilds
#   the cache with a :class:`DataWarning` saying why.

#: Keys a cache keeps as its own (the file and its arrays as seen from up to this many hosts or
#: copies, e.g. nodes that see other device numbers of one network file system).
_TRUSTED_KEYS = 32
#: Bytes read at a time when hashing an annotation file.
_HASH_BLOCK = 8 << 20


def _file_key(path: str | os.PathLike) -> list[int]:
    """``[size, mtime_ns, ctime_ns, device, inode]`` of ``path``."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino]


def _files_key(folder: Path) -> list[list[Any]]:
    """:func:`_file_key` of each ``.npy`` file of a cache folder, by name."""
    return [[p.name, *_file_key(p)] for p in sorted(folder.glob("*.npy"))]


def _file_hash(path: str | os.PathLike) -> str:
    """SHA-256 of the whole file (read in bounded blocks)."""
    digest = hashlib.sha256()
    if not stat.S_ISREG(os.stat(path).st_mode):  # a device never ends, a pipe blocks
        raise ValueError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _arrays_hash(folder: Path) -> str:
    """SHA-256 over the SHA-256 of each ``.npy`` file of a cache folder, in name order."""
    digest = hashlib.sha256()
    for p in sorted(folder.glob("*.npy")):
        digest.update(f"{p.name}:{_file_hash(p)};".encode())
    return digest.hexdigest()


def _stamp(tmp: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` of a cache written into ``tmp``: its arrays' keys and hash, and the MAC over
    everything it says (none without a secret)."""
    meta = {**meta, "arrays_sha256": _arrays_hash(tmp)}
    meta["trusted"] = [[meta.pop("key"), _files_key(tmp)]]
    secret = _secret()
    meta["mac"] = _mac(secret, meta) if secret is not None else None
    return meta


def _secret() -> bytes | None:
    """This user's cache secret (32 random bytes in ``$DETAUG_CACHE_SECRET``, default
    ``~/.cache/detaug/cache-secret``, mode 0600; made when first needed), or ``None`` when it
    cannot be read or made (caches are then trusted on the fast path only)."""
    where = os.environ.get("DETAUG_CACHE_SECRET")
    if where is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        where = os.path.join(base, "detaug", "cache-secret")
    try:
        with open(where, "rb") as f:
            data = f.read(64)
        return data if len(data) == 32 else None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        os.makedirs(os.path.dirname(where) or ".", mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(where) or ".", prefix=".cache-secret.")
        try:
            os.write(fd, os.urandom(32))
            os.close(fd)
            try:
                os.link(tmp, where)  # atomic; another process may have made it first
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        with open(where, "rb") as f:
            data = f.read(64)
        return data if len(data) == 32 else None
    except OSError:
        return None


def _mac(secret: bytes, meta: Mapping[str, Any]) -> str:
    """HMAC-SHA256 over what a cache's ``meta.json`` says (the annotation file's hash, the
    arrays' hash, the categories, the report, ...), all but its keys and its MAC."""
    import hmac

    signed = {k: value for k, value in meta.items() if k not in ("trusted", "mac")}
    text = json.dumps(signed, sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, f"detaug-cache:{CACHE_VERSION}:{text}".encode(), hashlib.sha256).hexdigest()


def _signed_by_us(meta: Mapping[str, Any], secret: bytes | None) -> bool:
    """Whether ``meta``'s MAC is this user's (``True`` where there is no secret to check with)."""
    import hmac

    if secret is None:
        return True
    mac = meta.get("mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, _mac(secret, meta))


def cache_folder(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the cache of the COCO file ``path`` lives: ``<file>.detaug-cache/`` next to it, or
    ``cache_dir/<name>-<hash of the absolute path>/`` (also ``$DETAUG_CACHE_DIR``)."""
    path = Path(path)
    cache_dir = cache_dir if cache_dir is not None else os.environ.get("DETAUG_CACHE_DIR")
    if cache_dir is None:
        return path.with_name(path.name + ".detaug-cache")
    tag = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{path.name}-{tag}"


def load_coco_columns(path: str | os.PathLike, *, cache: bool = True, cache_dir: str | os.PathLike | None = None,
                      name: str | None = None, allow_paths_outside: bool = False) -> CocoColumns:
    """The columns of a COCO file: from its cache when the cache provably belongs to this very
    file (the rule above :func:`_file_key`: same size, mtime, ctime, device and inode as at
    build, or the same SHA-256 recorded under this user's MAC; same :data:`CACHE_VERSION`),
    else parsed (:func:`parse_coco_columns`) and, with ``cache``, cached (a cache that is not
    this file's is rebuilt with a :class:`DataWarning` saying why; a folder that cannot be
    written is said with one and the columns are used anyway). Repairs are warned of
    (:meth:`~validation.Report.finish`) each time, as ``load_coco`` does.
    ``allow_paths_outside``: as :func:`~detaug.formats.coco.load_coco`'s (a cache built with it
    is refused without it, naming the paths)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: COCO annotations file not found")
    folder = cache_folder(path, cache_dir)
    if not cache:
        return _parsed(path, name, allow_paths_outside)
    columns = _open_cache(path, folder)
    if columns is None:
        with _build_lock(folder):  # one build per file and node: the other ranks wait, then open it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)  # said by the first look
                columns = _open_cache(path, folder)
            if columns is None:
                try:
                    columns = _build_cache(path, folder, name, allow_paths_outside)
                except OSError as err:
                    _warn(f"{folder}: cannot write the annotation cache ({err}); parsed without it")
                    columns = _parsed(path, name, allow_paths_outside, warn=False)
                _warn_repairs(columns.report)
                return columns
    if getattr(columns, "outside", 0) and not allow_paths_outside:
        from detaug.formats.coco import load_coco

        load_coco(path, name=name)  # raises, naming every file_name outside the images folder
    _warn_repairs(columns.report)
    return columns


def _warn(text: str) -> None:
    """A :class:`DataWarning` pointing at the user's call (the first frame outside detaug)."""
    warnings.warn(text, DataWarning, stacklevel=v._caller_level())


def _parsed(path: Path, name: str | None, allow_paths_outside: bool, *, warn: bool = True) -> CocoColumns:
    """:func:`parse_coco_columns`, its repairs said once (with ``warn``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # said below, once
        columns = parse_coco_columns(path, name=name, allow_paths_outside=allow_paths_outside)
    columns.report.source = columns.source
    if warn:
        _warn_repairs(columns.report)
    return columns


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``<cache folder>.lock`` (beside the cache; left in place) while
    the cache is built, so that the ranks of one node build it once; no lock where the file
    cannot be made (the cache cannot be written there either)."""
    try:
        import fcntl

        folder.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder.with_name(folder.name + ".lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _build_cache(path: Path, folder: Path, name: str | None, allow_paths_outside: bool) -> CocoColumns:
    """Parse ``path`` into its cache folder and open it. In bounded memory (:func:`_stream`
    into the folder being written: the chunks' columns spilled to files there, the arrays
    written from them, 32 bytes an image in memory); a file the streaming parser does
    not take is read by ``load_coco`` (in memory) and saved. Nothing but the cache is left
    behind, also when the file has errors (:class:`DatasetError`)."""
    key = _file_key(path)

    def write(tmp: Path) -> dict[str, Any]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)  # said by the caller, once
                columns = _stream(path, name, CHUNK_BYTES, allow_paths_outside, tmp)
        except (_Irregular, RecursionError):  # RecursionError: a value nested too deeply
            for leftover in tmp.iterdir():  # the arrays written before the doubt
                leftover.unlink()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)
                columns = _by_load_coco(path, name, allow_paths_outside)
            for array_name, array in columns.arrays().items():
                np.save(tmp / f"{array_name}.npy", np.ascontiguousarray(array), allow_pickle=False)
        columns.report.source = columns.source
        digest = _file_hash(path)
        unchanged = _file_key(path) == key  # else: cached under a key that will not match
        return {**columns.meta(), "version": CACHE_VERSION, "key": key if unchanged else [-1] * 5, "sha256": digest,
                "outside": int(getattr(columns, "outside", 0))}

    _write_folder(folder, write, _stamp)
    arrays, meta = load_columns(folder)
    built = CocoColumns.from_columns(arrays, meta)
    built.cache = folder  # type: ignore[attr-defined]
    built.outside = meta["outside"]  # type: ignore[attr-defined]
    return built


def _open_cache(path: Path, folder: Path) -> CocoColumns | None:
    """The cached columns of ``path`` when its cache provably belongs to it, else ``None``
    (with a :class:`DataWarning` saying why, when there was a cache)."""
    if not os.path.lexists(folder / "meta.json"):
        return None
    try:
        meta = json.loads(_read_regular(folder / "meta.json", _META_BYTES))
        if not isinstance(meta, dict):
            raise ValueError("meta.json is not an object")
        if meta.get("version") != CACHE_VERSION:
            _warn(f"{folder}: a cache of another layout (version {str(meta.get('version'))[:20]}, this "
                  f"detaug writes {CACHE_VERSION}): rebuilt")
            return None
        trusted = meta.get("trusted")
        if (isinstance(trusted, list) and [_file_key(path), _files_key(folder)] in trusted
                and _signed_by_us(meta, _secret())):
            arrays, meta = load_columns(folder)
            columns = CocoColumns.from_columns(arrays, meta)
            columns.cache = folder  # type: ignore[attr-defined]
            columns.outside = int(meta.get("outside", 0))  # type: ignore[attr-defined]
            return columns
        why = _renew(path, folder, meta)
        if why is None:
            return _open_cache_renewed(folder)
    except (OSError, ValueError, KeyError, TypeError, DatasetError) as err:
        why = f"unreadable ({' '.join(str(err).split())[:200]})"
    _warn(f"{folder}: the annotation cache is not provably that of {path} ({why}): rebuilt")
    return None


def _open_cache_renewed(folder: Path) -> CocoColumns:
    arrays, meta = load_columns(folder)
    columns = CocoColumns.from_columns(arrays, meta)
    columns.cache = folder  # type: ignore[attr-defined]
    columns.outside = int(meta.get("outside", 0))  # type: ignore[attr-defined]
    return columns


def _renew(path: Path, folder: Path, meta: dict[str, Any]) -> str | None:
    """Renew the keys of a cache whose file was touched, copied or moved, when the file's SHA-256
    is the one recorded under this user's MAC and the arrays pass the checks; else why not."""
    secret = _secret()
    if secret is None:
        return "the file or the cache changed since it was built"
    digest, arrays_digest = meta.get("sha256"), meta.get("arrays_sha256")
    if not isinstance(digest, str) or not isinstance(arrays_digest, str) or not _signed_by_us(meta, secret):
        return "not built here: its record is not signed by this user's cache secret"
    key = _file_key(path)
    if _file_hash(path) != digest:
        return "the file changed since the cache was built"
    if _arrays_hash(folder) != arrays_digest:
        return "its arrays changed since it was built"
    arrays, meta = load_columns(folder, mmap_mode=None)
    columns = CocoColumns.from_columns(arrays, meta)
    _check_cached(columns, bool(meta.get("outside", 0)))
    trusted = [k for k in meta.get("trusted", []) if isinstance(k, list)][-(_TRUSTED_KEYS - 1):]
    meta = {**meta, "trusted": [*trusted, [key, _files_key(folder)]]}
    tmp = folder / f"meta.json.tmp-{os.getpid()}"
    try:  # kept for the next start-up; a read-only cache is used all the same
        tmp.write_text(json.dumps(meta, separators=(",", ":")))
        os.replace(tmp, folder / "meta.json")
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return None


def _check_cached(columns: CocoColumns, outside_allowed: bool) -> None:
    """Check cached columns as any source's (:func:`~validation.check_columns`, the file names
    inside the images folder unless the cache says some are not, the names' offsets); a
    :class:`DatasetError` at the first problem (the cache is then rebuilt: nothing is repaired
    in a cache)."""
    t = columns.table
    report = v.Report(f"{columns.source} (cache)")
    starts, names = np.asarray(columns.name_starts), np.asarray(columns.names)
    n = len(t.image_ids)
    if (starts.shape != (n + 1,) or starts[0] != 0 or (np.diff(starts) < 0).any() or starts[-1] != len(names)
            or np.asarray(columns.exif).shape != (n,) or np.asarray(columns.iscrowd).shape != (len(t.labels),)
            or np.asarray(columns.annotation_ids).shape != (len(t.labels),)):
        raise DatasetError(f"{report.source}: the name offsets or per-box columns do not fit the table")
    boxes, keep = v.check_columns(t.image_ids, t.sizes, t.box_starts, t.boxes, t.labels, columns.categories, report,
                                  lambda i: report.source)
    if not keep.all() or not np.array_equal(boxes, np.asarray(t.boxes, dtype=np.float32)) or report.total:
        raise DatasetError(f"{report.source}: its arrays do not pass the checks ({dict(report.counts)})")
    file_names = [columns.file_name(i) for i in range(n)]
    if not outside_allowed and v.outside_paths(file_names):
        raise DatasetError(f"{report.source}: a file_name outside the images folder")


def _warn_repairs(report: v.Report) -> None:
    repairs = report.repairs
    if repairs:
        what = ", ".join(f"{n} {r}" for r, n in sorted(repairs.items()))
        warnings.warn(f"{report.source or 'source'}: {what} (source.report.summary() has examples)", DataWarning,
                      stacklevel=3)


# -- the samples of CocoSource(cache=...) ----------------------------------------------------------

class _CocoImages:
    """``image_of`` of a COCO view: ``str(images_dir / file_name)``, as ``coco_to_samples``
    (picklable)."""

    def __init__(self, columns: CocoColumns, root: Path) -> None:
        self.columns, self.root = columns, Path(root)

    def __call__(self, row: int) -> str:
        return str(self.root / self.columns.file_name(row))


class _CocoFields:
    """``fields_of`` of a COCO view: :data:`~detaug.sources.COCO_FIELDS`, as ``coco_to_samples``
    gives them: ``iscrowd`` from the columns (zeros where the crowd boxes were left out: the
    view's table is then not the columns'), ``area`` the boxes' (picklable: the columns are
    pickled as their cache folder)."""

    def __init__(self, columns: CocoColumns, crowd: bool) -> None:
        self.columns, self.crowd = columns, crowd

    def __call__(self, start: int, end: int, boxes: np.ndarray) -> dict[str, np.ndarray]:
        crowd = np.asarray(self.columns.iscrowd[start:end], dtype=np.int64) if self.crowd else np.zeros(end - start, np.int64)
        return {"iscrowd": crowd, "area": box_area(boxes, np.float32)}


def coco_view(columns: CocoColumns, images_dir: str | os.PathLike, *, include_iscrowd: bool = True,
              skip_empty: bool = False) -> tuple[SampleView, v.Report]:
    """The samples of ``columns`` as :func:`~detaug.sources.coco_to_samples` gives them (crowd
    boxes left out with ``include_iscrowd=False``, images without boxes with ``skip_empty``,
    each counted as a note; the per-box fields ``iscrowd`` and ``area``), and the report with
    those notes."""
    report = columns.report
    table = columns.table
    rows = None
    crowd = np.asarray(columns.iscrowd)
    if not include_iscrowd and crowd.any():
        starts = np.asarray(table.box_starts)
        owner = np.repeat(np.arange(len(table)), np.diff(starts))
        left = np.flatnonzero(crowd)
        _add_many(report, v.CROWD_LEFT_OUT, len(left), lambda k: (
            f"{columns.source}: {columns.file_name(int(owner[left[k]]))}", int(table.image_ids[owner[left[k]]]),
            None if columns.annotation_ids[left[k]] == -1 else int(columns.annotation_ids[left[k]])))
        keep = ~crowd
        table = SampleTable(table.image_ids, table.sizes,
                            np.concatenate([[0], np.cumsum(np.bincount(owner[keep], minlength=len(table)))]).astype(np.int64),
                            np.asarray(table.boxes)[keep], np.asarray(table.labels)[keep])
    if skip_empty:
        counts = np.diff(np.asarray(table.box_starts))
        empty = np.flatnonzero(counts == 0)
        _add_many(report, v.EMPTY_IMAGE_LEFT_OUT, len(empty), lambda k: (
            f"{columns.source}: {columns.file_name(int(empty[k]))}", int(table.image_ids[empty[k]]), None))
        rows = np.flatnonzero(counts > 0).astype(np.int64)
    if table is not columns.table:
        columns.cache = None  # type: ignore[attr-defined]  # the view holds its own arrays: pickled as they are
    view = SampleView(table, _CocoImages(columns, Path(images_dir)), rows, _CocoFields(columns, table is columns.table))
    report.images = len(view)
    report.boxes = int(table.box_starts[-1]) if rows is None else int(np.diff(np.asarray(table.box_starts))[rows].sum())
    if not len(view):
        report.add(v.NO_IMAGES, columns.source, detail="every image was left out (skip_empty=True)")
        report.raise_errors()
    return view, report


