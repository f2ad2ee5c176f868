"""Tar shards (WebDataset layout) and :class:`ShardSource`, the source that reads them.

Layout of a shard folder written by :func:`write_shards` (``detaug shards SRC OUT``)::

    OUT/shard-000000.tar     <key>.jpg (the encoded image as it was) + <key>.json, ... (~1 GB each)
    OUT/shard-000000.idx     DALI's webdataset index of that tar (``wds2idx`` format v1.2)
    OUT/dataset.json         categories, orientation, counts, the files skipped when writing
    OUT/manifest/            the columns of every sample (a cache of the JSONs, see below)

``<key>`` is the sample's position in the folder, zero-padded (``000000042``). ``<key>.json`` is
the truth about the sample: ``{"image_id": int, "boxes": [[x1, y1, x2, y2], ...] absolute xyxy
in continuous pixels (pixel i spans [i, i + 1)), "labels": [category id, ...], "size": [height,
width] or null, "file": the file it was written from, "fields": {name: [value per box, ...]}
(the source's per-box fields, such as ``iscrowd``, ``difficult`` or a track id; absent without
any)}``. The tars are plain POSIX tars that ``tar``, the ``webdataset`` library and DALI's
``fn.readers.webdataset`` (with the ``.idx`` files: no scan at start-up) read.

``manifest/`` holds the same facts as columns (:mod:`detaug.formats.columnar`: image ids,
declared sizes, box offsets, boxes, labels, the per-box fields as ``field_<k>`` in the order of
``dataset.json``'s ``"fields"`` ``[[name, dtype, shape], ...]``, and where each image's bytes
are in its tar), opened memory-mapped: a :class:`ShardSource` starts in the same time, and with
the same memory, for 1k or 10M samples, and holds no Python object per sample. It is rebuilt
from the tars and index files when missing (:func:`rebuild_manifest`).

Why detaug reads the tars by offset rather than through ``fn.readers.webdataset``: detaug plans
every sample's augmentation on the host before DALI decodes it (the boxes decide the crop), and
the Keras ``Sequence`` reads any batch in any order; a reader that streams the tars gives
neither. Reading ``(offset, size)`` from the index keeps random access, the skip rules of bad
images and the exact epochs of :mod:`detaug.epochs`.

Shuffling (:func:`shard_shuffled_order`): epoch ``e`` permutes the tar files, then the samples
within each tar, all drawn from :func:`detaug.seeds.order_generator` ``(seed, e)``; the ranks
then take their share of that one order by the rules of :mod:`detaug.epochs` (equal ranks, every
sample once per epoch). Neighbouring samples of an epoch come from the same tar, which keeps a
rank's reads local.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tarfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detaug.errors import DatasetError, DataWarning
from detaug.formats import validation as v
from detaug.formats.coco import read_json
from detaug.formats.columnar import SampleTable, SampleView, load_columns, save_columns
from detaug.sources import CheckedSamples, FieldSpec, SampleListSource, check_orientation, field_specs

__all__ = [
    "INDEX_VERSION", "ShardSource", "ShardSummary", "add_shards_parser", "parse_size", "read_index",
    "rebuild_manifest", "run_shards", "shard_shuffled_order", "write_shards",
]

#: The DALI webdataset index format written (``wds2idx``'s).
INDEX_VERSION = "v1.2"
#: Layout version of ``manifest/`` and ``dataset.json``.
MANIFEST_VERSION = 1
_BLOCK = 512
#: Image extensions by the format the header says (DALI's webdataset ``ext`` names them).
_EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "BMP": "bmp", "TIFF": "tiff", "WEBP": "webp", "PPM": "ppm",
               "JPEG2000": "jp2"}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes of ``"1GB"`` (10**9), ``"512MiB"`` (2**29), ``"100MB"``, ``"4096"``; ``ValueError``
    for anything else or a size < 1."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"not a size: {text!r} (e.g. 1GB, 512MiB, 100MB)")
        value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value < 1:
        raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    return value


# -- shuffling -------------------------------------------------------------------------------------

def shard_shuffled_order(sizes: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s order of tar-grouped samples: :func:`detaug.epochs.grouped_order`."""
    from detaug.epochs import grouped_order

    return grouped_order(sizes, seed, epoch)


# -- tar and index writing -------------------------------------------------------------------------

def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, 0o644, 0, tarfile.REGTYPE
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % _BLOCK)


class _TarWriter:
    """One tar file: members appended, their data offsets returned; ``close`` writes the end
    blocks and the DALI index file."""

    def __init__(self, path: Path) -> None:
        self.path, self.index_path = path, path.with_suffix(".idx")
        self.file = open(path, "wb")  # noqa: SIM115 - open across add() calls, closed by close()
        self.offset = 0
        self.lines: list[str] = []

    def add(self, key: str, members: list[tuple[str, bytes]]) -> list[int]:
        """Append ``<key>.<ext>`` members; the data offset of each."""
        offsets, parts = [], []
        for ext, data in members:
            header = _tar_header(f"{key}.{ext}", len(data))
            offsets.append(self.offset + len(header))
            parts += [header, data, _padding(len(data))]
            self.offset += len(header) + len(data) + len(parts[-1])
            self.file.write(header)
            self.file.write(data)
            self.file.write(parts[-1])
        self.lines.append(" ".join(f"{ext} {off} {len(data)} {key}.{ext}" for (ext, data), off in zip(members, offsets)))
        return offsets

    def close(self) -> int:
        """Finish the tar and its index; the tar's size in bytes."""
        self.file.write(b"\0" * (2 * _BLOCK))
        self.offset += 2 * _BLOCK
        self.file.close()
        self.index_path.write_text(f"{INDEX_VERSION} {len(self.lines)}\n" + "\n".join(self.lines) + "\n")
        return self.offset


