"""COCO detection JSON: the top level, deterministic serialisation, atomic writes.

The document always has ``info``, ``licenses``, ``images``, ``annotations`` and ``categories``, in
that order. Ids are integers from 1. Annotations carry ``bbox`` (``[x, y, w, h]``, continuous
pixel coordinates, pixel ``i`` spans ``[i, i + 1)``), ``area`` (``w * h``) and ``iscrowd``, which
COCOeval reads.

Serialisation is ``json`` with compact separators, UTF-8 (non-ASCII characters as they are)
and a final newline. The converter does not build a dict per box: the worker processes write
each record's JSON text (see :mod:`converters.convert_file`) and :class:`CocoStreamWriter`
writes them as they come (:func:`coco_json_from_parts` joins them in one go); the tests check
that the result is byte for byte :func:`dumps_coco` of its dict. Outputs are written atomically
(:class:`AtomicOutput`, :func:`write_bytes_atomic`) by :mod:`converters.atomic_output`, whose
public names are importable from here too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pickle
import tempfile
from collections.abc import Callable, Iterator, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from converters.atomic_output import (  # noqa: F401 - importable from here
    AtomicOutput,
    remove_stale_temp_files,
    signals_abort_writes,
    temp_path,
    write_bytes_atomic,
)

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


class CocoStreamWriter:
    """Writes one COCO document as its records come, in bounded memory; the bytes are those of
    :func:`coco_json_from_parts` (so of :func:`dumps_coco`) for the same records.

    ``write`` receives the document in pieces (UTF-8 bytes, a few hundred KB each). Images are
    written as they are added. Annotations come after every image in the document and their
    category ids may be known only at the end (labels discovered from the data), so they wait
    in a *spool*: a list in memory (``spool_dir=None``) or an anonymous temporary file in
    ``spool_dir`` (no name in the folder; the system removes it with the process, even a
    killed one), then :meth:`finish` writes them with their category ids, and the categories.

    The annotation texts are :data:`converters.convert_file.PendingAnnotations` templates:
    ``template % (id, image_id, category_id, ...)`` (three ids per annotation).
    """

    FLUSH = 1 << 18

    def __init__(self, write: Callable[[bytes], None], spool_dir: str | PathLike | None = None,
                 spool_error: Callable[[OSError], OSError] | None = None) -> None:
        self._write = write
        self._pieces: list[str] = []
        self._size = 0
        self._spool = _Spool(spool_dir, spool_error)
        self.images = 0
        self.annotations = 0
        head = make_coco([], [], [])
        self._emit('{"info":' + encode_json(head["info"]) + ',"licenses":'
                   + encode_json(head["licenses"]) + ',"images":[')

    def add_image(self, image_tail: str) -> int:
        """Write the image whose JSON after ``{"id":N,`` is ``image_tail``; returns its id
        (1, 2, ...)."""
        self.images += 1
        self._emit(f'{{"id":{self.images},{image_tail}' if self.images == 1
                   else f',{{"id":{self.images},{image_tail}')
        return self.images

    def add_annotations(self, image_id: int, names: tuple[str, ...], template: str) -> None:
        """Keep the annotations of image ``image_id`` (category ``names``, in order) for
        :meth:`finish`; their ids follow the previous ones."""
        if names:
            self._spool.add((image_id, self.annotations + 1, names, template))
            self.annotations += len(names)

    def finish(self, categories: Sequence[str]) -> None:
        """Write the annotations, with category ids ``1..len(categories)`` in that order, the
        categories and the end of the document. ``KeyError`` for a name not in ``categories``."""
        category_ids = {name: i for i, name in enumerate(categories, 1)}
        self._emit('],"annotations":[')
        first = True
        for image_id, first_id, names, template in self._spool.replay():
            ids: list[int] = []
            for k, name in enumerate(names):
                ids += (first_id + k, image_id, category_ids[name])
            self._emit(template % tuple(ids) if first else "," + template % tuple(ids))
            first = False
        self._emit('],"categories":' + encode_json(make_categories(categories)) + "}\n")
        self._flush()
        self._spool.close()

    def close(self) -> None:
        """Drop the spool (after an error; :meth:`finish` does it otherwise)."""
        self._spool.close()

    def _emit(self, text: str) -> None:
        self._pieces.append(text)
        self._size += len(text)
        if self._size >= self.FLUSH:
            self._flush()

    def _flush(self) -> None:
        if self._pieces:
            self._write("".join(self._pieces).encode("utf-8"))
            self._pieces, self._size = [], 0


class _Spool:
    """Records kept in order for a second pass: a list, or pickled batches in an anonymous
    temporary file of ``folder``."""

    BATCH = 2048

    def __init__(self, folder: str | PathLike | None,
                 error: Callable[[OSError], OSError] | None) -> None:
        self._folder = folder
        self._error = error or (lambda err: err)
        self._items: list[Any] = []
        self._file: Any = None

    def add(self, item: Any) -> None:
        self._items.append(item)
        if self._folder is not None and len(self._items) >= self.BATCH:
            self._dump()

    def replay(self) -> Iterator[Any]:
        if self._file is None:
            yield from self._items
            return
        self._dump()
        try:
            self._file.seek(0)
            while True:
                try:
                    batch = pickle.load(self._file)
                except EOFError:
                    return
                yield from batch
        except OSError as err:
            raise self._error(err) from err

    def _dump(self) -> None:
        try:
            if self._file is None:
                self._file = tempfile.TemporaryFile(dir=self._folder, prefix=".voc2coco-spool-")
            pickle.dump(self._items, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as err:
            raise self._error(err) from err
        self._items = []

    def close(self) -> None:
        self._items = []
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def dumps_coco(coco: dict[str, Any]) -> bytes:
    """Serialise deterministically: key order as built, compact separators, UTF-8, final newline."""
    return (encode_json(coco) + "\n").encode("utf-8")


def write_coco_json(coco: dict[str, Any], path: str | PathLike) -> Path:
    """Write ``coco`` to ``path`` atomically and return the path.

    Same dict, same bytes (see :func:`dumps_coco`); atomic as :func:`write_bytes_atomic`.
    """
    return write_bytes_atomic(dumps_coco(coco), path)  # encoded first: a bad value writes nothing


@functools.lru_cache(maxsize=1)
def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("detaug")
    except PackageNotFoundError:
        return "unknown"
