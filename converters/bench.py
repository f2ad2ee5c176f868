"""Benchmark: ``voc2coco`` against ``globox convert -f pascalvoc -F coco`` on a generated VOC set.

    python -m converters.bench [--files 20000] [--workers N] [--repeat 3]

Generates ``--files`` labelImg-style annotation XMLs (1-6 objects each, sizes in ``<size>``, no
images: globox reads only the XMLs, and without an images folder voc2coco is annotation-only
too) in a temporary folder, then runs, on the same files in one run, ``voc2coco --workers 1``,
``voc2coco --workers N`` (``--workers``, default: the available cores) and globox, each as a
subprocess timed the same way (wall clock around the process, interpreter start included),
alternating, ``--repeat`` times each. Prints, for the median run of each: files/s, CPU time
(user + system, worker processes included), **files per CPU-second** (files/s per core: what
one core converts, whatever the number of processes) and the peak RSS of the largest process;
then the ratios. globox is not a dependency of detaug: ``pip install globox==2.9.0`` (or the
``bench`` extra).

``--memory`` instead measures the main process's peak RSS of ``voc2coco --workers 1`` on
``--files`` and on ``--files / 4`` files: the growth per file is what a dataset costs beyond the
fixed part (:func:`peak_rss`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from converters.labels import VOC_CLASSES
from converters.runner import available_cores

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


def _timed(command: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds: user + system of the process and the processes it waited for,
    peak RSS in bytes of the process or of the largest of those it waited for)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=_env())
    assert process.stderr is not None
    err = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    process.stderr.close()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}):\n"
                           f"{err.decode(errors='replace')[-2000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def _env() -> dict[str, str]:
    """The environment with this checkout first on ``PYTHONPATH`` (``python -m converters.cli``
    runs the code being measured, whatever is installed)."""
    root = str(Path(__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")])))


def peak_rss(root: Path, out: Path, workers: int = 1) -> int:
    """Peak RSS in bytes of ``voc2coco ROOT -o OUT --workers N --quiet`` (its main process, or
    the largest of its processes)."""
    return _timed([sys.executable, "-m", "converters.cli", str(root), "-o", str(out), "--quiet",
                   "--workers", str(workers)])[2]


def _count_annotations(path: Path) -> int:
    with path.open(encoding="utf-8") as handle:
        return len(json.load(handle)["annotations"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m converters.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000, help="XML files (default 20000)")
    parser.add_argument("--workers", type=int, default=None,
                        help="voc2coco --workers of the parallel run (default: available cores)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each tool (default 3)")
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it")
    parser.add_argument("--memory", action="store_true",
                        help="measure peak RSS on --files and --files/4 files instead")
    args = parser.parse_args(argv)

    globox = shutil.which("globox")
    if globox is None and not args.memory:
        print("globox not found: pip install globox==2.9.0", file=sys.stderr)
        return 2
    workers = args.workers or available_cores()
    ours = [sys.executable, "-m", "converters.cli"]

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="voc2coco-bench-"))
    try:
        if args.memory:
            return _memory(work, args.files)
        root = work / "VOC"
        print(f"generating {args.files} XML files in {root} ...", flush=True)
        n_objects = generate_voc(root, args.files)
        commands = {"voc2coco": ours + [str(root), "-o", str(work / "voc2coco.json"), "--quiet",
                                        "--workers", "1"]}
        if workers > 1:
            commands[f"voc2coco-w{workers}"] = ours + [
                str(root), "-o", str(work / f"voc2coco-w{workers}.json"), "--quiet",
                "--workers", str(workers)]
        # --coco_auto_ids: globox refuses to write COCO without id mappings otherwise.
        commands["globox"] = [globox, "convert", "-f", "pascalvoc", "-F", "coco",
                              "--coco_auto_ids", str(root / "Annotations"),
                              str(work / "globox.json")]
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            for name, command in commands.items():
                runs[name].append(_timed(command))
        counts = {name: _count_annotations(work / f"{name}.json") for name in commands}
        if workers > 1 and (work / "voc2coco.json").read_bytes() != (
                work / f"voc2coco-w{workers}.json").read_bytes():
            raise RuntimeError("--workers 1 and --workers N wrote different files")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({available_cores()} available), "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}; "
          f"{args.files} XML files, {n_objects} objects; median of {args.repeat} runs, process "
          "start included; per core = files per CPU-second")
    rates, per_core = {}, {}
    for name, measured in runs.items():
        wall = statistics.median(t for t, _, _ in measured)
        cpu = statistics.median(c for _, c, _ in measured)
        rss = max(r for _, _, r in measured)
        rates[name], per_core[name] = args.files / wall, args.files / cpu
        times = ", ".join(f"{t:.2f}" for t, _, _ in measured)
        print(f"{name:12s} {rates[name]:9.0f} files/s  {per_core[name]:9.0f} files/s per core  "
              f"({wall:.2f} s; runs {times} s; CPU {cpu:.2f} s; peak RSS {rss / 2**20:.0f} MB; "
              f"{counts[name]} annotations)")
    print(f"ratio        {rates['voc2coco'] / rates['globox']:9.1f}x  (one process each; CPU time: "
          f"{per_core['voc2coco'] / per_core['globox']:.1f}x less per file)")
    if workers > 1:
        name = f"voc2coco-w{workers}"
        print(f"scaling      {rates[name] / rates['voc2coco']:9.1f}x  with {workers} workers "
              f"({rates[name] / rates['globox']:.1f}x globox)")
    return 0


def _memory(work: Path, n_files: int) -> int:
    """Peak RSS of ``--workers 1`` on ``n_files // 4`` and ``n_files`` files; prints the growth
    per file and an extrapolation to a million files."""
    small = max(1, n_files // 4)
    peaks = {}
    for n in (small, n_files):
        root = work / f"VOC{n}"
        print(f"generating {n} XML files in {root} ...", flush=True)
        generate_voc(root, n)
        peaks[n] = peak_rss(root, work / f"out{n}.json")
        shutil.rmtree(root, ignore_errors=True)
        size = (work / f"out{n}.json").stat().st_size
        print(f"{n:9d} files: peak RSS {peaks[n] / 2**20:7.1f} MB (output {size / 2**20:.0f} MB)",
              flush=True)
    per_file = (peaks[n_files] - peaks[small]) / (n_files - small) if n_files > small else 0.0
    print(f"growth: {per_file:.0f} bytes per file; a million files: about "
          f"{(peaks[small] + per_file * (1_000_000 - small)) / 2**20:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
