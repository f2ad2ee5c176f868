"""The manifest of a shard folder: DALI's ``.idx`` index files read back, ``manifest/`` (the columns of
every sample) saved, and rebuilt from the tars and index files when missing.

The layout of a shard folder is described in :mod:`detaug.shards`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detaug.errors import DatasetError
from detaug.formats.coco import read_json
from detaug.formats.column_store import SampleTable, save_columns
from detaug.formats.paths import path_problem
from detaug.formats.report import PATH_OUTSIDE
from detaug.sources import FieldSpec


#: Layout version of ``manifest/`` and ``dataset.json``.
MANIFEST_VERSION = 1


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


def _typed_fields(fields: Any, specs: dict[str, FieldSpec], n: int) -> dict[str, np.ndarray]:
    """A sample's per-box ``fields`` (arrays or a JSON record's lists) as their specs' arrays
    ``[n, *shape]``."""
    return {name: np.asarray(fields[name], dtype=spec.dtype).reshape(n, *spec.shape) for name, spec in specs.items()}


def _field_columns(per_sample: list[dict[str, np.ndarray]], specs: dict[str, FieldSpec]) -> dict[str, np.ndarray]:
    """The manifest's columns of the per-box fields: each field of every sample, in order."""
    return {name: np.concatenate([f[name] for f in per_sample] or [np.zeros((0, *spec.shape), spec.dtype)])
            for name, spec in specs.items()}


def _specs_of(dataset: dict[str, Any]) -> dict[str, FieldSpec]:
    """The per-box number fields of a shard folder (``dataset.json``'s ``"fields"``; none in a
    folder written before shards kept them); instance masks are not among them
    (``dataset.json``'s ``"masks": true``, :func:`mask_segmentations`)."""
    return {str(name): FieldSpec(np.dtype(dtype), tuple(int(k) for k in shape))
            for name, dtype, shape in dataset.get("fields", [])}


def mask_segmentations(value: Any, n: int, where: str) -> list[Any]:
    """A sample's instance masks as a shard's ``<key>.json`` holds them (``"masks"``): one COCO
    ``segmentation`` per box, as the source gives it (:class:`~detaug.masks.CocoMasks`: its
    polygons or RLE) or, for uint8 ``[N, H, W]`` arrays, each mask's compressed RLE
    (``{"size": [h, w], "counts": "..."}``, pycocotools: decoded to the same pixels).
    ``DatasetError`` naming ``where`` for masks that are not one well-formed row per box."""
    from detaug.masks import CocoMasks, check_masks, segmentation_problem

    if isinstance(value, CocoMasks):
        segs = list(value.segmentations)
    elif value is None or np.size(value) == 0:
        segs = []
    else:
        dense, why = check_masks(value, n)
        if dense is None:
            raise DatasetError(f"{where}: {why}")
        from pycocotools import mask as coco_mask

        segs = []
        for m in dense:
            rle = coco_mask.encode(np.asfortranarray(m))
            segs.append({"size": [int(x) for x in rle["size"]], "counts": rle["counts"].decode("ascii")})
    if len(segs) != n:
        raise DatasetError(f"{where}: {len(segs)} masks, {n} boxes (one mask per box)")
    for k, seg in enumerate(segs):
        why = segmentation_problem(seg)
        if why:
            raise DatasetError(f"{where}: box {k}: {why}")
    return segs


def save_manifest(out: Path, table: SampleTable, offsets: np.ndarray, lengths: np.ndarray, exts: np.ndarray,
                  dataset: dict[str, Any], fields: dict[str, np.ndarray] | None = None,
                  masks: list[Any] | None = None) -> None:
    """Write ``dataset.json`` and ``manifest/`` (the columns, with the labels present and the
    largest box count, so that no loader scans every sample at start-up); ``fields``: the
    per-box fields' columns, in the order of ``dataset["fields"]``; ``masks``: every box's
    ``segmentation`` (:func:`mask_segmentations`), kept as the number columns of
    :class:`~detaug.formats.mask_columns.MaskColumns` (no pickle)."""
    from detaug.formats.mask_columns import MaskColumns

    labels = np.unique(np.asarray(table.labels)).astype(np.int64)
    most = table.max_boxes()
    meta = {"version": MANIFEST_VERSION, "samples": len(table), "present_labels": labels.tolist(), "max_boxes": most,
            "shards": [s["tar"] for s in dataset["shards"]],
            "shard_samples": [int(s["samples"]) for s in dataset["shards"]]}
    columns = {f"field_{k}": values for k, values in enumerate((fields or {}).values())}
    if masks is not None:
        try:
            columns.update(MaskColumns.from_segmentations(masks).arrays())
        except ValueError as err:
            raise DatasetError(f"{out}: {err}: shards cannot hold it") from None
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
    records_masks: list[tuple[Any, int, str]] = []
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
                where = f"{out / shard['tar']}: {entry['json'][2] or entry}"
                records_masks.append((record.get("masks"), len(b), where))
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
    if "masks" not in dataset:  # no dataset.json: masks where every record has them
        dataset["masks"] = bool(records_masks) and all(m is not None for m, _, _ in records_masks)
    masks = None
    if dataset["masks"]:
        masks = []
        for value, n, where in records_masks:
            if not isinstance(value, list):
                raise DatasetError(f"{where}: no \"masks\" list (dataset.json says the samples have masks)")
            masks.extend(mask_segmentations(_coco_masks(value), n, where))
    dataset.update(key_width=width, extensions=ext_names, samples=len(table), boxes=int(table.box_starts[-1]))
    save_manifest(out, table, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64), np.asarray(exts, np.uint8),
                  dataset, columns, masks)


def _coco_masks(segmentations: list[Any]) -> Any:
    from detaug.masks import CocoMasks

    return CocoMasks(segmentations)


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


def _check_names(names: Sequence[str], file: Path, allow_paths_outside: bool) -> None:
    """A :class:`DatasetError` naming ``file`` and the path when one of the file ``names`` it
    gives is absolute or leaves the shard folder (:func:`detaug.formats.paths.path_problem`)."""
    if allow_paths_outside:
        return
    for name in names:
        why = path_problem(name)
        if why is not None:
            raise DatasetError(f"{file}: {PATH_OUTSIDE}: {name[:200]!r} {why} "
                               "(allow_paths_outside=True accepts it)")
