"""Atomic writes of output files: the bytes go to a temporary file beside the output, are
flushed to disk and renamed into place (:class:`AtomicOutput`, :func:`write_bytes_atomic`); a
reader or a crash sees the old file or the complete new one. SIGINT and SIGTERM during a write
remove the temporary file first (:func:`signals_abort_writes`); the temporary files of killed
writes are removed by the next write (:func:`remove_stale_temp_files`). Every ``OSError`` names
the output.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import threading
import warnings
from collections.abc import Iterator
from os import PathLike
from pathlib import Path
from typing import Any

__all__ = [
    "AtomicOutput", "remove_stale_temp_files", "signals_abort_writes", "temp_path", "write_bytes_atomic",
]

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

