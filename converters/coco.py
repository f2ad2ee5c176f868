"""COCO detection JSON: the top level, deterministic serialisation, atomic writes.

The document always has ``info``, ``licenses``, ``images``, ``annotations`` and ``categories``, in
that order. Ids are integers from 1. Annotations carry ``bbox`` (``[x, y, w, h]``, continuous
pixel coordinates, pixel ``i`` spans ``[i, i + 1)``), ``area`` (``w * h``) and ``iscrowd``, which
COCOeval reads.

Serialisation is ``json`` with compact separators, UTF-8 (non-ASCII characters as they are)
and a final newline. The converter does not build a dict per box: the worker processes write
each record's JSON text (see :mod:`converters.convert_file`) and :func:`coco_json_from_parts`
joins them; the tests check that the result is byte for byte :func:`dumps_coco` of its dict.
"""

from __future__ import annotations

import functools
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


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_json(value: Any) -> str:
    """``value`` as compact JSON text (the one encoder of this module; NaN is refused)."""
    return _ENCODER.encode(value)


def json_tail(record: dict[str, Any]) -> str:
    """JSON of a non-empty dict without its opening brace.

    ``'{"id":%d,' % n + json_tail(rest)`` is the JSON of ``{"id": n, **rest}``: ids can be
    given after the rest was encoded elsewhere.
    """
    if not record:
        raise ValueError("json_tail needs a non-empty dict")
    return _ENCODER.encode(record)[1:]


def coco_json_from_parts(image_parts: list[str], annotation_parts: list[str],
                         categories: list[dict[str, Any]]) -> bytes:
    """The document whose ``images`` and ``annotations`` are the given JSON texts, in order
    (a text may hold several records joined by commas; none may be empty).

    Equal to ``dumps_coco(make_coco(images, annotations, categories))`` for the dicts that the
    parts encode (tested).
    """
    head = make_coco([], [], categories)
    return "".join([
        '{"info":', encode_json(head["info"]), ',"licenses":', encode_json(head["licenses"]),
        ',"images":[', ",".join(image_parts), '],"annotations":[', ",".join(annotation_parts),
        '],"categories":', encode_json(head["categories"]), "}\n"]).encode("utf-8")


def dumps_coco(coco: dict[str, Any]) -> bytes:
    """Serialise deterministically: key order as built, compact separators, UTF-8, final newline."""
    return (encode_json(coco) + "\n").encode("utf-8")


def write_coco_json(coco: dict[str, Any], path: str | PathLike) -> Path:
    """Write ``coco`` to ``path`` atomically and return the path.

    Same dict, same bytes (see :func:`dumps_coco`); atomic as :func:`write_bytes_atomic`.
    """
    return write_bytes_atomic(dumps_coco(coco), path)  # encoded first: a bad value writes nothing


def write_bytes_atomic(data: bytes, path: str | PathLike) -> Path:
    """Write ``data`` to ``path`` atomically and return the path.

    The bytes go to a temporary file in the same folder, are flushed to disk, and the file then
    replaces ``path`` in one ``os.replace``: a reader (or a crash, or Ctrl-C) sees either the
    old file or the complete new one, never half a file. On any error the temporary file is
    removed and the error re-raised. Missing parent folders are created.
    """
    path = Path(path)
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


@functools.lru_cache(maxsize=1)
def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("detaug")
    except PackageNotFoundError:
        return "unknown"
