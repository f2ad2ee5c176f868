"""When a COCO annotation cache is trusted: its keys, hashes and signature.

A cache is used only when it provably belongs to this very file (docs/security.md):

* fast path: ``meta.json``'s ``trusted`` holds the annotation file's ``[size, mtime_ns, ctime_ns,
  device, inode]`` with the same of each of the cache's ``.npy`` files, as they were when it was
  built (or renewed: up to :data:`_TRUSTED_KEYS` such pairs), and its MAC (HMAC-SHA256 with a
  secret of this user, :func:`_secret`) over everything else it says is valid. No copy,
  extraction or edit keeps a file's inode and ctime (ctime cannot be set), and a cache made
  elsewhere has no valid MAC, so a cache shipped with a dataset, or an edited file or cache,
  never takes this path. Nothing is read but ``meta.json`` and the secret: opening stays as
  fast as before.
* otherwise (the file was touched, copied, moved to another disk): the SHA-256 of the file and
  of the arrays are computed and compared with those signed at build; then the arrays are
  checked as any source's (:func:`detaug.formats.coco_cache._check_cached`) and the new keys
  kept; anything else rebuilds the cache with a :class:`~detaug.errors.DataWarning` saying why.

The cache itself is built and opened by :mod:`detaug.formats.coco_cache`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


#: Bumped whenever the cache layout or the rules that fill it change (old caches are rebuilt).
CACHE_VERSION = 3


#: Keys a cache keeps as its own (the file and its arrays as seen from up to this many hosts or
#: copies, e.g. nodes that see other device numbers of one network file system).
_TRUSTED_KEYS = 32
#: Bytes read at a time when hashing an annotation file.
_HASH_BLOCK = 8 << 20


def _file_key(path: str | os.PathLike) -> list[int]:
    """``[size, mtime_ns, ctime_ns, device, inode]`` of ``path``."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino]


def _files_key(folder: Path) -> list[list[Any]]:
    """:func:`_file_key` of each ``.npy`` file of a cache folder, by name."""
    return [[p.name, *_file_key(p)] for p in sorted(folder.glob("*.npy"))]


def _file_hash(path: str | os.PathLike) -> str:
    """SHA-256 of the whole file (read in bounded blocks)."""
    digest = hashlib.sha256()
    if not stat.S_ISREG(os.stat(path).st_mode):  # a device never ends, a pipe blocks
        raise ValueError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _arrays_hash(folder: Path) -> str:
    """SHA-256 over the SHA-256 of each ``.npy`` file of a cache folder, in name order."""
    digest = hashlib.sha256()
    for p in sorted(folder.glob("*.npy")):
        digest.update(f"{p.name}:{_file_hash(p)};".encode())
    return digest.hexdigest()


def _stamp(tmp: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` of a cache written into ``tmp``: its arrays' keys and hash, and the MAC over
    everything it says (none without a secret)."""
    meta = {**meta, "arrays_sha256": _arrays_hash(tmp)}
    meta["trusted"] = [[meta.pop("key"), _files_key(tmp)]]
    secret = _secret()
    meta["mac"] = _mac(secret, meta) if secret is not None else None
    return meta


def _secret() -> bytes | None:
    """This user's cache secret (32 random bytes in ``$DETAUG_CACHE_SECRET``, default
    ``~/.cache/detaug/cache-secret``, mode 0600; made when first needed), or ``None`` when it
    cannot be read or made (caches are then trusted on the fast path only)."""
    where = os.environ.get("DETAUG_CACHE_SECRET")
    if where is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        where = os.path.join(base, "detaug", "cache-secret")
    try:
        with open(where, "rb") as f:
            data = f.read(64)
        return data if len(data) == 32 else None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        os.makedirs(os.path.dirname(where) or ".", mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(where) or ".", prefix=".cache-secret.")
        try:
            os.write(fd, os.urandom(32))
            os.close(fd)
            try:
                os.link(tmp, where)  # atomic; another process may have made it first
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        with open(where, "rb") as f:
            data = f.read(64)
        return data if len(data) == 32 else None
    except OSError:
        return None


def _mac(secret: bytes, meta: Mapping[str, Any]) -> str:
    """HMAC-SHA256 over what a cache's ``meta.json`` says (the annotation file's hash, the
    arrays' hash, the categories, the report, ...), all but its keys and its MAC."""
    import hmac

    signed = {k: value for k, value in meta.items() if k not in ("trusted", "mac")}
    text = json.dumps(signed, sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, f"detaug-cache:{CACHE_VERSION}:{text}".encode(), hashlib.sha256).hexdigest()


def _signed_by_us(meta: Mapping[str, Any], secret: bytes | None) -> bool:
    """Whether ``meta``'s MAC is this user's (``True`` where there is no secret to check with)."""
    import hmac

    if secret is None:
        return True
    mac = meta.get("mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, _mac(secret, meta))