def read_index(path: str | os.PathLike) -> list[dict[str, tuple[int, int, str]]]:
    """The samples of a DALI webdataset index file (v1.1/v1.2, as ``wds2idx`` writes): per
    sample ``{ext: (data offset, size, member name)}``. ``DatasetError`` naming the file when it
    is not one."""
    import stat

    if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would block, a device never end
        raise DatasetError(f"{path}: not a DALI webdataset index file (not a regular file)")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DatasetError(f"{path}: not a DALI webdataset index file (not UTF-8 text at byte {err.start})") from None
    head = lines[0].split() if lines else []
    if len(head) != 2 or not head[0].startswith("v1.") or not head[1].isdigit():
        raise DatasetError(f"{path}: not a DALI webdataset index file (first line {lines[:1]})")
    step = 4 if head[0] >= "v1.2" else 3
    samples = []
    for number, line in enumerate(lines[1:int(head[1]) + 1], start=2):
        parts = line.split()
        if not parts or len(parts) % step:
            raise DatasetError(f"{path}: line {number}: {line[:80]!r} is not {step} fields per component")
        sample = {}
        for k in range(0, len(parts), step):
            try:
                ext, offset, size = parts[k], int(parts[k + 1]), int(parts[k + 2])
            except ValueError:
                raise DatasetError(f"{path}: line {number}: {line[:80]!r}: offset and size are not integers") from None
            if offset < 0 or size < 0:
                raise DatasetError(f"{path}: line {number}: {line[:80]!r}: a negative offset or size")
            sample[ext] = (offset, size, parts[k + 3] if step == 4 else "")
        samples.append(sample)
    if len(samples) != int(head[1]):
        raise DatasetError(f"{path}: {len(samples)} samples but the header says {head[1]}")
    return samples


# -- writing shards from a source ------------------------------------------------------------------

@dataclass
class ShardSummary:
    """What :func:`write_shards` did.

    Attributes:
        out: the folder. shards: tar files written. samples: samples written. boxes: their boxes.
        bytes: bytes of the tar files. seconds: time taken.
        skipped: ``{"file", "image_id", "reason"}`` of each image not written (unreadable, or a
            header DALI would not decode).
    """

    out: Path
    shards: int = 0
    samples: int = 0
    boxes: int = 0
    bytes: int = 0
    seconds: float = 0.0
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def text(self) -> str:
        """A few lines for the terminal."""
        lines = [(f"{self.out}: {self.shards} shard(s), {self.samples} samples, {self.boxes} boxes, "
                  f"{self.bytes / 1e9:.3f} GB in {self.seconds:.1f} s")]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} image(s):")
            lines += [f"  {s['file']} (image_id {s['image_id']}): {s['reason']}" for s in self.skipped[:20]]
            if len(self.skipped) > 20:
                lines.append(f"  ... and {len(self.skipped) - 20} more (dataset.json lists them all)")
        return "\n".join(lines)


def _progress(total: int, enabled: bool) -> Any:
    """A progress bar on stderr: tqdm's where installed, else a plain one."""
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="img", file=sys.stderr, disable=not enabled, desc="shards")
    except ImportError:  # pragma: no cover - tqdm is usually there
        return _PlainBar(total, enabled)


