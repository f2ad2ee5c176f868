"""The cache of a COCO file's columns (:func:`load_coco_columns`): where it lives
(:func:`cache_folder`), built once under a lock in bounded memory, opened memory-mapped when
:mod:`detaug.formats.cache_trust` says it is this very file's, renewed or rebuilt otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from detaug.errors import DatasetError, DataWarning
from detaug.formats.cache_trust import (
    CACHE_VERSION, _TRUSTED_KEYS, _arrays_hash, _file_hash, _file_key, _files_key, _secret, _signed_by_us, _stamp,
)
from detaug.formats.coco_columns import CocoColumns
from detaug.formats.column_store import _META_BYTES, _read_regular, _write_folder, load_columns
from detaug.formats.paths import outside_paths
from detaug.formats.report import Report, _caller_level
from detaug.formats.validation import check_columns
from detaug.keypoints import check_keypoints


def cache_folder(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, *, masks: bool = False) -> Path:
    """Where the cache of the COCO file ``path`` lives: ``<file>.detaug-cache/`` next to it, or
    ``cache_dir/<name>-<hash of the absolute path>/`` (also ``$DETAUG_CACHE_DIR``). With
    ``masks`` (the file read with its segmentations, which a file without them fails):
    ``<file>.detaug-cache-masks/``, or ``cache_dir/<name>-masks-<hash>/``."""
    path = Path(path)
    cache_dir = cache_dir if cache_dir is not None else os.environ.get("DETAUG_CACHE_DIR")
    if cache_dir is None:
        return path.with_name(path.name + (".detaug-cache-masks" if masks else ".detaug-cache"))
    tag = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{path.name}-{'masks-' if masks else ''}{tag}"


def load_coco_columns(path: str | os.PathLike, *, cache: bool = True, cache_dir: str | os.PathLike | None = None,
                      name: str | None = None, allow_paths_outside: bool = False, masks: bool = False) -> CocoColumns:
    """The columns of a COCO file: from its cache when the cache provably belongs to this very
    file (the rule above :func:`_file_key`: same size, mtime, ctime, device and inode as at
    build, or the same SHA-256 recorded under this user's MAC; same :data:`CACHE_VERSION`),
    else parsed (:func:`parse_coco_columns`) and, with ``cache``, cached (a cache that is not
    this file's is rebuilt with a :class:`DataWarning` saying why; a folder that cannot be
    written is said with one and the columns are used anyway). Repairs are warned of
    (:meth:`~detaug.formats.report.Report.finish`) each time, as ``load_coco`` does.
    ``allow_paths_outside``: as :func:`~detaug.formats.coco.load_coco`'s (a cache built with it
    is refused without it, naming the paths). ``masks``: also read and cache each box's
    ``segmentation``, not decoded (``CocoColumns.segments``; as ``load_coco(..., masks=True)``,
    in memory: the streaming parser reads no segmentations; a cache of its own,
    :func:`cache_folder`). A keypoints file's keypoints are always read and cached
    (``CocoColumns.keypoints``; by ``load_coco``, in memory)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: COCO annotations file not found")
    folder = cache_folder(path, cache_dir, masks=masks)
    if not cache:
        return _parsed(path, name, allow_paths_outside, masks)
    columns = _open_cache(path, folder, masks)
    if columns is None:
        with _build_lock(folder):  # one build per file and node: the other ranks wait, then open it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)  # said by the first look
                columns = _open_cache(path, folder, masks)
            if columns is None:
                try:
                    columns = _build_cache(path, folder, name, allow_paths_outside, masks)
                except OSError as err:
                    _warn(f"{folder}: cannot write the annotation cache ({err}); parsed without it")
                    columns = _parsed(path, name, allow_paths_outside, masks, warn=False)
                _warn_repairs(columns.report)
                return columns
    if getattr(columns, "outside", 0) and not allow_paths_outside:
        from detaug.formats.coco import load_coco

        load_coco(path, name=name)  # raises, naming every file_name outside the images folder
    _warn_repairs(columns.report)
    return columns


def _warn(text: str) -> None:
    """A :class:`DataWarning` pointing at the user's call (the first frame outside detaug)."""
    warnings.warn(text, DataWarning, stacklevel=_caller_level())


