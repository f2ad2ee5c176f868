"""COCO detection dicts: building the top level and writing it to disk atomically.

The dict always has ``info``, ``licenses``, ``images``, ``annotations`` and ``categories``, in that
order. Ids are integers from 1. Annotations carry ``bbox`` (``[x, y, w, h]``, continuous pixel
coordinates, pixel ``i`` spans ``[i, i + 1)``), ``area`` (``w * h``) and ``iscrowd``, which
COCOeval reads.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

INFO_DESCRIPTION = "Converted from Pascal VOC by detaug voc2coco"


def make_categories(names: Sequence[str]) -> list[dict[str, Any]]:
    """COCO categories with ids ``1..len(names)`` in the given order."""
    return [{"id": i, "name": name, "supercategory": "none"} for i, name in enumerate(names, 1)]


def make_coco(images: list[dict[str, Any]], annotations: list[dict[str, Any]],
              categories: list[dict[str, Any]]) -> dict[str, Any]:
    """The top-level COCO dict. ``info`` has no date, so that the output is deterministic."""
    return {
        "info": {"description": INFO_DESCRIPTION, "version": _package_version()},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }


def dumps_coco(coco: dict[str, Any]) -> bytes:
    """Serialise deterministically: key order as built, compact separators, UTF-8, final newline."""
    return (json.dumps(coco, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            + "\n").encode("utf-8")


def write_coco_json(coco: dict[str, Any], path: str | PathLike) -> Path:
    """Write ``coco`` to ``path`` atomically and return the path.

    The bytes go to a temporary file in the same folder, are flushed to disk, and the file then
    replaces ``path`` in one ``os.replace``: a reader (or a crash, or Ctrl-C) sees either the
    old file or the complete new one, never half a file. On any error the temporary file is
    removed and the error re-raised. Same dict, same bytes (see :func:`dumps_coco`).
    """
    path = Path(path)
    data = dumps_coco(coco)  # serialise first: a bad value fails before anything is written
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, _mode_for(path))
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return path


def _mode_for(path: Path) -> int:
    """Keep the mode of the file being replaced; a new file gets ``0o644`` (mkstemp makes 0o600)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o644


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("detaug")
    except PackageNotFoundError:
        return "unknown"