class _PlainBar:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done, self.shown = total, enabled, 0, 0.0

    def update(self, k: int = 1) -> None:
        self.done += k
        now = time.monotonic()
        if self.enabled and (now - self.shown > 0.5 or self.done == self.total):
            self.shown = now
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            print(f"\rshards [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}", end="",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def write_shards(source: Any, out: str | os.PathLike, *, shard_size: int | str = "1GB", verify: bool = True,
                 progress: bool = True, prefix: str = "shard") -> ShardSummary:
    """Write every sample of ``source`` (any source of :mod:`detaug.sources` with encoded
    images) into tar shards of about ``shard_size`` bytes in ``out`` (layout: the module
    docstring), with their DALI index files, ``dataset.json`` and ``manifest/``.

    Args:
        source: the samples (read with ``source.load(i)``: the image bytes as they are, the
            checked boxes and labels, the image id; ``source.samples[i].size`` the declared size
            and ``.fields`` the per-box fields of ``source.field_specs``, kept with their boxes).
        out: the folder (created; tar files of an earlier run with the same prefix are replaced).
        shard_size: bytes per tar (``"1GB"``, ``"512MiB"``, an int); a sample larger than that
            gets a tar of its own.
        verify: probe each image's header (:func:`detaug.formats.images.probe_image`) and skip,
            naming it, one that DALI would not decode; ``False`` writes the bytes as they are
            (the loaders skip a bad one when they meet it).
        progress: show a progress bar on stderr.

    Returns:
        The :class:`ShardSummary` (also saved in ``dataset.json``).

    Raises:
        TypeError: a source of decoded arrays (shards hold encoded images).
        DatasetError: no sample could be written.
    """
    from detaug.formats.images import probe_image

    if getattr(source, "decoded", False):
        raise TypeError("write_shards needs encoded images (files or bytes); this source holds decoded arrays")
    limit = parse_size(shard_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob(f"{prefix}-*.tar")) + list(out.glob(f"{prefix}-*.idx")):
        old.unlink()
    started = time.monotonic()
    n = len(source)
    width = max(9, len(str(n)))
    summary = ShardSummary(out)
    shards: list[dict[str, Any]] = []
    ids, sizes, counts, offsets, lengths, exts = [], [], [], [], [], []
    boxes_parts: list[np.ndarray] = []
    label_parts: list[np.ndarray] = []
    specs = field_specs(source)
    if "masks" in specs:  # said, not written wrong (issue 41: shards hold no masks yet; detaug.masks)
        raise DatasetError("write_shards: the source has instance masks (field 'masks'); shards do not hold masks "
                           "yet: train from the source itself, or pass a source without masks")
    sample_fields: list[dict[str, np.ndarray]] = []
    ext_names: list[str] = []
    writer: _TarWriter | None = None
    bar = _progress(n, progress)

    def close_shard() -> None:
        nonlocal writer
        if writer is not None:
            size = writer.close()
            shards[-1]["bytes"] = size
            summary.bytes += size
            writer = None

    try:
        for i in range(n):
            bar.update(1)
            try:
                data, boxes, labels, image_id = source.load(i)
            except (OSError, ValueError) as err:
                reason = f"cannot read the file: {err.strerror or err}" if isinstance(err, OSError) else str(err)
                summary.skipped.append({"file": source.file_of(i), "image_id": source.samples[i].image_id,
                                        "reason": reason})
                continue
            data = np.asarray(data, dtype=np.uint8).reshape(-1)
            info = probe_image(data) if verify else None
            if info is not None and info.problem is not None:
                summary.skipped.append({"file": source.file_of(i), "image_id": int(image_id), "reason": info.problem})
                continue
            fmt = info.format if info is not None else None
            ext = _EXTENSIONS.get(fmt or "") or _extension_of(source.file_of(i))
            if ext not in ext_names:
                ext_names.append(ext)
            boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
            labels = np.asarray(labels, dtype=np.int64).reshape(-1)
            size = source.samples[i].size
            fields = _typed_fields(getattr(source.samples[i], "fields", None) or {}, specs, len(boxes))
            record = {"image_id": int(image_id), "boxes": boxes.tolist(), "labels": labels.tolist(),
                      "size": list(size) if size is not None else None, "file": source.file_of(i)}
            if specs:
                record["fields"] = {name: values.tolist() for name, values in fields.items()}
            payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
            raw = data.tobytes()
            need = 4 * _BLOCK + len(raw) + len(payload) + 2 * _BLOCK
            if writer is not None and writer.offset + need > limit:
                close_shard()
            if writer is None:
                name = f"{prefix}-{len(shards):06d}.tar"
                writer = _TarWriter(out / name)
                shards.append({"tar": name, "index": Path(name).with_suffix(".idx").name, "samples": 0, "bytes": 0})
            key = f"{summary.samples:0{width}d}"
            offset, _ = writer.add(key, [(ext, raw), ("json", payload)])
            shards[-1]["samples"] += 1
            summary.samples += 1
            summary.boxes += len(boxes)
            ids.append(int(image_id))
            sizes.append(size or (0, 0))
            counts.append(len(boxes))
            offsets.append(offset)
            lengths.append(len(raw))
            exts.append(ext_names.index(ext))
            boxes_parts.append(boxes)
            label_parts.append(labels)
            sample_fields.append(fields)
        close_shard()
    finally:
        bar.close()
        if writer is not None:
            writer.file.close()
    if not summary.samples:
        raise DatasetError(f"{out}: no sample could be written; the first problem: "
                           f"{summary.skipped[0] if summary.skipped else 'the source is empty'}")
    summary.shards = len(shards)
    table = SampleTable(
        np.asarray(ids, dtype=np.int64), np.asarray(sizes, dtype=np.int32).reshape(-1, 2),
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        np.concatenate(boxes_parts).reshape(-1, 4).astype(np.float32),
        np.concatenate(label_parts).astype(np.int32),
    )
    dataset = {
        "version": MANIFEST_VERSION, "categories": [[int(k), str(name)] for k, name in source.categories.items()],
        "orientation": getattr(source, "orientation", "auto"), "key_width": width, "extensions": ext_names,
        "shards": shards, "samples": summary.samples, "boxes": summary.boxes, "skipped": summary.skipped,
        "written_from": str(getattr(source, "report", None) and source.report.source or type(source).__name__),
        "fields": [[name, spec.dtype.str, list(spec.shape)] for name, spec in specs.items()],
    }
    summary.seconds = time.monotonic() - started
    save_manifest(out, table, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64), np.asarray(exts, np.uint8),
                  dataset, _field_columns(sample_fields, specs))
    return summary


