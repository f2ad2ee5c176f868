"""Which pickles refer to ``__main__``: what a worker spawned without the main script could not load
(:func:`references_main`, :func:`main_references`; see :mod:`detaug.workers`)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import pickletools
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["main_references", "references_main"]


def references_main(data: bytes) -> bool:
    """Whether the pickle ``data`` refers to a global (function, class, ...) of ``__main__``,
    which a worker can load only by importing the main script. Strings that merely read
    ``"__main__"`` are data, not references; bytes that are themselves a pickle (a payload
    pickled ahead) are looked into. Conservative: ``True`` for a pickle it cannot read."""
    return bool(main_references(data))


def main_references(data: bytes, limit: int = 5) -> list[str]:
    """The names of ``__main__``'s globals that the pickle ``data`` refers to (at most ``limit``;
    ``["?"]`` for a pickle it cannot read); see :func:`references_main`."""
    if b"__main__" not in data:  # a reference spells the module name out at least once
        return []
    mark = pickletools.markobject
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    found: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in ("GLOBAL", "INST") and str(arg).split(" ", 1)[0] == "__main__":
                found.append(str(arg).split(" ", 1)[1])
            elif name == "STACK_GLOBAL" and len(stack) >= 2 and stack[-2] == "__main__":
                found.append(str(stack[-1]))
            elif isinstance(arg, (bytes, bytearray)) and arg[:1] == b"\x80" and b"__main__" in arg:
                found += main_references(bytes(arg), limit)  # a pickle inside the pickle
            elif isinstance(arg, str) and arg[:1] == "\x80" and "__main__" in arg:  # ... as protocols < 3 store bytes
                found += main_references(arg.encode("latin-1", "replace"), limit)
            if len(found) >= limit:
                return found[:limit]
            if name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
                continue
            if name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = stack[-1]
                continue
            # The stack effect, as pickletools.dis simulates it.
            before, after = op.stack_before, op.stack_after
            if mark in before or (name == "POP" and stack and stack[-1] is mark):
                while stack[-1] is not mark:
                    stack.pop()
                stack.pop()
                numtopop = before.index(mark) if mark in before else 0
            else:
                numtopop = len(before)
            if numtopop:
                del stack[-numtopop:]
            if name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(int(arg)))
            elif isinstance(arg, str) and after == [pickletools.pyunicode]:
                stack.append(arg)
            else:
                stack.extend(mark if item is mark else None for item in after)
    except Exception:  # noqa: BLE001 - unreadable: assume the worst
        return found or ["?"]
    return found


def _main_is_importable() -> bool:
    """Whether a spawned child can import the main module: a script file or a ``-m`` module;
    not ``python -c``, standard input (``__file__`` is ``"<stdin>"``) or an interactive session."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return False
    return os.path.isfile(os.path.join(multiprocessing.process.ORIGINAL_DIR or "", path))


def _job_references_main(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether a job's function or arguments refer to ``__main__`` (``False`` when they cannot
    be pickled here: the executor reports that itself)."""
    if getattr(fn, "__module__", None) == "__main__":
        return True
    try:
        data = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - e.g. objects only multiprocessing's pickler handles
        return False
    return references_main(data)
