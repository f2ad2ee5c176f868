"""``detaug bench --startup``: start-up time and peak memory of each source, per rank, against
the number of images.

For each size (default 100k, 1M and 10M images, 2 boxes each) it generates the annotations once
(a COCO JSON, and a shard folder whose ``manifest/`` holds the same samples and whose tar files
are sparse placeholders: start-up reads no image), then starts one fresh Python process per
source that builds the source and does what a rank does before its first batch: the epoch's
order and its rank's share (:class:`detaug.epochs.EpochSpec`, ``shuffle=True``, rank 0 of
``--ranks``), the labels present (``LabelMap``'s input) and the annotations of its first 64
samples. Measured in that process: the seconds from before the source is built to after that,
and the peak resident memory of the whole process (``VmHWM``, the high-water mark the kernel
keeps; imports included; memory-mapped columns count as far as they were touched).

Sources:

* ``coco-list``: ``CocoSource`` as a list of samples (a Python object per image); skipped
  where its memory, extrapolated from a smaller size, would not fit in this machine's memory;
* ``coco-cache-build``: the columnar COCO source's first start-up: parse the JSON, write the
  cache (:mod:`detaug.formats.columnar`);
* ``coco-cache``: its later start-ups: open the cache;
* ``shards``: :class:`detaug.shards.ShardSource` on the shard folder's manifest.

``coco-cache`` and ``shards`` are measured ``--repeat`` times (fresh processes), the fastest kept;
the build and ``coco-list`` once.

Targets (checked on the largest size and the one below it): at 10M images ``shards`` and
``coco-cache`` start in <= 20 s with <= 2 GB per rank, and grow at most linearly (start-ups under
:data:`FLOOR_SECONDS` and 100 MB count as that much: below them is timing jitter and the
interpreter's own memory).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from detaug.formats.box_formats import xywh_to_xyxy

__all__ = ["SOURCES", "main", "measure", "write_annotations"]

SOURCES = ("coco-list", "coco-cache-build", "coco-cache", "shards")
#: Targets at 10M images for the sources that must scale.
TARGET_SECONDS, TARGET_BYTES = 20.0, 2 * 10**9
#: Start-ups shorter than this count as this long when growth is checked (timing jitter).
FLOOR_SECONDS = 0.1
SCALABLE = ("coco-cache", "shards")
BOXES = 2
CLASSES = 80
#: Samples per placeholder tar file (about 1 GB of 100 kB images).
PER_TAR = 10_000


# -- the generated data ----------------------------------------------------------------------------

def _annotations(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` images of 640x480 with :data:`BOXES` boxes each: ids 1..n, xywh boxes inside the
    image (float), labels 1..80."""
    rng = np.random.Generator(np.random.PCG64(seed))  # the data, not an augmentation: no seed contract
    k = n * BOXES
    xy = rng.integers(0, 320, (k, 2)).astype(np.float64) + 0.5
    wh = rng.integers(1, 300, (k, 2)).astype(np.float64)
    return {"ids": np.arange(1, n + 1, dtype=np.int64), "xywh": np.concatenate([xy, wh], axis=1),
            "labels": rng.integers(1, CLASSES + 1, k).astype(np.int64)}


