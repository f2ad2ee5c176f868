"""Writing a shard folder (``detaug shards SRC OUT``): the tars, their ``.idx`` files, ``dataset.json``
and ``manifest/``, with a progress bar and a :class:`ShardSummary` of what was written and skipped.

The layout of a shard folder is described in :mod:`detaug.shards`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detaug.errors import DatasetError
from detaug.formats.column_store import SampleTable
from detaug.masks import MASKS
from detaug.shard_manifest import MANIFEST_VERSION, _field_columns, _typed_fields, mask_segmentations, save_manifest
from detaug.sources import field_specs


#: The DALI webdataset index format written (``wds2idx``'s).
INDEX_VERSION = "v1.2"
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
    specs = dict(field_specs(source))
    masks: list[Any] | None = [] if specs.pop(MASKS, None) is not None else None  # kept as segmentations
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
            given = getattr(source.samples[i], "fields", None) or {}
            fields = _typed_fields(given, specs, len(boxes))
            record = {"image_id": int(image_id), "boxes": boxes.tolist(), "labels": labels.tolist(),
                      "size": list(size) if size is not None else None, "file": source.file_of(i)}
            if specs:
                record["fields"] = {name: values.tolist() for name, values in fields.items()}
            if masks is not None:
                try:  # masks that are not one well-formed row per box: the sample is named and skipped
                    record["masks"] = segs = mask_segmentations(given.get(MASKS), len(boxes), source.file_of(i))
                except DatasetError as err:
                    summary.skipped.append({"file": source.file_of(i), "image_id": int(image_id),
                                            "reason": str(err).removeprefix(f"{source.file_of(i)}: ")})
                    continue
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
            if masks is not None:
                masks.extend(segs)
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
        "masks": masks is not None,
    }
    summary.seconds = time.monotonic() - started
    save_manifest(out, table, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64), np.asarray(exts, np.uint8),
                  dataset, _field_columns(sample_fields, specs), masks)
    return summary


def _extension_of(file: str) -> str:
    suffix = Path(file.split(":")[-1]).suffix.lower().lstrip(".")
    return {"jpeg": "jpg", "tif": "tiff"}.get(suffix, suffix) or "img"