def _typed_fields(fields: Any, specs: dict[str, FieldSpec], n: int) -> dict[str, np.ndarray]:
    """A sample's per-box ``fields`` (arrays or a JSON record's lists) as their specs' arrays
    ``[n, *shape]``."""
    return {name: np.asarray(fields[name], dtype=spec.dtype).reshape(n, *spec.shape) for name, spec in specs.items()}


def _field_columns(per_sample: list[dict[str, np.ndarray]], specs: dict[str, FieldSpec]) -> dict[str, np.ndarray]:
    """The manifest's columns of the per-box fields: each field of every sample, in order."""
    return {name: np.concatenate([f[name] for f in per_sample] or [np.zeros((0, *spec.shape), spec.dtype)])
            for name, spec in specs.items()}


def _specs_of(dataset: dict[str, Any]) -> dict[str, FieldSpec]:
    """The per-box fields of a shard folder (``dataset.json``'s ``"fields"``; none in a folder
    written before shards kept them)."""
    return {str(name): FieldSpec(np.dtype(dtype), tuple(int(k) for k in shape))
            for name, dtype, shape in dataset.get("fields", [])}


def _extension_of(file: str) -> str:
    suffix = Path(file.split(":")[-1]).suffix.lower().lstrip(".")
    return {"jpeg": "jpg", "tif": "tiff"}.get(suffix, suffix) or "img"


def save_manifest(out: Path, table: SampleTable, offsets: np.ndarray, lengths: np.ndarray, exts: np.ndarray,
                  dataset: dict[str, Any], fields: dict[str, np.ndarray] | None = None) -> None:
    """Write ``dataset.json`` and ``manifest/`` (the columns, with the labels present and the
    largest box count, so that no loader scans every sample at start-up); ``fields``: the
    per-box fields' columns, in the order of ``dataset["fields"]``."""
    labels = np.unique(np.asarray(table.labels)).astype(np.int64)
    most = table.max_boxes()
    meta = {"version": MANIFEST_VERSION, "samples": len(table), "present_labels": labels.tolist(), "max_boxes": most,
            "shards": [s["tar"] for s in dataset["shards"]],
            "shard_samples": [int(s["samples"]) for s in dataset["shards"]]}
    columns = {f"field_{k}": values for k, values in enumerate((fields or {}).values())}
    save_columns(out / "manifest", {**table.arrays(), "offsets": offsets, "lengths": lengths, "exts": exts, **columns},
                 meta)
    (out / "dataset.json").write_text(json.dumps(dataset, indent=1))


def rebuild_manifest(out: str | os.PathLike, *, allow_paths_outside: bool = False) -> None:
    """Rebuild ``manifest/`` of a shard folder from its tar files, their index files and the
    samples' JSONs (``dataset.json`` gives the tar files' order and the categories; without it,
    the tars in name order and the labels as category names). Slow (reads every JSON): for a
    folder whose manifest was lost. Tar and index files named outside the folder: as
    :class:`ShardSource` (``allow_paths_outside``)."""
    out = Path(out)
    dataset_file = out / "dataset.json"
    if dataset_file.is_file():
        dataset = read_json(dataset_file)
        try:
            _check_names([str(s[k]) for s in dataset["shards"] for k in ("tar", "index")], dataset_file,
                         allow_paths_outside)
        except (KeyError, TypeError) as err:
            raise DatasetError(f"{dataset_file}: not a shard folder's dataset.json ({type(err).__name__}: {err})") from None
    else:
        tars = sorted(p.name for p in out.glob("*.tar"))
        dataset = {"version": MANIFEST_VERSION, "categories": None, "orientation": "auto",
                   "shards": [{"tar": t, "index": Path(t).with_suffix(".idx").name} for t in tars], "skipped": []}
    ids, sizes, counts, offsets, lengths, exts, boxes, labels = [], [], [], [], [], [], [], []
    records_fields: list[dict[str, Any]] = []
    ext_names: list[str] = []
    width = 0
    for shard in dataset["shards"]:
        entries = read_index(out / shard["index"])
        with open(out / shard["tar"], "rb") as f:
            for entry in entries:
                if "json" not in entry:
                    raise DatasetError(f"{out / shard['tar']}: sample {entry} has no .json member")
                image = next(((e, c) for e, c in entry.items() if e != "json"), None)
                if image is None:
                    raise DatasetError(f"{out / shard['tar']}: sample {entry} has no image member")
                off, size, _ = entry["json"]
                try:
                    record = json.loads(os.pread(f.fileno(), size, off))
                except (ValueError, RecursionError) as err:
                    raise DatasetError(f"{out / shard['tar']}: {entry['json'][2] or entry}: not JSON "
                                       f"({' '.join(str(err).split())[:120]})") from None
                ext, (img_off, img_size, member) = image
                width = max(width, len(member.split(".")[0]))
                if ext not in ext_names:
                    ext_names.append(ext)
                try:
                    if not isinstance(record, dict):
                        raise TypeError(f"a {type(record).__name__}, not an object")
                    b = np.asarray(record["boxes"], dtype=np.float32).reshape(-1, 4)
                    image_id = int(record["image_id"])
                    size = np.asarray(record.get("size") or (0, 0), dtype=np.int32).reshape(2)
                    sample_labels = np.asarray(record["labels"], dtype=np.int64).reshape(-1)
                    if len(sample_labels) != len(b):
                        raise ValueError(f"{len(b)} boxes, {len(sample_labels)} labels")
                except (KeyError, TypeError, ValueError, OverflowError) as err:
                    raise DatasetError(f"{out / shard['tar']}: {entry['json'][2] or entry}: not a sample record "
                                       f"({type(err).__name__}: {' '.join(str(err).split())[:120]})") from None
                ids.append(image_id)
                sizes.append(size)
                counts.append(len(b))
                offsets.append(img_off)
                lengths.append(img_size)
                exts.append(ext_names.index(ext))
                boxes.append(b)
                labels.append(sample_labels)
                records_fields.append(record.get("fields") or {})
        shard["samples"], shard["bytes"] = len(entries), (out / shard["tar"]).stat().st_size
    table = SampleTable(np.asarray(ids, np.int64), np.asarray(sizes, np.int32).reshape(-1, 2),
                        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                        np.concatenate(boxes or [np.zeros((0, 4), np.float32)]).reshape(-1, 4),
                        np.concatenate(labels or [np.zeros(0, np.int64)]).astype(np.int32))
    if dataset.get("categories") is None:
        dataset["categories"] = [[int(k), str(int(k))] for k in table.present_labels()]
    if "fields" not in dataset:  # no dataset.json
        dataset["fields"] = _inferred_fields(records_fields, counts)
    specs = _specs_of(dataset)
    try:
        columns = _field_columns([_typed_fields(f, specs, n) for f, n in zip(records_fields, counts)], specs)
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"{out}: a sample record's per-box fields do not fit dataset.json's \"fields\" "
                           f"({type(err).__name__}: {' '.join(str(err).split())[:120]})") from None
    dataset.update(key_width=width, extensions=ext_names, samples=len(table), boxes=int(table.box_starts[-1]))
    save_manifest(out, table, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64), np.asarray(exts, np.uint8),
                  dataset, columns)