def _parsed(path: Path, name: str | None, allow_paths_outside: bool, masks: bool, *,
            warn: bool = True) -> CocoColumns:
    """:func:`~detaug.formats.coco_stream.parse_coco_columns` (with ``masks``: ``load_coco(..., masks=True)``), its repairs
    said once (with ``warn``)."""
    from detaug.formats.coco_stream import _by_load_coco, parse_coco_columns  # the parsers: not needed to open a cache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # said below, once
        columns = (_by_load_coco(path, name, allow_paths_outside, masks=True) if masks else
                   parse_coco_columns(path, name=name, allow_paths_outside=allow_paths_outside))
    columns.report.source = columns.source
    if warn:
        _warn_repairs(columns.report)
    return columns


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``<cache folder>.lock`` (beside the cache; left in place) while
    the cache is built, so that the ranks of one node build it once; no lock where the file
    cannot be made (the cache cannot be written there either)."""
    try:
        import fcntl

        folder.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder.with_name(folder.name + ".lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _build_cache(path: Path, folder: Path, name: str | None, allow_paths_outside: bool, masks: bool) -> CocoColumns:
    """Parse ``path`` into its cache folder and open it. In bounded memory (:func:`~detaug.formats.coco_stream._stream`
    into the folder being written: the chunks' columns spilled to files there, the arrays
    written from them, 32 bytes an image in memory); a file the streaming parser does
    not take (a keypoints file), or read with ``masks``, is read by ``load_coco`` (in memory)
    and saved. Nothing but the cache is left
    behind, also when the file has errors (:class:`DatasetError`)."""
    from detaug.formats.coco_stream import CHUNK_BYTES, _by_load_coco, _stream  # the parsers: not needed to open a cache
    from detaug.formats.json_stream import _Irregular

    key = _file_key(path)

    def write(tmp: Path) -> dict[str, Any]:
        try:
            if masks:
                raise _Irregular("masks")  # the streaming parser reads no segmentations
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)  # said by the caller, once
                columns = _stream(path, name, CHUNK_BYTES, allow_paths_outside, tmp)
        except (_Irregular, RecursionError):  # RecursionError: a value nested too deeply
            for leftover in tmp.iterdir():  # the arrays written before the doubt
                leftover.unlink()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)
                columns = _by_load_coco(path, name, allow_paths_outside, masks)
            for array_name, array in columns.arrays().items():
                np.save(tmp / f"{array_name}.npy", np.ascontiguousarray(array), allow_pickle=False)
        columns.report.source = columns.source
        digest = _file_hash(path)
        unchanged = _file_key(path) == key  # else: cached under a key that will not match
        return {**columns.meta(), "masks": masks, "version": CACHE_VERSION, "key": key if unchanged else [-1] * 5,
                "sha256": digest, "outside": int(getattr(columns, "outside", 0))}

    _write_folder(folder, write, _stamp)
    arrays, meta = load_columns(folder)
    built = CocoColumns.from_columns(arrays, meta)
    built.cache = folder  # type: ignore[attr-defined]
    built.outside = meta["outside"]  # type: ignore[attr-defined]
    return built


def _open_cache(path: Path, folder: Path, masks: bool) -> CocoColumns | None:
    """The cached columns of ``path`` when its cache provably belongs to it, else ``None``
    (with a :class:`DataWarning` saying why, when there was a cache)."""
    if not os.path.lexists(folder / "meta.json"):
        return None
    try:
        meta = json.loads(_read_regular(folder / "meta.json", _META_BYTES))
        if not isinstance(meta, dict):
            raise ValueError("meta.json is not an object")
        if meta.get("version") != CACHE_VERSION:
            _warn(f"{folder}: a cache of another layout (version {str(meta.get('version'))[:20]}, this "
                  f"detaug writes {CACHE_VERSION}): rebuilt")
            return None
        if meta.get("masks", False) is not masks:  # in the folder of the other kind (moved there?)
            raise ValueError(f"a cache {'without' if masks else 'with'} segmentation masks")
        trusted = meta.get("trusted")
        if (isinstance(trusted, list) and [_file_key(path), _files_key(folder)] in trusted
                and _signed_by_us(meta, _secret())):
            arrays, meta = load_columns(folder)
            columns = CocoColumns.from_columns(arrays, meta)
            columns.cache = folder  # type: ignore[attr-defined]
            columns.outside = int(meta.get("outside", 0))  # type: ignore[attr-defined]
            return columns
        why = _renew(path, folder, meta)
        if why is None:
            return _open_cache_renewed(folder)
    except (OSError, ValueError, KeyError, TypeError, DatasetError) as err:
        why = f"unreadable ({' '.join(str(err).split())[:200]})"
    _warn(f"{folder}: the annotation cache is not provably that of {path} ({why}): rebuilt")
    return None


def _open_cache_renewed(folder: Path) -> CocoColumns:
    arrays, meta = load_columns(folder)
    columns = CocoColumns.from_columns(arrays, meta)
    columns.cache = folder  # type: ignore[attr-defined]
    columns.outside = int(meta.get("outside", 0))  # type: ignore[attr-defined]
    return columns


def _renew(path: Path, folder: Path, meta: dict[str, Any]) -> str | None:
    """Renew the keys of a cache whose file was touched, copied or moved, when the file's SHA-256
    is the one recorded under this user's MAC and the arrays pass the checks; else why not."""
    secret = _secret()
    if secret is None:
        return "the file or the cache changed since it was built"
    digest, arrays_digest = meta.get("sha256"), meta.get("arrays_sha256")
    if not isinstance(digest, str) or not isinstance(arrays_digest, str) or not _signed_by_us(meta, secret):
        return "not built here: its record is not signed by this user's cache secret"
    key = _file_key(path)
    if _file_hash(path) != digest:
        return "the file changed since the cache was built"
    if _arrays_hash(folder) != arrays_digest:
        return "its arrays changed since it was built"
    arrays, meta = load_columns(folder, mmap_mode=None)
    columns = CocoColumns.from_columns(arrays, meta)
    _check_cached(columns, bool(meta.get("outside", 0)), bool(meta.get("masks", False)))
    trusted = [k for k in meta.get("trusted", []) if isinstance(k, list)][-(_TRUSTED_KEYS - 1):]
    meta = {**meta, "trusted": [*trusted, [key, _files_key(folder)]]}
    tmp = folder / f"meta.json.tmp-{os.getpid()}"
    try:  # kept for the next start-up; a read-only cache is used all the same
        tmp.write_text(json.dumps(meta, separators=(",", ":")))
        os.replace(tmp, folder / "meta.json")
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return None


