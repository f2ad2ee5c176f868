"""The streaming parser of COCO files into :class:`~detaug.formats.coco_columns.CocoColumns`
(:func:`parse_coco_columns`): the file read a chunk at a time (:mod:`detaug.formats.json_stream`),
each chunk's values appended to columns (in memory, or spilled to files in the cache folder being
built: bounded memory), the validation rules of :mod:`detaug.formats.validation` applied
column-wise, the kept boxes grouped by image. A file the fast path does not take is parsed by
:func:`detaug.formats.coco.load_coco` instead (:func:`_by_load_coco`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from detaug.formats import validation as v
from detaug.formats.box_formats import xywh_to_xyxy
from detaug.formats.coco_columns import CocoColumns, _add_many
from detaug.formats.column_store import SampleTable
from detaug.formats.json_stream import _File, _Irregular, _plain, _top_level


#: Bytes of the annotation file parsed at once by the streaming parser.
CHUNK_BYTES = 32 << 20


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
            raise _Irregular("keypoints")  # load_coco reads them (CocoColumns.keypoints)
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


def _by_load_coco(path: Path, name: str | None, allow_paths_outside: bool, masks: bool = False) -> CocoColumns:
    """The columns of a file the streaming parser does not take (or read with ``masks``: the
    streaming parser reads no segmentations), read by ``load_coco``."""
    from detaug.formats.coco import load_coco

    columns = CocoColumns.from_dataset(load_coco(path, name=name, allow_paths_outside=allow_paths_outside, masks=masks))
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
        raise _Irregular("keypoints")  # a keypoints file: load_coco reads it (CocoColumns.keypoints)
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