def _inferred_fields(records_fields: list[dict[str, Any]], counts: list[int]) -> list[list[Any]]:
    """``dataset.json``'s ``"fields"`` from the samples' JSONs alone: the fields every record
    has, in name order, typed by their values (int64 for whole numbers, else float32), shaped
    by a sample with boxes."""
    names = set.intersection(*(set(f) for f in records_fields)) if records_fields else set()
    found = []
    for name in sorted(names):
        values = [np.asarray(f[name]) for f, n in zip(records_fields, counts) if n]
        if not values:
            found.append([name, np.dtype(np.int64).str, []])
            continue
        kind = np.result_type(*values).kind
        dtype = np.dtype(np.int64) if kind in "biu" else np.dtype(np.float32)
        found.append([name, dtype.str, list(values[0].shape[1:])])
    return found


# -- the source ------------------------------------------------------------------------------------

class _TarMember:
    """``image_of`` of a shard view: ``"<folder>/<tar>:<key>.<ext>"`` (picklable)."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source

    def __call__(self, row: int) -> str:
        return self.source.member_of(row)


class _ShardFields:
    """``fields_of`` of a shard view: the per-box fields' rows of a sample (picklable)."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source

    def __call__(self, start: int, end: int, boxes: np.ndarray) -> dict[str, np.ndarray]:
        return {name: np.array(column[start:end]) for name, column in self.source.field_columns.items()}