def _check_cached(columns: CocoColumns, outside_allowed: bool, masks: bool = False) -> None:
    """Check cached columns as any source's (:func:`~validation.check_columns`, the file names
    inside the images folder unless the cache says some are not, the names' offsets; keypoints
    by :func:`detaug.keypoints.check_keypoints`, segmentations, present exactly when the cache
    says ``masks``, by :meth:`~detaug.formats.mask_columns.MaskColumns.check`); a
    :class:`DatasetError` at the first problem (the cache is then rebuilt: nothing is repaired
    in a cache)."""
    t = columns.table
    report = Report(f"{columns.source} (cache)")
    starts, names = np.asarray(columns.name_starts), np.asarray(columns.names)
    n = len(t.image_ids)
    if (starts.shape != (n + 1,) or starts[0] != 0 or (np.diff(starts) < 0).any() or starts[-1] != len(names)
            or np.asarray(columns.exif).shape != (n,) or np.asarray(columns.iscrowd).shape != (len(t.labels),)
            or np.asarray(columns.annotation_ids).shape != (len(t.labels),)):
        raise DatasetError(f"{report.source}: the name offsets or per-box columns do not fit the table")
    boxes, keep = check_columns(t.image_ids, t.sizes, t.box_starts, t.boxes, t.labels, columns.categories, report,
                                lambda i: report.source)
    if not keep.all() or not np.array_equal(boxes, np.asarray(t.boxes, dtype=np.float32)) or report.total:
        raise DatasetError(f"{report.source}: its arrays do not pass the checks ({dict(report.counts)})")
    m = len(t.labels)
    if columns.keypoints is not None:
        points, why = check_keypoints(np.asarray(columns.keypoints), m)
        if points is None or np.asarray(columns.keypoints).dtype != np.float32:
            raise DatasetError(f"{report.source}: its keypoints do not pass the checks ({why or 'not float32'})")
    if (columns.segments is not None) is not masks:
        raise DatasetError(f"{report.source}: segmentations {'missing' if masks else 'not asked for'}")
    why = columns.segments.check(m) if columns.segments is not None else ""
    if why:
        raise DatasetError(f"{report.source}: its segmentations do not pass the checks ({why})")
    file_names = [columns.file_name(i) for i in range(n)]
    if not outside_allowed and outside_paths(file_names):
        raise DatasetError(f"{report.source}: a file_name outside the images folder")


def _warn_repairs(report: Report) -> None:
    repairs = report.repairs
    if repairs:
        what = ", ".join(f"{n} {r}" for r, n in sorted(repairs.items()))
        warnings.warn(f"{report.source or 'source'}: {what} (source.report.summary() has examples)", DataWarning,
                      stacklevel=3)
