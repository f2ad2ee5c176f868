"""Paths a dataset names: how file names are compared (:func:`file_key`) and whether a path
stays inside the folder it is relative to (:func:`path_problem`, :func:`outside_paths`;
docs/security.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = [
    "file_key",
    "outside_paths",
    "path_problem",
]


def file_key(name: str) -> str:
    """How file names are compared for duplicates."""
    return os.path.normpath(name)


def path_problem(name: str) -> str | None:
    """Why the relative path ``name`` that a dataset file gives would leave the folder it is
    relative to, or ``None`` when it stays inside. The rule is lexical, on the path as written:
    absolute paths, paths that climb above the folder with ``..`` (after ``os.path.normpath``:
    ``a/../../x``, ``./../x``) and paths holding a NUL byte are refused. Symbolic links inside
    the folder are followed wherever they point (docs/security.md). A backslash is an ordinary
    character of a POSIX file name (``..\\x`` names a file inside the folder)."""
    if "\0" in name:
        return "holds a NUL byte"
    if os.path.isabs(name):
        return "is an absolute path"
    if ".." in name:
        norm = os.path.normpath(name)
        if norm == ".." or norm.startswith(".." + os.sep):
            return "leaves its folder (..)"
    return None


def outside_paths(names: Sequence[str]) -> list[int]:
    """The positions of the ``names`` that :func:`path_problem` refuses: one search of the
    joined names first (a million names in about 0.05 s); only names with ``..``, a leading
    ``/`` or a NUL byte are looked at closer."""
    joined = "\n".join(names)
    if ".." not in joined and "\0" not in joined and "\n/" not in joined and not joined.startswith("/"):
        return []
    return [i for i, n in enumerate(names)
            if (n[:1] == "/" or ".." in n or "\0" in n) and path_problem(n) is not None]