class ShardSource(SampleListSource):
    """The samples of a shard folder written by :func:`write_shards` (``detaug shards``), read
    by offset from the tar files (the module docstring says why).

    Every rule of the other sources holds: ``source.samples[i]`` is the ``i``-th sample of the
    folder (a :class:`~detaug.sources.Sample` built on demand; its ``image`` names the tar
    member, ``"OUT/shard-000003.tar:000012345.jpg"``; its ``fields`` the per-box fields the
    folder was written with, :attr:`field_specs`), ``load(i)`` gives its bytes as written, an
    image that cannot be decoded is named and skipped by the loaders, and ``DetectionLoader`` /
    ``DetectionSequence`` give exact epochs, equal ranks and resumable states. Start-up opens
    ``manifest/`` memory-mapped (no scan of the tars; the same time for any number of samples);
    a process keeps resident only the pages of the samples it reads.

    Args:
        root: the folder (``dataset.json``, ``manifest/``, ``*.tar``, ``*.idx``); a missing
            manifest is rebuilt (:func:`rebuild_manifest`).
        shuffle, seed, shard_id, num_shards: as :class:`~detaug.sources.CocoSource`'s, kept for
            the loaders. With shuffle, epochs permute whole tars, then samples within each
            (:func:`shard_shuffled_order`), where the loaders take the source's order (see
            :meth:`epoch_order`).
        orientation: the frame of the boxes of EXIF-rotated images; ``None``: the one the
            folder was written with.
        allow_paths_outside: accept tar and index files that ``manifest/meta.json`` or
            ``dataset.json`` name by an absolute path or one leaving the folder with ``..``
            (default: a :class:`~detaug.errors.DatasetError`; docs/security.md).

    The manifest is untrusted input and passes the checks of every source
    (:func:`detaug.formats.validation.check_columns`, vectorised): unique image ids, valid
    sizes, labels among the categories, finite boxes (errors); empty boxes and boxes outside
    the declared image dropped, boxes partly outside clipped (repairs, counted in ``report``
    and said with one :class:`~detaug.errors.DataWarning`; the repaired columns are then held
    in memory). Each image's bytes must lie inside its tar.

    Raises:
        FileNotFoundError: the folder, or one of its tar files, is missing.
        DatasetError: a tar file shorter than the manifest says (truncated), a manifest of
            another version, a path outside the folder, or a manifest that fails the checks
            (the message names the folder, the tar member and the image id).
    """

    def __init__(self, root: str | os.PathLike, *, shuffle: bool = False, seed: int | None = None,
                 shard_id: int | None = None, num_shards: int | None = None, orientation: str | None = None,
                 allow_paths_outside: bool = False) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.root}: shard folder not found")
        self.shuffle, self.seed, self.shard_id, self.num_shards = shuffle, seed, shard_id, num_shards
        self.allow_paths_outside = allow_paths_outside
        self._options = {"shuffle": shuffle, "seed": seed, "shard_id": shard_id, "num_shards": num_shards,
                         "orientation": orientation, "allow_paths_outside": allow_paths_outside}
        if not (self.root / "manifest" / "meta.json").is_file():
            rebuild_manifest(self.root, allow_paths_outside=allow_paths_outside)
        manifest = self.root / "manifest"
        try:
            arrays, meta = load_columns(manifest)
            self.dataset = read_json(self.root / "dataset.json")
            if meta.get("version") != MANIFEST_VERSION:
                raise DatasetError(f"{manifest}: manifest version {str(meta.get('version'))[:20]}, "
                                   f"this detaug reads {MANIFEST_VERSION} (rebuild it: detaug.shards.rebuild_manifest)")
            self.table = SampleTable.from_arrays(arrays)
            self.offsets, self.lengths, self.exts = arrays["offsets"], arrays["lengths"], arrays["exts"]
            names = [str(name) for name in meta["shards"]]
            _check_names(names, manifest / "meta.json", allow_paths_outside)
            _check_names([str(s["tar"]) for s in self.dataset["shards"]] + [str(s["index"]) for s in self.dataset["shards"]],
                         self.root / "dataset.json", allow_paths_outside)
            self.tars = [str(self.root / name) for name in names]
            self.shard_sizes = tuple(int(k) for k in meta["shard_samples"])
            if len(self.shard_sizes) != len(names) or len(names) != len(self.dataset["shards"]) or any(
                    str(s["tar"]) != name for s, name in zip(self.dataset["shards"], names)):
                raise DatasetError(f"{manifest / 'meta.json'}: its tar files differ from those of dataset.json")
            self._shard_starts = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)
            self._present = np.asarray(meta["present_labels"], dtype=np.int64)
            self._max_boxes = int(meta["max_boxes"])
            self._width = int(self.dataset["key_width"])
            if not 1 <= self._width <= 32:
                raise DatasetError(f"{self.root / 'dataset.json'}: key_width {self._width} is not 1..32")
            self._ext_names = [str(e) for e in self.dataset["extensions"]]
            specs = _specs_of(self.dataset)
            self.field_columns = {name: arrays[f"field_{k}"] for k, name in enumerate(specs)}
            categories = {int(k): str(name) for k, name in self.dataset["categories"]}
            orientation = check_orientation(orientation if orientation is not None
                                            else self.dataset.get("orientation", "auto"))
            self._files: dict[int, int] = {}
            self._check_tars()
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            if isinstance(err, DatasetError):
                raise
            raise DatasetError(f"{manifest}: not a shard manifest detaug wrote ({type(err).__name__}: "
                               f"{' '.join(str(err).split())[:200]})") from None
        report = self._check_manifest(categories, specs)
        view = SampleView(self.table, _TarMember(self), fields_of=_ShardFields(self) if specs else None)
        super().__init__(CheckedSamples(view, categories, report, specs), orientation=orientation)  # type: ignore[arg-type]
        if self.skipped_when_written:  # named when written; said again to whoever reads the folder
            first = self.skipped_when_written[0]
            warnings.warn(f"{self.root}: {len(self.skipped_when_written)} image(s) left out when the shards were "
                          f"written, e.g. {first['file']} (image_id {first['image_id']}): {first['reason']} "
                          "(source.skipped_when_written lists them)", DataWarning, stacklevel=2)

    def _check_tars(self) -> None:
        """Every tar is there and as long as when it was written (one ``stat`` per tar)."""
        self._tar_bytes = []
        for tar, shard in zip(self.tars, self.dataset["shards"]):
            try:
                size = os.stat(tar).st_size
            except FileNotFoundError:
                raise FileNotFoundError(f"{tar}: tar file of the shard folder not found") from None
            if size < int(shard["bytes"]):
                raise DatasetError(f"{tar}: {size} bytes, {shard['bytes']} when written (truncated?)")
            self._tar_bytes.append(size)

    def _check_manifest(self, categories: dict[int, int | str], specs: dict[str, FieldSpec]) -> v.Report:
        """Check the manifest's columns as every source's are (vectorised); repairs make the
        table an in-memory copy. The report (raised when it has errors, warned of when it has
        repairs)."""
        report = v.Report(str(self.root))
        t = self.table
        n = len(t.image_ids)
        offsets, lengths, exts = (np.asarray(a) for a in (self.offsets, self.lengths, self.exts))
        if (offsets.shape != (n,) or lengths.shape != (n,) or exts.shape != (n,) or sum(self.shard_sizes) != n
                or min(self.shard_sizes, default=0) < 0):
            raise DatasetError(f"{self.root / 'manifest'}: offsets, lengths, exts or shard_samples do not fit "
                               f"the {n} samples")
        member = self.member_of if len(self._ext_names) else (lambda r: f"{self.root}: sample {r}")
        if n:
            shard = np.repeat(np.arange(len(self.shard_sizes)), self.shard_sizes)
            ends = np.asarray(self._tar_bytes, dtype=np.int64)[shard]
            bad = np.flatnonzero((offsets < 0) | (lengths < 0) | (offsets > ends - lengths) | (exts >= len(self._ext_names)))
            if len(bad):
                r = int(bad[0])
                raise DatasetError(f"{self.root / 'manifest'}: sample {r} (image_id {int(t.image_ids[r])}): "
                                   f"bytes {int(offsets[r])}+{int(lengths[r])} (ext {int(exts[r])}) are not inside "
                                   f"its tar {self.tars[int(shard[r])]} ({int(ends[r])} bytes); "
                                   f"{len(bad)} such sample(s)")
        for name, column in self.field_columns.items():
            spec = specs[name]
            if spec.dtype.kind not in "biuf" or column.dtype != spec.dtype or column.shape[1:] != spec.shape:
                raise DatasetError(f"{self.root / 'dataset.json'}: field {name!r} is {spec.dtype} {list(spec.shape)}, "
                                   f"its column {column.dtype} {list(column.shape[1:])} (numbers only)")
            if len(column) != len(t.boxes):
                raise DatasetError(f"{self.root / 'manifest'}: field {name!r} has {len(column)} rows, "
                                   f"{len(t.boxes)} boxes")
        boxes, keep = v.check_columns(t.image_ids, t.sizes, t.box_starts, t.boxes, t.labels, categories, report,
                                      member)
        report.raise_errors()
        labels = np.asarray(t.labels)
        if len(labels) and int(labels.min()) >= 0 and int(labels.max()) < 1 << 24:
            present = np.flatnonzero(np.bincount(labels[keep] if report.repairs else labels)).astype(np.int64)
        else:
            present = np.unique(labels[keep]).astype(np.int64)
        self._present = present  # the manifest's own list is not trusted
        self._max_boxes = int(np.diff(np.asarray(t.box_starts)).max(initial=0))
        if report.repairs:
            owner = np.repeat(np.arange(n), np.diff(np.asarray(t.box_starts)))[keep]
            starts = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n))]).astype(np.int64)
            self.table = SampleTable(np.asarray(t.image_ids), np.asarray(t.sizes), starts, boxes[keep],
                                     np.asarray(t.labels)[keep])
            self.field_columns = {name: np.asarray(c)[keep] for name, c in self.field_columns.items()}
            self._max_boxes = int(np.diff(starts).max(initial=0))
        report.images, report.boxes = n, int(self.table.box_starts[-1])
        report.finish()
        return report

    # -- what the loaders use --------------------------------------------------------------------

    def shard_of(self, index: int) -> int:
        """The tar file (its number) holding sample ``index``."""
        return int(np.searchsorted(self._shard_starts, index, side="right") - 1)

    def member_of(self, index: int) -> str:
        """``"<tar>:<key>.<ext>"`` of sample ``index``."""
        return f"{self.tars[self.shard_of(index)]}:{index:0{self._width}d}.{self._ext_names[int(self.exts[index])]}"

    def file_of(self, index: int) -> str:
        """The tar member of sample ``index`` (``"OUT/shard-000003.tar:000012345.jpg"``)."""
        self.samples.row(index)  # IndexError out of range  # type: ignore[attr-defined]
        return self.member_of(index % len(self))

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(data uint8 [L] the image bytes, boxes float32 [N, 4] xyxy, labels int64 [N],
        image_id)`` of sample ``index``; ``OSError`` naming the tar member when it cannot be read."""
        r = self.samples.row(index)  # type: ignore[attr-defined]
        shard = self.shard_of(r)
        offset, length = int(self.offsets[r]), int(self.lengths[r])
        try:
            fd = self._files.get(shard)
            if fd is None:
                fd = self._files[shard] = os.open(self.tars[shard], os.O_RDONLY)
            data = os.pread(fd, length, offset)
        except OSError as err:
            raise OSError(err.errno, f"{self.member_of(r)}: cannot read the image: {err.strerror or err}") from err
        if len(data) != length:
            raise OSError(5, f"{self.member_of(r)}: {len(data)} of {length} bytes (the tar is truncated)")
        t = self.table
        return np.frombuffer(data, np.uint8), t.boxes_of(r), t.labels_of(r), int(t.image_ids[r])

    def present_labels(self) -> np.ndarray:
        """int64: the distinct labels of all boxes, sorted (from the manifest, no scan)."""
        return self._present.copy()

    def max_boxes(self) -> int:
        """The largest number of boxes of one sample (from the manifest)."""
        return self._max_boxes

    def epoch_order(self, epoch: int, seed: int) -> np.ndarray:
        """int64 ``[n]``: the shuffled order of epoch ``epoch`` (:func:`shard_shuffled_order`)."""
        return shard_shuffled_order(self.shard_sizes, seed, epoch)

    @property
    def skipped_when_written(self) -> list[dict[str, Any]]:
        """The images :func:`write_shards` left out (``{"file", "image_id", "reason"}``)."""
        return list(self.dataset.get("skipped", []))

    def close(self) -> None:
        """Close the tar files opened so far (they open again when read)."""
        files, self._files = self._files, {}
        for fd in files.values():
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its folder and options (a worker process opens the manifest again)."""
        return (_open_shard_source, (str(self.root), self._options))

    def __repr__(self) -> str:
        return f"ShardSource({str(self.root)!r}, {len(self)} samples in {len(self.tars)} tar file(s))"


