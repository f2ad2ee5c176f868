"""The top-level arrays of a JSON file read a chunk at a time (the streaming parser's reader): a
file in the plain form the fast path takes is cut into chunks of whole array items, each parsed
with ``orjson`` where installed, else ``json``; anything else raises :class:`_Irregular` (the
caller then parses the file with :func:`detaug.formats.coco.load_coco`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

try:  # orjson parses 2-3x faster than json; optional
    import orjson as _orjson

    _loads: Callable[[bytes], Any] = _orjson.loads
    _LOAD_ERRORS: tuple[type[BaseException], ...] = (_orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _LOAD_ERRORS = (ValueError,)


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