def write_annotations(folder: str | os.PathLike, n: int) -> tuple[Path, Path, Path]:
    """Write (once; kept when there) ``coco-N.json``, an empty images folder and the shard folder
    ``shards-N/`` of ``n`` generated images; returns their paths."""
    from detaug.formats.column_store import SampleTable
    from detaug.shard_manifest import save_manifest

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    coco, images, shards = folder / f"coco-{n}.json", folder / "images", folder / f"shards-{n}"
    images.mkdir(exist_ok=True)
    data = None
    if not coco.is_file():
        data = _annotations(n)
        tmp = coco.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write('{"info": {"description": "detaug bench --startup"}, "categories": [')
            f.write(", ".join(f'{{"id": {c}, "name": "class{c}", "supercategory": "thing"}}' for c in range(1, CLASSES + 1)))
            f.write('],\n"images": [')
            step = 200_000
            for a in range(0, n, step):
                rows = range(a + 1, min(n, a + step) + 1)
                f.write(("," if a else "") + "\n" + ",\n".join(
                    f'{{"id": {i}, "file_name": "{i:012d}.jpg", "height": 480, "width": 640}}' for i in rows))
            f.write('],\n"annotations": [')
            xywh, labels = data["xywh"], data["labels"]
            for a in range(0, n * BOXES, step):
                b = min(n * BOXES, a + step)
                box = xywh[a:b].tolist()
                f.write(("," if a else "") + "\n" + ",\n".join(
                    f'{{"id": {j + 1}, "image_id": {j // BOXES + 1}, "category_id": {labels[j]}, '
                    f'"bbox": [{x}, {y}, {w}, {h}], "area": {w * h}, "iscrowd": 0}}'
                    for j, (x, y, w, h) in zip(range(a, b), box)))
            f.write("]}\n")
        tmp.rename(coco)
    if not (shards / "manifest" / "meta.json").is_file():
        data = data or _annotations(n)
        shards.mkdir(exist_ok=True)
        xywh = data["xywh"]
        table = SampleTable(data["ids"], np.tile(np.array([[480, 640]], np.int32), (n, 1)),
                            np.arange(0, n * BOXES + 1, BOXES, dtype=np.int64),
                            xywh_to_xyxy(xywh).astype(np.float32),
                            data["labels"].astype(np.int32))
        stride = 100 * 1024  # placeholder images of 100 kB
        within = np.arange(n, dtype=np.int64) % PER_TAR
        offsets, lengths = 512 + within * (stride + 1024), np.full(n, stride, np.int64)
        tars = []
        for t in range((n + PER_TAR - 1) // PER_TAR):
            name = f"shard-{t:06d}.tar"
            count = min(PER_TAR, n - t * PER_TAR)
            with open(shards / name, "wb") as f:  # sparse: the size, no data
                f.truncate(int(512 + count * (stride + 1024) + 1024))
            tars.append({"tar": name, "index": f"shard-{t:06d}.idx", "samples": count, "bytes": (shards / name).stat().st_size})
        dataset = {"version": 1, "categories": [[c, f"class{c}"] for c in range(1, CLASSES + 1)], "orientation": "auto",
                   "key_width": max(9, len(str(n))), "extensions": ["jpg"], "shards": tars, "samples": n,
                   "boxes": n * BOXES, "skipped": [], "written_from": "detaug bench --startup (placeholder tars)"}
        save_manifest(shards, table, offsets, lengths, np.zeros(n, np.uint8), dataset)
    return coco, images, shards


# -- one measurement (in a fresh process) ----------------------------------------------------------

def _child(kind: str, coco: str, images: str, shards: str, cache_dir: str, ranks: int) -> dict[str, Any]:
    """Build the source ``kind`` and do a rank's start-up (module docstring); seconds and peak RSS."""
    import warnings

    from detaug.epochs import EpochSpec
    from detaug.sources import CocoSource

    warnings.simplefilter("ignore")
    imported = _peak_rss()
    started = time.perf_counter()
    if kind == "coco-list":
        source = CocoSource(coco, images)
    elif kind in ("coco-cache-build", "coco-cache"):
        source = CocoSource(coco, images, cache=cache_dir or True)
    elif kind == "shards":
        from detaug.shards import ShardSource

        source = ShardSource(shards)
    else:
        raise ValueError(f"unknown source {kind!r}")
    built = time.perf_counter()
    spec = EpochSpec(n=len(source), batch_size=64, shard_id=0, num_shards=ranks, shuffle=True, seed=0)
    order = spec.order(0)
    present = source.present_labels() if hasattr(source, "present_labels") else np.unique(
        np.concatenate([np.asarray(s.labels) for s in source.samples]))
    first = [source.samples[int(p)] for p in order[:64]]
    assert all(len(s.boxes) == BOXES for s in first) and len(present) == CLASSES
    done = time.perf_counter()
    return {"seconds": done - started, "build_seconds": built - started,
            "peak_rss": _peak_rss(), "import_rss": imported,
            "samples": len(source)}


def _proc_bytes(path: str, key: str) -> int | None:
    """The ``KEY: N kB`` line of a ``/proc`` file (``/proc/self/status``, ``/proc/meminfo``) in
    bytes, or ``None`` where the file cannot be read or has no such line."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _peak_rss() -> int:
    """Peak resident bytes of this process: ``VmHWM`` (of this program's memory only; the
    ``ru_maxrss`` of a child started by fork and exec also counts its parent's peak), else
    ``ru_maxrss``."""
    peak = _proc_bytes("/proc/self/status", "VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(kind: str, coco: Path, images: Path, shards: Path, cache_dir: Path, ranks: int,
            timeout: float | None = None) -> dict[str, Any]:
    """Run :func:`_child` in a fresh interpreter; its result, or ``{"error": ...}``."""
    code = ("import json, sys; from detaug.bench.startup import _child; "
            "print('RESULT', json.dumps(_child(*sys.argv[1:6], int(sys.argv[6]))))")
    args = [sys.executable, "-c", code, kind, str(coco), str(images), str(shards), str(cache_dir), str(ranks)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[2]),
                                                                      os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {"error": tail}


def _available_memory() -> int:
    """Bytes of memory available to start processes: ``MemAvailable``, else the physical memory."""
    available = _proc_bytes("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# -- the table -------------------------------------------------------------------------------------

def _checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets (module docstring) on the rows that have the sizes they need."""
    by = {(r["images"], r["source"]): r for r in rows if "seconds" in r}
    sizes = sorted({r["images"] for r in rows})
    checks = []
    big = max(sizes) if sizes else 0
    for kind in SCALABLE:
        r = by.get((big, kind))
        if big >= 10_000_000 and r:
            checks.append({"check": f"{kind} at {big:,} images: <= {TARGET_SECONDS:.0f} s, <= {TARGET_BYTES / 1e9:.0f} GB",
                           "ok": r["seconds"] <= TARGET_SECONDS and r["peak_rss"] <= TARGET_BYTES})
        small = [s for s in sizes if s < big and (s, kind) in by]
        if r and small:
            s = max(small)
            a = by[(s, kind)]
            ratio = big / s
            # floors of 0.1 s and 100 MB: below them a start-up is the timing's jitter on a shared
            # machine and the interpreter's own memory
            grow_t = max(r["seconds"], FLOOR_SECONDS) / max(a["seconds"], FLOOR_SECONDS)
            grow_m = max(r["peak_rss"], 1e8) / max(a["peak_rss"], 1e8)
            checks.append({"check": f"{kind} {s:,} -> {big:,} images: time x{grow_t:.2f}, memory x{grow_m:.2f} "
                                    f"(at most linear: x{ratio:.0f})",
                           "ok": grow_t <= ratio and grow_m <= ratio})
    return checks


def format_table(rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> str:
    """The table and the checks as text."""
    lines = [f"{'images':>11}  {'source':<17} {'start-up s':>10} {'peak RSS MB':>12}  note",
             f"{'-' * 11}  {'-' * 17} {'-' * 10} {'-' * 12}  ----"]
    for r in rows:
        if "seconds" in r:
            lines.append(f"{r['images']:>11,}  {r['source']:<17} {r['seconds']:>10.2f} {r['peak_rss'] / 2**20:>12.0f}  "
                         f"{r.get('note', '')}")
        else:
            lines.append(f"{r['images']:>11,}  {r['source']:<17} {'-':>10} {'-':>12}  {r.get('error', '')}")
    for c in checks:
        lines.append(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``detaug bench --startup [--sizes 100000,1000000,10000000] [--sources ...] [--ranks 8]
    [--workdir DIR] [--json PATH]``: print the table; exit status 1 when a target fails."""
    parser = argparse.ArgumentParser(prog="detaug bench --startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--startup", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="100000,1000000,10000000", help="images per generated dataset (comma-separated)")
    parser.add_argument("--sources", default=",".join(SOURCES), help=f"which of {', '.join(SOURCES)}")
    parser.add_argument("--ranks", type=int, default=8, help="ranks the epoch is split over (rank 0 measured)")
    parser.add_argument("--workdir", help="where the generated files go (kept; default: a temporary folder, removed)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows and checks as JSON")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    parser.add_argument("--repeat", type=int, default=3,
                        help="fresh processes per cached start-up (coco-cache, shards), the fastest kept (default: 3)")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes: not integers: {args.sizes!r}")
    kinds = [k.strip() for k in args.sources.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in SOURCES]
    if unknown or not sizes or min(sizes) < 1:
        parser.error(f"--sources: unknown {unknown}" if unknown else "--sizes: give sizes >= 1")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="detaug-startup-"))
    rows: list[dict[str, Any]] = []
    per_image = 3300.0  # peak bytes per image of coco-list (the 3.3 GB at 1M), then as measured
    try:
        for n in sorted(sizes):
            t = time.perf_counter()
            coco, images, shards = write_annotations(workdir, n)
            print(f"[{n:,} images: data ready in {time.perf_counter() - t:.1f} s, "
                  f"COCO JSON {coco.stat().st_size / 1e9:.2f} GB]", file=sys.stderr, flush=True)
            cache_dir = workdir / f"cache-{n}"
            for kind in kinds:
                row: dict[str, Any] = {"images": n, "source": kind}
                if kind == "coco-list" and per_image * n > 0.6 * _available_memory():
                    row["error"] = (f"not run: would need about {per_image * n / 1e9:.0f} GB "
                                    f"(extrapolated), {_available_memory() / 1e9:.0f} GB available")
                    rows.append(row)
                    continue
                if kind == "coco-cache-build":
                    shutil.rmtree(cache_dir, ignore_errors=True)
                if kind == "coco-cache" and "coco-cache-build" not in kinds:  # a cache of this detaug
                    shutil.rmtree(cache_dir, ignore_errors=True)
                    measure("coco-cache-build", coco, images, shards, cache_dir, args.ranks, args.timeout)
                repeats = 1 if kind in ("coco-list", "coco-cache-build") else max(1, args.repeat)
                runs = [measure(kind, coco, images, shards, cache_dir, args.ranks, args.timeout) for _ in range(repeats)]
                good = [r for r in runs if "seconds" in r]
                row.update(min(good, key=lambda r: r["seconds"]) if good else runs[0])
                if len(good) > 1:
                    row["runs"] = [round(r["seconds"], 3) for r in good]
                if kind == "coco-list" and "peak_rss" in row:
                    per_image = row["peak_rss"] / n
                if "build_seconds" in row:
                    row["note"] = f"source built in {row['build_seconds']:.2f} s"
                rows.append(row)
                print(format_table([row], []).splitlines()[-1], file=sys.stderr, flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    checks = _checks(rows)
    print(f"start-up per rank (rank 0 of {args.ranks}, shuffled epoch 0, first 64 samples); "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(format_table(rows, checks))
    if args.json:
        Path(args.json).write_text(json.dumps({"ranks": args.ranks, "rows": rows, "checks": checks}, indent=1))
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
