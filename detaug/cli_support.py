"""What every detaug command line shares: the one-line argument parser, argument types, the
VOC options, the guarded run that turns an error into one line and an exit status, and the ``detaug`` log on stderr.

``detaug`` (:mod:`detaug.cli`) and ``detaug bench`` (:mod:`detaug.bench.runner`) use them; a user
error is ``PROG: error: MESSAGE`` and exit status 2, anything else one line with status 1 (the
traceback with ``--debug``), Ctrl-C 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable

__all__ = ["CliError", "OneLineParser", "add_voc_options", "error_line", "log_to_stderr", "positive_int", "run_guarded"]


class CliError(Exception):
    """A user error of the command line; its message is the whole error line (exit status 2)."""


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``PROG: error: MESSAGE (see --help)``,
    exit status 2) instead of the usage block and the message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """``argparse`` type: an integer >= ``minimum``."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return convert


#: ``argparse`` type: an integer >= 1.
positive_int = int_at_least(1)


def add_voc_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--split NAME`` and ``--labels voc|discover|FILE`` (default ``discover``), the options
    of a Pascal VOC dataset that ``detaug preview`` and ``detaug shards`` read
    (:func:`detaug.source_args.source_from_args`)."""
    parser.add_argument("--split", help="VOC split (ImageSets/Main/<split>.txt); default: every XML")
    parser.add_argument("--labels", default="discover", help="VOC labels: voc, discover or a labels file")


def error_line(err: BaseException) -> tuple[int, str]:
    """``(exit status, one line)`` for an exception ending a command: 2 for the user's errors
    (missing or unreadable files, bad values, datasets that cannot be read, no GPU), 1 for
    anything else. A message of several lines keeps its first, which names the file at fault."""
    from detaug.errors import DeviceError

    if isinstance(err, OSError) and not isinstance(err, (ConnectionError, TimeoutError)):
        where = f"{err.filename}: " if err.filename is not None else ""
        text, status = f"{where}{err.strerror or err}", 2
    elif isinstance(err, (CliError, ValueError, DeviceError)):
        text, status = str(err), 2
    else:
        text, status = f"{type(err).__name__}: {err}", 1
    lines = [line for line in text.splitlines() if line.strip()] or [type(err).__name__]
    line = lines[0].strip()
    if len(lines) > 1:
        line += f" (and {len(lines) - 1} more lines: --debug shows them)"
    if status != 2:
        line += " (--debug shows the traceback)"
    return status, line


def run_guarded(name: str, run: Callable[[], int], debug: bool) -> int:
    """Run a command; its errors become one line (:func:`error_line`) and an exit status, its
    warnings (a skipped image, a repaired box) one line each, ``NAME: warning: MESSAGE``
    (Python's file and source line with ``--debug``)."""
    import warnings

    formatwarning = warnings.formatwarning
    if not debug:
        warnings.formatwarning = lambda message, category, *args, **kwargs: f"{name}: warning: {message}\n"
    try:
        return run()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - every error ends as one line (and a traceback with --debug)
        if debug:
            traceback.print_exc()
        status, line = error_line(err)
        print(f"{name}: error: {line}", file=sys.stderr)
        return status
    finally:
        warnings.formatwarning = formatwarning


class _StderrLines(logging.Handler):
    """Log records as lines on the ``sys.stderr`` of the moment (a redirected or captured stream
    included, as :data:`logging.lastResort`)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging's own rule: a failing handler reports, never raises
            self.handleError(record)


def log_to_stderr() -> None:
    """Show the ``detaug`` log (INFO and up: what detaug decided, e.g. ``device='auto'``) on stderr
    as ``detaug: MESSAGE`` lines, for a command line; the library itself adds only a
    ``NullHandler``. Once per process: a second call adds nothing."""
    log = logging.getLogger("detaug")
    if any(isinstance(h, _StderrLines) for h in log.handlers):
        return
    handler = _StderrLines()
    handler.setFormatter(logging.Formatter("detaug: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # one line, not a second one from a root handler
