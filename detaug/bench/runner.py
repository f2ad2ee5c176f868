"""``detaug bench``: every variant of the default detection recipe, side by side in one run.

Variants (``--only`` names):

* ``detaug``: ``detaug.torch.DetectionLoader`` (the PyTorch iterator) on a ``CocoSource``;
* ``detaug-list``: the same loader on the same JSON as a sample list (planning in workers);
* ``sequence``: ``detaug.keras.DetectionSequence`` as ``model.fit(seq)`` reads it: Keras'
  ``PyDatasetAdapter``, batches in a random order from the sequence's default ``workers`` threads
  (on a GPU with Keras' torch backend its images are torch tensors on the GPU);
* ``sequence-numpy``: the same requests with NumPy images on the host (Keras' own conversion of
  NumPy batches left out);
* ``sequence-serial``: ``seq[i]`` called one at a time in a random order (``workers=1``);
* ``raw-dali``: the same recipe hand-written in plain DALI (:mod:`detaug.bench.raw_dali`);
* ``torchvision``, ``albumentations``: the CPU peers in DataLoaders (:mod:`detaug.bench.peers`).

Processing order: prepare the dataset; run the CPU peers first (their workers fork before DALI
and CUDA start in this process), then raw DALI, detaug and the Sequence, each warmed up and
timed by :func:`detaug.bench.harness.measure`; print the table and the target checks. A variant
that cannot run (package missing, error) gets a row that says why, and a missing peer the line
that installs it without changing torch; the others still run.

Defaults fit the machine (:data:`DEFAULTS`): DALI threads and DataLoader workers from the CPUs
this process may use (:func:`~detaug.bench.harness.available_cpus`); on a GPU the full run of
docs/benchmarks.md (2,048 images, batch 64, 10 epochs per DALI variant); on the CPU a short
run (256 images, batch 16, 64 images per variant: under a minute on 2 cores), longer with
``--images`` / ``--num-images`` / ``--batch-size``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

from detaug.bench.dataset import BenchDataset, prepare_dataset
from detaug.bench.harness import (
    BenchSettings,
    Measurement,
    VariantUnavailable,
    available_cpus,
    cuda_available,
    default_threads,
    default_workers,
    measure,
)
from detaug.bench.peers import ALBUMENTATIONS_CROP_NOTE, PEERS_PIP

__all__ = [
    "CHECKS",
    "DEFAULTS",
    "VARIANTS",
    "BenchReport",
    "Check",
    "Variant",
    "VariantResult",
    "main",
    "run_bench",
]

Kind = Literal["detaug", "reference", "cpu-peer"]
RECIPE_TITLE = "IoU crop, flip, affine, resize {size}, colour jitter, normalize"


@dataclass(frozen=True)
class Variant:
    """One measured way of running the recipe.

    Attributes:
        name: ``--only`` name.
        label: table label.
        kind: ``"detaug"``, ``"reference"`` (raw DALI) or ``"cpu-peer"`` (DataLoader peers, timed
            in whole waves of ``workers`` batches).
        factory: ``(dataset, settings) -> endless iterator of batches``; imported lazily from
            ``module:function`` so a missing optional package only affects its own row.
        note: printed next to the result (a GPU run's).
        cpu_note: the note of a CPU run, where it differs (:meth:`note_for`).
    """

    name: str
    label: str
    kind: Kind
    factory: str
    note: str = ""
    cpu_note: str | None = None

    def note_for(self, device: str) -> str:
        """The note true to ``device`` (``"gpu"`` or ``"cpu"``)."""
        return self.cpu_note if device == "cpu" and self.cpu_note is not None else self.note

    def batches(self, dataset: BenchDataset, settings: BenchSettings) -> Iterator:
        import importlib

        module, function = self.factory.split(":")
        return getattr(importlib.import_module(module), function)(dataset, settings)


# The notes state the adapters' defaults on each device (DetectionLoader: planning workers on a
# GPU, none on the CPU; DetectionSequence: 4 threads and images on the GPU, 1 thread and NumPy
# images on the CPU); tests/detaug/test_cli.py checks them against the adapters.
VARIANTS: tuple[Variant, ...] = (
    Variant(
        "detaug",
        "detaug iterator, COCO reader",
        "detaug",
        "detaug.bench.detaug_variants:iter_detaug",
        note="CocoSource (the JSON parsed once, then indexed); planning in worker processes",
        cpu_note="CocoSource (the JSON parsed once, then indexed); planning in the main process",
    ),
    Variant(
        "detaug-list",
        "detaug iterator, sample list",
        "detaug",
        "detaug.bench.detaug_variants:iter_detaug_list",
        note="SampleListSource of the same files; planning in worker processes",
        cpu_note="SampleListSource of the same files; planning in the main process",
    ),
    Variant(
        "sequence",
        "detaug Keras Sequence in fit",
        "detaug",
        "detaug.bench.detaug_variants:iter_sequence",
        note="Keras' fit(shuffle=True) data path, random order, 4 threads; images on the GPU",
        cpu_note="Keras' fit(shuffle=True) data path, random order, 1 thread; NumPy images on the host",
    ),
    Variant(
        "sequence-numpy",
        "detaug Keras Sequence, NumPy",
        "detaug",
        "detaug.bench.detaug_variants:iter_sequence_numpy",
        note="same requests, images_on_device=False: host arrays (Keras' NumPy-to-GPU copy not counted)",
        cpu_note="same requests as in fit, without Keras' data adapter; NumPy images on the host",
    ),
    Variant(
        "sequence-serial",
        "detaug Keras Sequence, serial",
        "detaug",
        "detaug.bench.detaug_variants:iter_sequence_serial",
        note="seq[i] one at a time, random order (workers=1): latency-bound, no target",
    ),
    Variant("raw-dali", "raw DALI", "reference", "detaug.bench.raw_dali:iter_raw_dali"),
    Variant("torchvision", "torchvision.transforms.v2", "cpu-peer", "detaug.bench.peers:iter_torchvision"),
    Variant(
        "albumentations",
        "albumentations",
        "cpu-peer",
        "detaug.bench.peers:iter_albumentations",
        note=ALBUMENTATIONS_CROP_NOTE,
    ),
)
VARIANT_NAMES = tuple(v.name for v in VARIANTS)
RUN_ORDER = (
    "torchvision",
    "albumentations",
    "raw-dali",
    "detaug",
    "detaug-list",
    "sequence",
    "sequence-numpy",
    "sequence-serial",
)


@dataclass
class VariantResult:
    """A table row: a measurement, or why there is none (``status`` ``"unavailable"`` or
    ``"error"``); ratios are filled in once every variant has run."""

    variant: Variant
    status: Literal["ok", "unavailable", "error"]
    measurement: Measurement | None = None
    message: str = ""
    vs_raw_dali: float | None = None
    vs_cpu_peer: float | None = None

    @property
    def images_per_second(self) -> float | None:
        return self.measurement.images_per_second if self.measurement is not None else None

    def to_dict(self, device: str = "gpu") -> dict:
        m = self.measurement
        return {
            "variant": self.variant.name,
            "label": self.variant.label,
            "status": self.status,
            "message": self.message,
            "note": self.variant.note_for(device),
            "images_per_second": self.images_per_second,
            "vs_raw_dali": self.vs_raw_dali,
            "vs_best_cpu_peer": self.vs_cpu_peer,
            "images": m.images if m else None,
            "batches": m.batches if m else None,
            "seconds": m.seconds if m else None,
            "warmup_seconds": m.warmup_seconds if m else None,
            "gpu_mem_mib": m.gpu_mem_mib if m else None,
            "torch_peak_mib": m.torch_peak_mib if m else None,
        }


@dataclass(frozen=True)
class Check:
    """A target: ``numerator / denominator >= target`` in img/s."""

    name: str
    numerator: str
    denominator: str  # a variant name, or "cpu-peer" for the faster CPU peer
    target: float


CHECKS: tuple[Check, ...] = (
    Check("detaug (COCO reader) / raw DALI", "detaug", "raw-dali", 0.9),
    Check("detaug (sample list) / raw DALI", "detaug-list", "raw-dali", 0.9),
    Check("detaug (COCO reader) / best CPU peer", "detaug", "cpu-peer", 20.0),
    Check("detaug (sample list) / best CPU peer", "detaug-list", "cpu-peer", 20.0),
    Check("Sequence in fit / iterator (COCO reader)", "sequence", "detaug", 0.5),
    Check("Sequence in fit / iterator (sample list)", "sequence", "detaug-list", 0.5),
    Check("Sequence, NumPy / iterator (COCO reader)", "sequence-numpy", "detaug", 0.5),
    Check("Sequence, NumPy / iterator (sample list)", "sequence-numpy", "detaug-list", 0.5),
)


@dataclass
class CheckResult:
    check: Check
    value: float | None
    reason: str = ""

    @property
    def passed(self) -> bool | None:
        return None if self.value is None else self.value >= self.check.target

    def line(self) -> str:
        c = self.check
        if self.value is None:
            return f"{c.name}: n/a ({self.reason}) (target >= {c.target:g})"
        verdict = "PASS" if self.passed else "FAIL"
        return f"{c.name} = {self.value:.2f} (target >= {c.target:g}): {verdict}"

    def to_dict(self) -> dict:
        return {
            "name": self.check.name,
            "value": self.value,
            "target": self.check.target,
            "passed": self.passed,
            "reason": self.reason,
        }


@dataclass
class BenchReport:
    """Everything ``detaug bench`` prints (:meth:`format`) and writes with ``--json``."""

    settings: BenchSettings
    dataset: BenchDataset
    environment: dict
    results: list[VariantResult]
    checks: list[CheckResult] = field(default_factory=list)
    images_requested: int | None = None
    images_per_variant: str = ""
    warmup: int | None = None

    def result(self, name: str) -> VariantResult | None:
        return next((r for r in self.results if r.variant.name == name), None)

    def format(self) -> str:
        env, s = self.environment, self.settings
        gpu = s.device == "gpu"
        lines = [
            f"detaug bench: default detection recipe ({RECIPE_TITLE.format(size=s.size)})",
            f"GPU: {env['gpu']} | CPUs: {env['cpus']} | "
            + " | ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
            (
                f"device {s.device} | batch {s.batch_size} | DALI threads {s.threads} | "
                f"DataLoader workers {s.workers} | size {s.size} | seed {s.seed}"
            ),
            f"dataset: {self.dataset.describe()}",
        ]
        if self.images_per_variant:
            lines.append(
                f"timed: {self.images_per_variant} per variant after {self.warmup} warm-up batches"
                + ("" if gpu or self.images_requested else " (a short CPU run; --images N for a longer one)")
            )
        lines.append("")
        header = ("variant", "img/s", "vs raw DALI", "vs best CPU", "images", "s", "GPU MiB", "note")
        if not gpu:  # no GPU memory to show
            header = header[:6] + header[7:]
        rows = [header]
        for r in self.results:
            m = r.measurement
            if m is None:
                rows.append((r.variant.label,) + ("-",) * (len(header) - 2) + (f"{r.status}: {r.message}",))
                continue
            row = (
                r.variant.label,
                f"{m.images_per_second:,.1f}",
                _ratio(r.vs_raw_dali),
                _ratio(r.vs_cpu_peer),
                str(m.images),
                f"{m.seconds:.2f}",
                "-" if m.gpu_mem_mib is None else f"{m.gpu_mem_mib:,.0f}",
                r.variant.note_for(s.device),
            )
            rows.append(row if gpu else row[:6] + row[7:])
        widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
        for k, row in enumerate(rows):
            cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:-1], widths[1:])]
            lines.append("  ".join(cells + [row[-1]]).rstrip())
            if k == 0:
                lines.append("-" * len(lines[-1]))
        lines += ["", "CPU peers are timed in whole waves of DataLoader workers."]
        lines += _missing_peer_lines(self.results)
        if gpu:
            lines.append(
                "GPU MiB: device-wide GPU memory taken while the variant ran "
                "(cudaMemGetInfo delta: DALI's pools and PyTorch's cache)."
            )
        lines += ["", "checks" + ("" if s.device == "gpu" else " (the targets are for a GPU run)") + ":"]
        lines += [f"  {c.line()}" for c in self.checks]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        s = self.settings
        return {
            "settings": {
                "device": s.device,
                "batch_size": s.batch_size,
                "workers": s.workers,
                "threads": s.threads,
                "size": s.size,
                "seed": s.seed,
                "images_requested": self.images_requested,
                "warmup": self.warmup,
            },
            "environment": self.environment,
            "dataset": self.dataset.to_dict(),
            "results": [r.to_dict(s.device) for r in self.results],
            "checks": [c.to_dict() for c in self.checks],
        }


def _missing_peer_lines(results: list[VariantResult]) -> list[str]:
    """How to install each CPU peer that was unavailable, without changing the installed torch."""
    missing = {r.variant.name for r in results if r.variant.kind == "cpu-peer" and r.status == "unavailable"}
    lines = []
    if "albumentations" in missing:
        lines.append(f"albumentations missing: {PEERS_PIP} (from the detaug clone; it leaves torch as it is)")
    if "torchvision" in missing:
        from detaug.bench.peers import torchvision_pip

        lines.append(f"torchvision missing or not loadable (it must be the build of your torch): {torchvision_pip()}")
    return lines


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Defaults:
    """What ``detaug bench`` runs when not told otherwise, by device (:data:`DEFAULTS`).

    Attributes:
        num_images: images of the generated dataset.
        batch_size: images per batch.
        warmup: warm-up batches per variant.
        images: images timed per variant; ``None``: ``epochs`` epochs of the dataset.
        epochs: ``(DALI-based, CPU peers)`` epochs timed when ``images`` is ``None``.
    """

    num_images: int
    batch_size: int
    warmup: int
    images: int | None = None
    epochs: tuple[int, int] = (1, 1)


#: A GPU run is the full run of docs/benchmarks.md; a CPU run is short (under a minute on 2
#: cores with every variant; ``images=`` / ``--images`` for a longer one).
DEFAULTS: dict[str, Defaults] = {
    "gpu": Defaults(num_images=2048, batch_size=64, warmup=5, epochs=(10, 2)),
    "cpu": Defaults(num_images=256, batch_size=16, warmup=2, images=64),
}


def pick_bench_device(device: str | None) -> Literal["gpu", "cpu"]:
    """``"gpu"`` or ``"cpu"`` for ``device`` (``None`` or ``"auto"``: the GPU when PyTorch and
    DALI both see a CUDA device). ``ValueError`` for ``"gpu"`` without one."""
    if device in (None, "auto"):
        return "gpu" if cuda_available() else "cpu"
    if device not in ("gpu", "cpu"):
        raise ValueError(f"--device should be auto, gpu or cpu, got {device!r}")
    if device == "gpu" and not cuda_available():
        raise ValueError(
            "--device gpu: no CUDA GPU that both PyTorch and DALI can use (looked for an NVIDIA "
            "driver, a CUDA build of torch and DALI's CUDA build); use --device cpu"
        )
    return device  # type: ignore[return-value]


def run_bench(
    *,
    data: str | os.PathLike[str] | None = None,
    num_images: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    device: Literal["auto", "gpu", "cpu"] | None = None,
    batch_size: int | None = None,
    workers: int | None = None,
    threads: int | None = None,
    size: int = 512,
    seed: int = 0,
    only: Sequence[str] | None = None,
    images: int | None = None,
    warmup: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> BenchReport:
    """Run the selected variants on one dataset and return the report.

    Every ``None`` takes the default of the device (:data:`DEFAULTS`) or of the machine.

    Args:
        data: existing dataset folder (``annotations.json`` + ``images/``); ``None`` generates
            (once, cached) ``num_images`` synthetic JPEGs, see
            :func:`detaug.bench.dataset.prepare_dataset`.
        device: ``"gpu"``, ``"cpu"``, or ``None``/``"auto"``: the GPU when CUDA is available.
        workers, threads: DataLoader workers of the CPU peers, DALI threads; by default from the
            CPUs available (:func:`~detaug.bench.harness.default_workers`, ``default_threads``).
        only: variant names (:data:`VARIANT_NAMES`); all by default.
        images: images timed per variant. ``None``: on the GPU 10 epochs for the DALI-based
            variants and 2 for the CPU peers; on the CPU 64 images. DataLoader peers round up
            to whole waves of ``workers`` batches.
        warmup: warm-up batches (the DataLoader peers take at least one wave, ``workers``).
        log: progress messages (default: stderr).

    Raises:
        ValueError: bad arguments, or ``device="gpu"`` without CUDA.
    """
    log = log if log is not None else (lambda msg: print(msg, file=sys.stderr, flush=True))
    device = pick_bench_device(device)
    defaults = DEFAULTS[device]
    settings = BenchSettings(
        device=device,
        batch_size=defaults.batch_size if batch_size is None else batch_size,
        workers=default_workers() if workers is None else workers,
        threads=default_threads() if threads is None else threads,
        size=size,
        seed=seed,
    )
    selected = _select(only)
    if images is not None and (isinstance(images, bool) or not isinstance(images, int) or images < 1):
        raise ValueError(f"--images should be a positive int, got {images!r}")
    warmup = defaults.warmup if warmup is None else warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"--warmup should be an int >= 1, got {warmup!r}")
    num_images = defaults.num_images if num_images is None else num_images
    requested = images

    dataset = prepare_dataset(data, num_images=num_images, cache_dir=cache_dir, seed=seed, progress=progress)
    log(f"dataset: {dataset.describe()}")
    if images is None and defaults.images is not None:
        images = defaults.images
        per_variant = f"{images} images"
    elif images is None:
        per_variant = (f"{defaults.epochs[0]} epochs ({defaults.epochs[0] * dataset.num_images} images), "
                       f"CPU peers {defaults.epochs[1]}")
    else:
        per_variant = f"{images} images"
    if selected & {v.name for v in VARIANTS if v.kind == "cpu-peer"}:
        _warn_about_shared_memory(settings, log)
    results: dict[str, VariantResult] = {}
    for name in RUN_ORDER:
        variant = next(v for v in VARIANTS if v.name == name)
        if variant.name not in selected:
            continue
        count = images if images is not None else _default_images(variant, defaults, dataset)
        log(f"running {variant.label} ({count} images) ...")
        results[name] = _run_variant(variant, dataset, settings, count, warmup, log)
        r = results[name]
        if r.measurement is not None:
            log(f"  {r.measurement.images_per_second:,.1f} img/s")
        else:
            log(f"  {r.status}: {r.message}")

    ordered = [results[v.name] for v in VARIANTS if v.name in results]
    _fill_ratios(ordered)
    report = BenchReport(
        settings=settings,
        dataset=dataset,
        environment=_environment(device),
        results=ordered,
        images_requested=requested,
        images_per_variant=per_variant,
        warmup=warmup,
    )
    report.checks = [_evaluate(c, report) for c in CHECKS]
    return report


def _warn_about_shared_memory(settings: BenchSettings, log: Callable[[str], None]) -> None:
    """DataLoader workers hand their float32 batches over in /dev/shm (two per worker in flight);
    containers often give it 64 MiB, which ends in a bus error."""
    if settings.workers == 0:
        return
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return
    batch_bytes = settings.batch_size * 3 * settings.size * settings.size * 4
    need = 2 * settings.workers * batch_bytes
    if free < need:
        log(
            f"warning: /dev/shm has {free / 2**20:,.0f} MiB free; {settings.workers} DataLoader "
            f"workers keep about {need / 2**20:,.0f} MiB of batches there (docker: --shm-size)"
        )


def _select(only: Sequence[str] | None) -> set[str]:
    if only is None:
        return set(VARIANT_NAMES)
    names = {n.strip() for n in only if n.strip()}
    unknown = names - set(VARIANT_NAMES)
    if unknown or not names:
        raise ValueError(f"unknown variant(s) {sorted(unknown)}; choose from {', '.join(VARIANT_NAMES)}")
    return names


def _default_images(variant: Variant, defaults: Defaults, dataset: BenchDataset) -> int:
    if defaults.images is not None:
        return defaults.images
    epochs = defaults.epochs[1] if variant.kind == "cpu-peer" else defaults.epochs[0]
    return epochs * dataset.num_images


def _run_variant(
    variant: Variant,
    dataset: BenchDataset,
    settings: BenchSettings,
    images: int,
    warmup: int,
    log: Callable[[str], None],
) -> VariantResult:
    peer = variant.kind == "cpu-peer"
    quantum = max(settings.workers, 1) if peer else 1
    warmup_batches = max(warmup, quantum) if peer else warmup
    try:
        m = measure(
            variant.batches(dataset, settings),
            images=images,
            warmup_batches=warmup_batches,
            batch_quantum=quantum,
            device=settings.device,
        )
    except VariantUnavailable as exc:
        return VariantResult(variant, "unavailable", message=str(exc))
    except Exception as exc:  # noqa: BLE001 - one broken variant must not end the whole run
        log("".join(traceback.format_exception(exc)).rstrip())
        return VariantResult(variant, "error", message=f"{type(exc).__name__}: {exc}".splitlines()[0])
    return VariantResult(variant, "ok", measurement=m)


def _fill_ratios(results: list[VariantResult]) -> None:
    raw = next((r.images_per_second for r in results if r.variant.name == "raw-dali" and r.measurement), None)
    best_peer = _best_cpu_peer(results)
    for r in results:
        ips = r.images_per_second
        if ips is None:
            continue
        r.vs_raw_dali = ips / raw if raw else None
        r.vs_cpu_peer = ips / best_peer if best_peer else None


def _best_cpu_peer(results: list[VariantResult]) -> float | None:
    rates = [r.images_per_second for r in results if r.variant.kind == "cpu-peer" and r.measurement]
    return max(rates) if rates else None


def _evaluate(check: Check, report: BenchReport) -> CheckResult:
    top = report.result(check.numerator)
    if top is None or top.measurement is None:
        return CheckResult(check, None, _why_missing(check.numerator, top))
    if check.denominator == "cpu-peer":
        bottom = _best_cpu_peer(report.results)
        if bottom is None:
            return CheckResult(check, None, "no CPU peer measured")
    else:
        other = report.result(check.denominator)
        if other is None or other.measurement is None:
            return CheckResult(check, None, _why_missing(check.denominator, other))
        bottom = other.images_per_second
    return CheckResult(check, top.images_per_second / bottom)


def _why_missing(name: str, result: VariantResult | None) -> str:
    if result is None:
        return f"{name} not run"
    return f"{name} {result.status}"


def _environment(device: str) -> dict:
    gpu = "none"
    if device == "gpu":
        import torch

        gpu = torch.cuda.get_device_name(0)
    usable = available_cpus()
    cpus = f"{os.cpu_count()}" if usable == os.cpu_count() else f"{usable} of {os.cpu_count()}"
    versions = {"python": platform.python_version()}
    for name, dists in (
        ("torch", ("torch",)),
        ("DALI", ("nvidia-dali-cuda120", "nvidia-dali-cuda130")),
        ("torchvision", ("torchvision",)),
        ("albumentations", ("albumentations",)),
        ("opencv", ("opencv-python-headless", "opencv-python")),
        ("keras", ("keras",)),
    ):
        versions[name] = _version(dists) or _module_version(name)
    return {"gpu": gpu, "cpus": cpus, "platform": platform.platform(), "versions": versions}


def _version(dists: Sequence[str]) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _module_version(name: str) -> str | None:
    """The version of an already-imported module (DALI unpacked outside site-packages has no
    distribution metadata)."""
    module = {"DALI": "nvidia.dali", "opencv": "cv2"}.get(name, name)
    return getattr(sys.modules.get(module), "__version__", None)


# ------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------


def build_parser(prog: str = "detaug bench") -> argparse.ArgumentParser:
    from detaug.cli import OneLineParser, positive_int

    gpu, cpu = DEFAULTS["gpu"], DEFAULTS["cpu"]
    parser = OneLineParser(
        prog=prog,
        description=(
            "Measure the default detection recipe (IoU crop, flip, affine, resize, colour jitter, "
            "normalize) through detaug's PyTorch iterator and Keras Sequence, a hand-written raw "
            "DALI pipeline, and torchvision.transforms.v2 / albumentations in DataLoaders, on one "
            "generated COCO-style JPEG dataset; print img/s, ratios and the target checks. "
            f"Defaults fit the machine: {default_threads()} DALI threads and {default_workers()} "
            f"DataLoader workers here ({available_cpus()} CPUs); a GPU run times {gpu.epochs[0]} epochs "
            f"of {gpu.num_images} images in batches of {gpu.batch_size}, a CPU run {cpu.images} images "
            f"of {cpu.num_images} in batches of {cpu.batch_size} (under a minute on 2 cores)."
        ),
    )
    parser.add_argument("--data", type=Path, help="existing dataset (annotations.json + images/)")
    parser.add_argument(
        "--num-images", type=positive_int,
        help=f"images to generate without --data (default {gpu.num_images} on a GPU, {cpu.num_images} on the CPU)",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="where generated datasets are kept (default ~/.cache/detaug/bench)"
    )
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                        help="default auto: the GPU when PyTorch and DALI see one")
    parser.add_argument("--batch-size", type=positive_int,
                        help=f"default {gpu.batch_size} on a GPU, {cpu.batch_size} on the CPU")
    parser.add_argument(
        "--workers", type=_non_negative_int,
        help=f"DataLoader workers of the CPU peers (default: CPUs - 1, {default_workers()} here)",
    )
    parser.add_argument("--threads", type=positive_int,
                        help=f"DALI CPU threads (default: CPUs, at most 8: {default_threads()} here)")
    parser.add_argument("--size", type=positive_int, default=512, help="output side in pixels (default 512)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only",
        help=f"comma-separated variants (default all): {','.join(VARIANT_NAMES)}",
    )
    parser.add_argument(
        "--images",
        type=positive_int,
        help=f"images timed per variant (default: on a GPU {gpu.epochs[0]} epochs for the DALI-based variants, "
        f"{gpu.epochs[1]} for the CPU peers; on the CPU {cpu.images})",
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        help=f"warm-up batches (default {gpu.warmup} on a GPU, {cpu.warmup} on the CPU; DataLoaders: "
        "at least one per worker)",
    )
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the results as JSON here")
    parser.add_argument("--check", action="store_true", help="exit with status 1 when a target check fails")
    parser.add_argument("--quiet", action="store_true", help="no progress messages")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def main(argv: Sequence[str] | None = None, *, debug: bool = False) -> int:
    """``detaug bench``; returns the exit status: 2 for a bad option or dataset (one line naming
    it; ``--debug`` adds the traceback), 1 with ``--check`` when a target fails."""
    from detaug.cli import run_guarded

    parser = build_parser()
    args = parser.parse_args(argv)
    debug = debug or args.debug
    if args.json_path is not None and args.json_path.is_dir():
        parser.error(f"--json {args.json_path}: is a folder; give a file name")

    def run() -> int:
        try:
            report = run_bench(
                data=args.data,
                num_images=args.num_images,
                cache_dir=args.cache_dir,
                device=args.device,
                batch_size=args.batch_size,
                workers=args.workers,
                threads=args.threads,
                size=args.size,
                seed=args.seed,
                only=args.only.split(",") if args.only else None,
                images=args.images,
                warmup=args.warmup,
                progress=not args.quiet,
                log=(lambda msg: None) if args.quiet else None,
            )
        except ValueError as exc:
            if debug:
                traceback.print_exc()
            parser.error(str(exc).splitlines()[0])  # one line, exit status 2
        print(report.format(), flush=True)
        if args.json_path is not None:
            args.json_path.parent.mkdir(parents=True, exist_ok=True)
            args.json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
            print(f"\nresults written to {args.json_path}")
        if args.check and any(c.passed is False for c in report.checks):
            return 1
        return 0

    return run_guarded(parser.prog, run, debug)
