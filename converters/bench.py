"""Benchmark: ``voc2coco`` against ``globox convert -f pascalvoc -F coco`` on a generated VOC set.

    python -m converters.bench [--files 20000] [--workers N] [--repeat 3]

Generates ``--files`` labelImg-style annotation XMLs (1-6 objects each, sizes in ``<size>``, no
images: globox reads only the XMLs, and without an images folder voc2coco is annotation-only
too) in a temporary folder, then runs both command lines as subprocesses, timed the same way
(wall clock around the process, interpreter start included), alternating, ``--repeat`` times
each. Prints files/s (median run) for both, the ratio, and the CPU time (user + system, worker
processes included) of each. globox is not a dependency of detaug:
``pip install globox==2.9.0`` (or the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from converters.labels import VOC_CLASSES

_OBJECT = """\t<object>
\t\t<name>{name}</name>
\t\t<pose>Unspecified</pose>
\t\t<truncated>{truncated}</truncated>
\t\t<difficult>{difficult}</difficult>
\t\t<bndbox>
\t\t\t<xmin>{xmin}</xmin>
\t\t\t<ymin>{ymin}</ymin>
\t\t\t<xmax>{xmax}</xmax>
\t\t\t<ymax>{ymax}</ymax>
\t\t</bndbox>
\t</object>
"""

_ANNOTATION = """<annotation>
\t<folder>JPEGImages</folder>
\t<filename>{stem}.jpg</filename>
\t<path>/data/VOC/JPEGImages/{stem}.jpg</path>
\t<source>
\t\t<database>Unknown</database>
\t</source>
\t<size>
\t\t<width>{width}</width>
\t\t<height>{height}</height>
\t\t<depth>3</depth>
\t</size>
\t<segmented>0</segmented>
{objects}</annotation>
"""


def generate_voc(root: Path, n_files: int, seed: int = 0) -> int:
    """Write ``n_files`` annotation XMLs to ``root/Annotations``; returns the number of objects."""
    rng = random.Random(seed)
    annotations = root / "Annotations"
    annotations.mkdir(parents=True, exist_ok=True)
    n_objects = 0
    for i in range(n_files):
        width, height = rng.randint(200, 1000), rng.randint(200, 1000)
        objects = []
        for _ in range(rng.randint(1, 6)):
            xmin, ymin = rng.randint(1, width - 20), rng.randint(1, height - 20)
            objects.append(_OBJECT.format(
                name=rng.choice(VOC_CLASSES), truncated=rng.randint(0, 1),
                difficult=int(rng.random() < 0.1), xmin=xmin, ymin=ymin,
                xmax=rng.randint(xmin + 1, width), ymax=rng.randint(ymin + 1, height)))
        n_objects += len(objects)
        stem = f"{i:06d}"
        (annotations / f"{stem}.xml").write_text(
            _ANNOTATION.format(stem=stem, width=width, height=height, objects="".join(objects)),
            encoding="utf-8")
    return n_objects


def _timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and the processes it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({completed.returncode}):\n"
                           f"{completed.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def _count_annotations(path: Path) -> int:
    with path.open(encoding="utf-8") as handle:
        return len(json.load(handle)["annotations"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m converters.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000, help="XML files (default 20000)")
    parser.add_argument("--workers", type=int, default=None,
                        help="voc2coco --workers (default: automatic)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each tool (default 3)")
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it")
    args = parser.parse_args(argv)

    globox = shutil.which("globox")
    if globox is None:
        print("globox not found: pip install globox==2.9.0", file=sys.stderr)
        return 2
    voc2coco = shutil.which("voc2coco")
    ours = [voc2coco] if voc2coco else [sys.executable, "-m", "converters.cli"]

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="voc2coco-bench-"))
    try:
        root = work / "VOC"
        print(f"generating {args.files} XML files in {root} ...", flush=True)
        n_objects = generate_voc(root, args.files)
        ours_cmd = ours + [str(root), "-o", str(work / "ours.json"), "--quiet"]
        if args.workers is not None:
            ours_cmd += ["--workers", str(args.workers)]
        # --coco_auto_ids: globox refuses to write COCO without id mappings otherwise.
        globox_cmd = [globox, "convert", "-f", "pascalvoc", "-F", "coco", "--coco_auto_ids",
                      str(root / "Annotations"), str(work / "globox.json")]
        times: dict[str, list[float]] = {"voc2coco": [], "globox": []}
        cpu: dict[str, list[float]] = {"voc2coco": [], "globox": []}
        for _ in range(args.repeat):
            for name, command in (("voc2coco", ours_cmd), ("globox", globox_cmd)):
                wall, used = _timed(command)
                times[name].append(wall)
                cpu[name].append(used)
        counts = {name: _count_annotations(work / f"{file}.json")
                  for name, file in (("voc2coco", "ours"), ("globox", "globox"))}
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}; {args.files} XML "
          f"files, {n_objects} objects; median of {args.repeat} runs, process start included")
    rates = {}
    for name in ("voc2coco", "globox"):
        median = statistics.median(times[name])
        rates[name] = args.files / median
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:9s} {rates[name]:9.0f} files/s  ({median:.2f} s; runs {runs} s; CPU "
              f"{statistics.median(cpu[name]):.2f} s; {counts[name]} annotations)")
    print(f"ratio     {rates['voc2coco'] / rates['globox']:9.1f}x  (CPU time: "
          f"{statistics.median(cpu['globox']) / statistics.median(cpu['voc2coco']):.1f}x less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