def _check_names(names: Sequence[str], file: Path, allow_paths_outside: bool) -> None:
    """A :class:`DatasetError` naming ``file`` and the path when one of the file ``names`` it
    gives is absolute or leaves the shard folder (:func:`detaug.formats.validation.path_problem`)."""
    if allow_paths_outside:
        return
    for name in names:
        why = v.path_problem(name)
        if why is not None:
            raise DatasetError(f"{file}: {v.PATH_OUTSIDE}: {name[:200]!r} {why} "
                               "(allow_paths_outside=True accepts it)")


def _open_shard_source(root: str, options: dict[str, Any]) -> ShardSource:
    """A pickled source opened again (in a worker process): the same checks and repairs, said
    once by the process that built it."""
    import warnings

    from detaug.errors import DataWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        return ShardSource(root, **options)


def iter_webdataset(root: str | os.PathLike, *, allow_paths_outside: bool = False) -> Iterator[tuple[str, str]]:
    """``(tar, index)`` paths of a shard folder, in order (for ``fn.readers.webdataset``'s
    ``paths`` and ``index_paths``); paths outside the folder as :class:`ShardSource`."""
    dataset = read_json(Path(root) / "dataset.json")
    _check_names([str(s[k]) for s in dataset["shards"] for k in ("tar", "index")], Path(root) / "dataset.json",
                 allow_paths_outside)
    for shard in dataset["shards"]:
        yield str(Path(root) / shard["tar"]), str(Path(root) / shard["index"])


