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
(:class:`AtomicOutput`, :func:`write_bytes_atomic`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import pickle
import re
import secrets
import signal
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
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


def write_bytes_atomic(data: bytes, path: str | PathLike) -> Path:
    """Write ``data`` to ``path`` atomically and return the path.

    The bytes go to a temporary file beside ``path`` (:func:`temp_path`:
    ``.<name>.tmp-<pid>-<hex>``), are flushed to disk, and the file then replaces ``path`` in one
    ``os.replace``: a reader (or a crash) sees either the old file or the complete new one,
    never half a file (:class:`AtomicOutput`, which also writes a document as it is made).

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
    output = AtomicOutput(path)
    with signals_abort_writes(output.path):
        try:
            stale = output.open()
            if stale:
                warnings.warn(f"removed {len(stale)} temporary file(s) left by killed writes of "
                              f"{output.path}: {', '.join(p.name for p in stale)}",
                              RuntimeWarning, stacklevel=2)
            output.write(data)
            output.commit()
        except BaseException:
            output.discard()
            raise
    return output.path


class AtomicOutput:
    """One output file written through a temporary file beside it and renamed into place by
    :meth:`commit` (see :func:`write_bytes_atomic` for the guarantees).

    ``open()`` creates the folder and the temporary file (``0o600``), ``write()`` appends bytes
    (buffered), ``commit()`` flushes, ``fsync``s, sets the mode (that of the file replaced, else
    ``0o644``) and renames; ``discard()`` removes the temporary file (safe to call at any time,
    and after ``commit()`` it does nothing). Every ``OSError`` names ``path``
    (``err.filename == str(path)``). Signals are the caller's business
    (:func:`signals_abort_writes`).
    """

    BUFFER = 1 << 20

    def __init__(self, path: str | PathLike) -> None:
        self.path = Path(path)
        self._tmp: Path | None = None
        self._handle: Any = None

    def open(self) -> list[Path]:
        """Create the temporary file; returns the stale temporary files it removed."""
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            stale = remove_stale_temp_files(path)
        except FileExistsError as err:  # a file where a folder of the path should be
            raise NotADirectoryError(errno.ENOTDIR, f"Not a directory ({err.filename} is a file)",
                                     str(path)) from err
        except OSError as err:
            raise _naming(err, path, "creating its folder") from err
        tmp = temp_path(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                         0o600)
        except OSError as err:
            raise _naming(err, path) from err
        self._tmp = tmp
        self._handle = os.fdopen(fd, "wb", buffering=self.BUFFER)
        return stale

    def write(self, data: bytes) -> None:
        try:
            self._handle.write(data)
        except OSError as err:
            raise _naming(err, self.path) from err

    def error(self, err: OSError, doing: str | None = None) -> OSError:
        """``err`` as an ``OSError`` of the same kind naming this output (and what was done)."""
        return _naming(err, self.path, doing)

    def commit(self) -> Path:
        """Flush, ``fsync`` and rename the temporary file to ``path``."""
        assert self._tmp is not None and self._handle is not None, "open() first"
        try:
            handle, self._handle = self._handle, None
            with handle:
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(self._tmp, _mode_for(self.path))
            os.replace(self._tmp, self.path)
        except OSError as err:
            raise _naming(err, self.path) from err
        self._tmp = None
        return self.path

    def discard(self) -> None:
        """Close and remove the temporary file (errors closing it are ignored)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None


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
def signals_abort_writes(path: Path) -> Iterator[None]:
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
