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

import contextlib
import errno
import functools
import json
import os
import re
import secrets
import signal
import threading
import warnings
from collections.abc import Iterator, Sequence
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

    The bytes go to a temporary file beside ``path`` (:func:`temp_path`:
    ``.<name>.tmp-<pid>-<hex>``), are flushed to disk, and the file then replaces ``path`` in one ``os.replace``: a reader
    (or a crash) sees either the old file or the complete new one, never half a file.

    * Any error, Ctrl-C included, removes the temporary file and is re-raised. SIGINT and
      SIGTERM are caught during the write only (in the main thread; the previous handlers are
      restored after): the temporary file is removed, then the signal is raised again with the
      previous handler, so the process ends as it would have (SIGINT: ``KeyboardInterrupt``;
      SIGTERM by default: killed by SIGTERM, status 143 in a shell).
    * A process killed outright (SIGKILL, power loss) leaves its temporary file; the next
      write to the same path removes such files whose process is no longer running
      (:func:`remove_stale_temp_files`; a warning names them).
    * An ``OSError`` (disk full, permission, a folder where the file should be) is re-raised
      as the same kind of ``OSError`` whose ``filename`` is ``path`` and whose ``strerror``
      says what failed.

    Missing parent folders are created.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = remove_stale_temp_files(path)
    except FileExistsError as err:  # a file where a folder of the path should be
        raise NotADirectoryError(errno.ENOTDIR, f"Not a directory ({err.filename} is a file)",
                                 str(path)) from err
    except OSError as err:
        raise _naming(err, path, "creating its folder") from err
    if stale:
        warnings.warn(f"removed {len(stale)} temporary file(s) left by killed writes of {path}: "
                      f"{', '.join(p.name for p in stale)}", RuntimeWarning, stacklevel=2)
    tmp = temp_path(path)
    with _signals_abort_write(path):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                         0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, _mode_for(path))
            os.replace(tmp, path)
        except BaseException as err:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(err, OSError):
                raise _naming(err, path) from err
            raise
    return path


_TEMP_INFIX = ".tmp-"


def temp_path(path: Path) -> Path:
    """A new temporary file name for ``path``: ``.<name>.tmp-<pid>-<8 hex digits>`` beside it."""
    return path.with_name(f".{path.name}{_TEMP_INFIX}{os.getpid()}-{secrets.token_hex(4)}")


def remove_stale_temp_files(path: str | PathLike) -> list[Path]:
    """Remove the temporary files of writes to ``path`` (:func:`temp_path`'s pattern) whose
    process is not running any more, and return them. Files of running processes (this one
    included) are left alone; a process id reused since by another process keeps its file
    (harmless: the file is removed once that process is gone). Process ids are those of this
    machine: do not share one output folder between machines or pid namespaces."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}{_TEMP_INFIX}") + r"(\d+)-[0-9a-f]{8}\Z")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet (the write will say)
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match and not _process_alive(int(match[1])):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:  # removed by another writer meanwhile
                continue
            removed.append(Path(entry.path))
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # running under another user (or not a pid at all: leave the file)
    return True


def _naming(err: OSError, path: Path, doing: str | None = None) -> OSError:
    """An ``OSError`` of the same errno (so the same subclass: ``PermissionError``, ...) whose
    ``filename`` is ``path``. ``err.filename`` may be the temporary file, a parent folder, or
    ``None`` (a full disk): another file than ``path`` is named in ``strerror``."""
    reason = err.strerror or str(err) or type(err).__name__
    other = err.filename
    if other is not None and (str(other) == str(path)
                              or Path(str(other)).name.startswith(f".{path.name}{_TEMP_INFIX}")):
        other = None
    context = ", ".join(x for x in (doing, str(other) if other is not None else None) if x)
    return OSError(err.errno, f"{reason} ({context})" if context else reason, str(path))


class _Signalled(BaseException):
    """SIGINT or SIGTERM arrived during a write (raised by the temporary handler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_abort_write(path: Path) -> Iterator[None]:
    """While writing, SIGINT and SIGTERM raise :class:`_Signalled` (so that the temporary file
    is removed), then are raised again with the handlers they had. Only in the main thread
    (elsewhere Python cannot set handlers; SIGINT still raises KeyboardInterrupt there) and
    only for signals not ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    arrived: list[int] = []

    def abort(signum: int, frame: Any) -> None:
        if not arrived:  # a second signal must not interrupt the clean-up of the first
            arrived.append(signum)
            raise _Signalled(signum)

    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if handler is None or handler == signal.SIG_IGN:
                continue  # ignored, or set from C: leave it alone
            previous[signum] = handler
            signal.signal(signum, abort)
    except ValueError:  # not allowed here (a subinterpreter): write without
        _restore(previous)
        previous.clear()
    try:
        yield
    except _Signalled as got:
        _restore(previous)
        signal.raise_signal(got.signum)  # the previous handler: dies, or raises KeyboardInterrupt
        name = signal.Signals(got.signum).name
        raise InterruptedError(errno.EINTR, f"write interrupted by {name}", str(path)) from None
    finally:
        _restore(previous)


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _mode_for(path: Path) -> int:
    """Keep the mode of the file being replaced; a new file gets ``0o644`` (the temporary file
    is created ``0o600``)."""
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