# -- the command line ------------------------------------------------------------------------------

def add_shards_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add ``detaug shards SRC OUT`` to a subparsers object; its ``run`` default is
    :func:`run_shards`."""
    parser = subparsers.add_parser(
        "shards", parents=list(parents), help="write tar shards (WebDataset layout, DALI index files) from a dataset",
        description="Write the samples of a VOC folder or a COCO JSON into tar shards of about --shard-size bytes "
                    "(<key>.jpg + <key>.json each), with DALI index files and a manifest for ShardSource.")
    parser.add_argument("src", metavar="SRC", help="a VOC folder (Annotations/, JPEGImages/) or a COCO JSON file")
    parser.add_argument("out", metavar="OUT", help="the folder to write")
    parser.add_argument("--shard-size", default="1GB", type=_size_arg, help="bytes per tar file (default: %(default)s)")
    parser.add_argument("--images", metavar="DIR",
                        help="images folder of a COCO JSON (default: the JSON's folder's images/ if there, else its folder)")
    parser.add_argument("--split", help="VOC split (ImageSets/Main/<split>.txt); default: every XML")
    parser.add_argument("--labels", default="discover", help="VOC labels: voc, discover or a labels file")
    parser.add_argument("--prefix", default="shard", help="tar file names: PREFIX-000000.tar (default: %(default)s)")
    parser.add_argument("--no-verify", action="store_true", help="write image bytes without probing their headers")
    parser.add_argument("--allow-paths-outside", action="store_true",
                        help="accept COCO file_name entries that are absolute or leave the images folder with .. "
                             "(default: an error naming them; docs/security.md)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run_shards)
    return parser


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def source_of(src: str, *, images: str | None = None, split: str | None = None, labels: str = "discover",
              allow_paths_outside: bool = False) -> Any:
    """The source ``detaug shards`` reads: a VOC folder, or a COCO JSON with its images folder
    (``allow_paths_outside``: :class:`~detaug.sources.CocoSource`'s), chosen by
    :func:`detaug.source_args.source_from_args` (a :class:`~detaug.cli_support.CliError`
    naming the option for a user error)."""
    from detaug.source_args import source_from_args

    return source_from_args(argparse.Namespace(src=src, images=images, split=split, labels=labels,
                                               allow_paths_outside=allow_paths_outside))


def run_shards(args: argparse.Namespace) -> int:
    """``detaug shards``: write the shards, print the summary (stdout) and the progress (stderr).
    Exit status 0 (images skipped are named in the summary)."""
    source = source_of(args.src, images=args.images, split=args.split, labels=args.labels,
                       allow_paths_outside=getattr(args, "allow_paths_outside", False))
    print(source.report.summary(), file=sys.stderr)
    summary = write_shards(source, args.out, shard_size=args.shard_size, verify=not args.no_verify,
                           progress=not args.quiet, prefix=args.prefix)
    print(summary.text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m detaug.shards SRC OUT ...`` (the same as ``detaug shards``)."""
    parser = argparse.ArgumentParser(prog="detaug")
    sub = parser.add_subparsers(dest="command", required=True)
    add_shards_parser(sub)
    args = parser.parse_args(["shards", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
