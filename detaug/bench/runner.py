"""``detaug bench``: every variant of the benchmarked recipes, side by side in one run.

Recipes (``--recipes default,yolo``, :data:`detaug.bench.recipe.RECIPES`): ``default`` (the default
detection recipe, every variant below) and ``yolo`` (``detaug.transforms.yolo_recipe``: Mosaic,
RandomPerspective, affine, letterbox 640, flip, MixUp, HSV; :data:`YOLO_VARIANTS`: the three
detaug iterators and ``albumentations-mosaic``). Rows carry their recipe; the decode limit is
measured once and shared; the YOLO rows also give the source images decoded per second (a mosaic
is made of 4 images, plus the MixUp partner of a blended sample).

Variants of the default recipe (``--only`` names):

* ``decode``: the decode limit: DALI reading and decoding the same files and nothing else, the
  best of a small sweep of decoder settings (:mod:`detaug.bench.decode`), its settings recorded;
* ``detaug``: ``detaug.torch.DetectionLoader`` (the PyTorch iterator) on a ``CocoSource``;
* ``detaug-list``: the same loader on the same JSON as a sample list;
* ``detaug-cpu``: the loader with ``device="cpu"`` (on a GPU run too: what a laptop gets; in a CPU
  run it is the ``detaug`` row, :func:`same_row`);
* ``sequence``: ``detaug.keras.DetectionSequence`` as ``model.fit(seq, shuffle=False)`` reads it
  (docs/keras.md): Keras' ``PyDatasetAdapter``, batches in order, the sequence's defaults (on a
  GPU with Keras' torch backend its images are torch tensors on the GPU);
* ``sequence-shuffled``: the same as ``fit(seq)`` reads it with Keras' default ``shuffle=True``
  (a random batch order: nothing is prepared ahead);
* ``sequence-numpy``: the batches in order with NumPy images on the host (Keras' own conversion of
  NumPy batches left out);
* ``raw-dali``: the same recipe hand-written in plain DALI (:mod:`detaug.bench.raw_dali`);
* ``torchvision``, ``albumentations``: the CPU peers in DataLoaders (:mod:`detaug.bench.peers`);
* ``torchvision-gpu``: torchvision.transforms.v2 on CUDA tensors, decoded by nvJPEG.

Of the YOLO recipe: ``detaug``, ``detaug-list``, ``detaug-cpu`` (the same loaders on
``yolo_recipe(size)``) and ``albumentations-mosaic`` (albumentations' Mosaic and its closest
transforms in a DataLoader, :func:`detaug.bench.peers.albumentations_mosaic_transform`).

Every variant runs at each batch size (``--batch-sizes``); each row gets its ratio to the decode
limit and to the best CPU peer, img/s per CPU core for the paths on the CPU, and its peak GPU
and host memory. ``--scaling`` adds rows at 0.3, 1, 4 and 12 megapixels and at batch 8, 32, 128
and 256.

Processing order: prepare the dataset (generated, or written from ``--data`` / ``--realdata``
into a temporary folder of links); run the peers first at every batch size (their workers fork
before DALI starts threads in this process), then the decode sweep, raw DALI, detaug and the
Sequence, each warmed up and timed by :func:`detaug.bench.harness.measure`; print the tables and
the target checks. A variant that cannot run (package missing, error) gets a row that says why,
and a missing peer the line that installs it without changing torch; the others still run.

Defaults fit the machine (:data:`DEFAULTS`): DALI threads and DataLoader workers from the CPUs
this process may use (:func:`~detaug.bench.harness.available_cpus`); on a GPU 2,048 images,
batches of 64 and 256, 10 epochs per DALI variant; on the CPU a short run (256 images, batch 16,
192 images per variant), longer with ``--images`` / ``--num-images`` / ``--batch-sizes``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from detaug.bench.dataset import (
    BenchDataset,
    prepare_dataset,
    realdata_folders,
    write_resized_dataset,
)
from detaug.bench.harness import (
    BenchSettings,
    Measurement,
    VariantUnavailable,
    adapter_cpu_use,
    available_cpus,
    cuda_available,
    default_threads,
    default_workers,
    format_table,
    measure,
)
from detaug.bench.peers import ALBUMENTATIONS_CROP_NOTE, ALBUMENTATIONS_MOSAIC_NOTE, PEERS_PIP
from detaug.bench.recipe import DEFAULT_SIZES, RECIPE_TITLES, RECIPES, peer_recipe, source_images_per_sample

if TYPE_CHECKING:
    from detaug.bench.train import TrainReport

__all__ = [
    "CHECKS",
    "DEFAULTS",
    "VARIANTS",
    "YOLO_CHECKS",
    "YOLO_VARIANTS",
    "BenchReport",
    "Check",
    "Variant",
    "VariantResult",
    "main",
    "run_bench",
]

Kind = Literal["limit", "detaug", "reference", "cpu-peer", "gpu-peer"]
RECIPE_TITLE = RECIPE_TITLES["default"]
#: 3: rows carry their ``recipe`` (two rows may share a variant name), ``source_img_per_s``,
#: ``sources_vs_decode`` and ``vs_default_recipe``; ``settings`` has ``recipes`` and ``sizes``.
SCHEMA = "detaug-bench/3"
#: The variants of the ``--scaling`` rows.
SCALING_VARIANTS = ("decode", "detaug")
DEFAULT_MEGAPIXELS = (0.3, 1.0, 4.0, 12.0)
DEFAULT_SCALING_BATCHES = (8, 32, 128, 256)


@dataclass(frozen=True)
class Variant:
    """One measured way of running the recipe.

    Attributes:
        name: ``--only`` name.
        label: table label.
        kind: ``"limit"`` (the decode sweep), ``"detaug"``, ``"reference"`` (raw DALI),
            ``"cpu-peer"`` (DataLoader peers, timed in whole waves of ``workers`` batches) or
            ``"gpu-peer"`` (torchvision on the GPU).
        factory: ``(dataset, settings) -> endless iterator of batches``; imported lazily from
            ``module:function`` so a missing optional package only affects its own row.
        note: printed next to the result (a GPU run's).
        cpu_note: the note of a CPU run, where it differs (:meth:`note_for`).
        runs_on: ``"device"`` (the run's device), ``"cpu"`` (always on the CPU: the CPU peers,
            ``detaug-cpu``) or ``"gpu"`` (only on a GPU).
        recipe: the recipe it runs (:data:`~detaug.bench.recipe.RECIPES`); ``None`` for the decode
            limit, which runs none and is shared by every recipe.
        blends: whether it runs the recipe's MixUp (``False``: a peer without one; the source
            images per sample leave the MixUp partner out).
        counterpart: the variant of the default recipe its ``vs_default_recipe`` ratio is taken
            against (a YOLO row; default: the same name).
    """

    name: str
    label: str
    kind: Kind
    factory: str
    note: str = ""
    cpu_note: str | None = None
    runs_on: Literal["device", "cpu", "gpu"] = "device"
    recipe: str | None = "default"
    blends: bool = True
    counterpart: str | None = None

    @property
    def sources_per_sample(self) -> float:
        """Source images read and decoded per output sample (1 for the default recipe and the
        decode limit; 4 plus the MixUp share for the YOLO recipe)."""
        if self.recipe is None:
            return 1.0
        return source_images_per_sample(self.recipe, mixup=self.blends)

    def note_for(self, device: str) -> str:
        """The note true to ``device`` (``"gpu"`` or ``"cpu"``)."""
        return self.cpu_note if device == "cpu" and self.cpu_note is not None else self.note

    def on_cpu(self, device: str) -> bool:
        """Whether this variant makes its images on the CPU in a run on ``device``."""
        return self.runs_on == "cpu" or (self.runs_on == "device" and device == "cpu")

    def batches(self, dataset: BenchDataset, settings: BenchSettings) -> Iterator:
        """The endless batches of the variant (``settings.recipe`` is its recipe)."""
        import importlib

        module, function = self.factory.split(":")
        return getattr(importlib.import_module(module), function)(dataset, settings)


# The notes state the adapters' defaults on each device (DetectionLoader: planning workers on a
# GPU, none on the CPU; DetectionSequence: 4 threads and images on the GPU, 1 thread and NumPy
# images on the CPU); tests/detaug/test_cli.py checks them against the adapters.
VARIANTS: tuple[Variant, ...] = (
    Variant(
        "decode",
        "decode limit (DALI)",
        "limit",
        "detaug.bench.decode:iter_decode",
        note="DALI's COCO reader + decoder only, best of the decoder sweep (settings in the JSON)",
        recipe=None,
    ),
    Variant(
        "detaug",
        "detaug iterator, COCO reader",
        "detaug",
        "detaug.bench.detaug_variants:iter_detaug",
        note="CocoSource (the JSON parsed once, then indexed); planning in worker processes",
        cpu_note="CocoSource (the JSON parsed once, then indexed); planning in the main process "
                 "(in a CPU run also the detaug-cpu row)",
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
        "detaug-cpu",
        "detaug iterator on the CPU",
        "detaug",
        "detaug.bench.detaug_variants:iter_detaug_cpu",
        note="DetectionLoader(device='cpu'): DALI's CPU operators, images on the host",
        runs_on="cpu",
    ),
    Variant(
        "sequence",
        "detaug Keras Sequence in fit",
        "detaug",
        "detaug.bench.detaug_variants:iter_sequence",
        note="Keras' fit(shuffle=False) data path: in order, the next batches prepared ahead; images on the GPU",
        cpu_note="Keras' fit(shuffle=False) data path: in order; NumPy images on the host",
    ),
    Variant(
        "sequence-shuffled",
        "detaug Keras Sequence, fit(shuffle=True)",
        "detaug",
        "detaug.bench.detaug_variants:iter_sequence_shuffled",
        note="Keras' fit(shuffle=True) data path: random order, each batch alone; no target",
        cpu_note="Keras' fit(shuffle=True) data path: random order; NumPy images on the host; no target",
    ),
    Variant(
        "sequence-numpy",
        "detaug Keras Sequence, NumPy",
        "detaug",
        "detaug.bench.detaug_variants:iter_sequence_numpy",
        note="in order, images_on_device=False: host arrays (Keras' NumPy-to-GPU copy not counted)",
        cpu_note="in order, without Keras' data adapter; NumPy images on the host",
    ),
    Variant("raw-dali", "raw DALI", "reference", "detaug.bench.raw_dali:iter_raw_dali",
            note="the same ops hand-written in one DALI pipeline",
            cpu_note="the same ops hand-written in one DALI pipeline (warp_affine and uint8 color_twist: "
                     "on the CPU detaug runs faster equivalents, docs/benchmarks.md)"),
    Variant("torchvision", "torchvision.transforms.v2", "cpu-peer", "detaug.bench.peers:iter_torchvision",
            runs_on="cpu"),
    Variant(
        "albumentations",
        "albumentations",
        "cpu-peer",
        "detaug.bench.peers:iter_albumentations",
        note=ALBUMENTATIONS_CROP_NOTE,
        runs_on="cpu",
    ),
    Variant("torchvision-gpu", "torchvision.transforms.v2 on the GPU", "gpu-peer",
            "detaug.bench.peers:iter_torchvision_gpu", runs_on="gpu"),
)
#: The variants of the YOLO-style recipe (``--recipes yolo``): the three iterators and
#: albumentations' Mosaic. Raw DALI, the Keras Sequence and torchvision run the default recipe only.
YOLO_VARIANTS: tuple[Variant, ...] = (
    Variant(
        "detaug",
        "detaug iterator, COCO reader",
        "detaug",
        "detaug.bench.detaug_variants:iter_detaug",
        note="yolo_recipe on a CocoSource, partners from it; planning in worker processes",
        cpu_note="yolo_recipe on a CocoSource, partners from it; planning in the main process "
                 "(in a CPU run also the detaug-cpu row)",
        recipe="yolo",
    ),
    Variant(
        "detaug-list",
        "detaug iterator, sample list",
        "detaug",
        "detaug.bench.detaug_variants:iter_detaug_list",
        note="yolo_recipe on a SampleListSource of the same files; planning in worker processes",
        cpu_note="yolo_recipe on a SampleListSource of the same files; planning in the main process",
        recipe="yolo",
    ),
    Variant(
        "detaug-cpu",
        "detaug iterator on the CPU",
        "detaug",
        "detaug.bench.detaug_variants:iter_detaug_cpu",
        note="yolo_recipe, DetectionLoader(device='cpu'): DALI's CPU operators, images on the host",
        runs_on="cpu",
        recipe="yolo",
    ),
    Variant(
        "albumentations-mosaic",
        "albumentations Mosaic",
        "cpu-peer",
        "detaug.bench.peers:iter_albumentations_mosaic",
        note=ALBUMENTATIONS_MOSAIC_NOTE,
        runs_on="cpu",
        recipe="yolo",
        blends=False,
        counterpart="albumentations",
    ),
)
#: The YOLO recipe with ``pool="batch"`` (``--recipes yolo-batch``): partners are batch-mates, each
#: photo decoded once; compared with the ``yolo`` recipe's albumentations Mosaic.
YOLO_BATCH_VARIANTS: tuple[Variant, ...] = tuple(
    replace(v, recipe="yolo-batch", note=v.note.replace("partners from it", "partners from the batch"),
            cpu_note=v.cpu_note and v.cpu_note.replace("partners from it", "partners from the batch"))
    for v in YOLO_VARIANTS if v.kind == "detaug"
)
VARIANT_NAMES = tuple(dict.fromkeys(v.name for v in (*VARIANTS, *YOLO_VARIANTS)))
#: Peers first: their DataLoader workers fork before DALI starts threads in this process.
PEER_ORDER = ("torchvision", "albumentations", "albumentations-mosaic", "torchvision-gpu")
RUN_ORDER = (
    *PEER_ORDER,
    "decode",
    "raw-dali",
    "detaug",
    "detaug-list",
    "detaug-cpu",
    "sequence",
    "sequence-shuffled",
    "sequence-numpy",
)


@dataclass
class VariantResult:
    """A table row: a measurement, or why there is none (``status`` ``"unavailable"`` or
    ``"error"``); ratios are filled in once every variant of its batch size has run.

    Attributes:
        cpu_cores: the CPU cores of a variant that makes its images on the CPU (DataLoader
            workers, or DALI threads, at most the CPUs available); ``None`` for GPU paths.
        description: what the variant runs with these settings (the peers' workers, decoder, recipe).
        extra: the decode variant's ``settings`` and ``sweep``.
        vs_default_recipe: a YOLO row's img/s over its counterpart's in the default recipe
            (:attr:`Variant.counterpart`), same batch size.
        sources_vs_decode: :attr:`source_images_per_second` over the decode limit.
        size: the output side it ran at.
    """

    variant: Variant
    status: Literal["ok", "unavailable", "error"]
    measurement: Measurement | None = None
    message: str = ""
    vs_raw_dali: float | None = None
    vs_cpu_peer: float | None = None
    vs_decode: float | None = None
    batch_size: int | None = None
    cpu_cores: int | None = None
    description: str = ""
    extra: dict = field(default_factory=dict)
    vs_default_recipe: float | None = None
    sources_vs_decode: float | None = None
    size: int | None = None

    @property
    def recipe(self) -> str | None:
        return self.variant.recipe

    @property
    def images_per_second(self) -> float | None:
        return self.measurement.images_per_second if self.measurement is not None else None

    @property
    def source_images_per_second(self) -> float | None:
        """Source images read and decoded per second: img/s times the variant's source images
        per sample (4 per mosaic, plus the MixUp partners; 1 for the default recipe)."""
        ips = self.images_per_second
        return None if ips is None else ips * self.variant.sources_per_sample

    @property
    def per_core(self) -> float | None:
        """img/s per CPU core (:attr:`cpu_cores`), for the variants on the CPU."""
        ips = self.images_per_second
        return ips / self.cpu_cores if ips is not None and self.cpu_cores else None

    def to_dict(self, device: str = "gpu") -> dict:
        m = self.measurement
        gpu_run = device == "gpu"
        on_cpu = self.variant.on_cpu(device)
        memory = {
            "gpu_peak_mib": m.gpu_peak_mib if m else None,
            "torch_peak_mib": m.torch_peak_mib if m else None,
            "gpu_mem_mib": m.gpu_mem_mib if m else None,
            "host_peak_rss_mib": m.host_peak_rss_mib if m else None,
            "gpu_note": (
                "no GPU in this run" if not gpu_run
                else "" if m else f"not measured ({self.status})"
            ),
        }
        row = {
            "variant": self.variant.name,
            "recipe": self.variant.recipe,
            "label": self.variant.label,
            "kind": self.variant.kind,
            "batch_size": self.batch_size,
            "device": "cpu" if on_cpu else "gpu",
            "status": self.status,
            "message": self.message,
            "note": self.variant.note_for(device),
            "runs": self.description,
            "images_per_second": self.images_per_second,
            "img_per_s": self.images_per_second,
            "vs_decode": self.vs_decode,
            "vs_best_cpu_peer": self.vs_cpu_peer,
            "vs_raw_dali": self.vs_raw_dali,
            "vs_default_recipe": self.vs_default_recipe,
            "size": self.size,
            "source_images_per_sample": self.variant.sources_per_sample,
            "source_img_per_s": self.source_images_per_second,
            "sources_vs_decode": self.sources_vs_decode,
            "cpu_cores": self.cpu_cores,
            "img_per_s_per_core": self.per_core,
            "memory": memory,
            "gpu_memory_note": memory["gpu_note"],
            "gpu_peak_mib": memory["gpu_peak_mib"],
            "gpu_mem_mib": memory["gpu_mem_mib"],
            "torch_peak_mib": memory["torch_peak_mib"],
            "host_peak_rss_mib": memory["host_peak_rss_mib"],
            "images": m.images if m else None,
            "batches": m.batches if m else None,
            "seconds": m.seconds if m else None,
            "warmup_seconds": m.warmup_seconds if m else None,
        }
        row.update(self.extra)
        return row


@dataclass(frozen=True)
class Check:
    """A target: ``numerator / denominator >= target`` in img/s (img/s per core with ``per_core``),
    the two rows of the recipes ``recipes`` (numerator's, denominator's) at one batch size; with
    ``memory_mib``, the numerator row's peak GPU memory above its start ``<= target`` MiB."""

    name: str
    numerator: str
    denominator: str  # a variant name, "cpu-peer" for the best CPU peer of the numerator's recipe; "" with memory_mib
    target: float
    per_core: bool = False
    recipes: tuple[str, str] = ("default", "default")
    memory_mib: bool = False  # instead: the numerator row's peak GPU memory (MiB) <= target
    gpu_only: bool = True  # a target of a GPU run: a CPU run prints its value and "n/a", never FAIL


#: The targets of a GPU run (issue 16); a CPU run prints their values with "n/a" (``gpu_only``),
#: all but the per-core one, whose two rows run on the CPU in every run.
CHECKS: tuple[Check, ...] = (
    Check("detaug (COCO reader) / decode limit", "detaug", "decode", 0.85),
    Check("detaug (sample list) / decode limit", "detaug-list", "decode", 0.85),
    Check("Sequence in fit / iterator (COCO reader)", "sequence", "detaug", 0.8),
    Check("Sequence in fit / iterator (sample list)", "sequence", "detaug-list", 0.8),
    Check("detaug (COCO reader) / best CPU peer", "detaug", "cpu-peer", 25.0),
    Check("detaug (sample list) / best CPU peer", "detaug-list", "cpu-peer", 25.0),
    Check("detaug (COCO reader) / torchvision v2 on the GPU", "detaug", "torchvision-gpu", 100.0),
    Check("detaug on the CPU / albumentations, per core", "detaug-cpu", "albumentations", 1.0, per_core=True,
          gpu_only=False),
    Check("Sequence in fit: peak GPU memory, MiB (no model)", "sequence", "", 4096.0, memory_mib=True),
)
#: The targets of the YOLO-style recipe (issue 11), evaluated when ``--recipes`` has ``yolo``.
YOLO_CHECKS: tuple[Check, ...] = (
    Check("YOLO recipe / default recipe, detaug (COCO reader)", "detaug", "detaug", 0.5, recipes=("yolo", "default")),
    Check("YOLO recipe: detaug (COCO reader) / albumentations Mosaic", "detaug", "albumentations-mosaic", 20.0,
          recipes=("yolo", "yolo")),
)


#: The same targets for the YOLO recipe with partners from the batch (``--recipes yolo-batch``).
YOLO_BATCH_CHECKS: tuple[Check, ...] = (
    Check("YOLO recipe, pool='batch' / default recipe, detaug (COCO reader)", "detaug", "detaug", 0.5,
          recipes=("yolo-batch", "default")),
    Check("YOLO recipe, pool='batch': detaug (COCO reader) / albumentations Mosaic", "detaug",
          "albumentations-mosaic", 20.0, recipes=("yolo-batch", "yolo")),
)


def checks_for(recipes: Sequence[str], device: str = "gpu") -> tuple[Check, ...]:
    """The checks of a run of ``recipes`` on ``device``: :data:`CHECKS` with the default recipe
    (less the GPU memory check in a CPU run), :data:`YOLO_CHECKS` with the YOLO one,
    :data:`YOLO_BATCH_CHECKS` with ``yolo-batch``."""
    default = tuple(c for c in CHECKS if device == "gpu" or not c.memory_mib)
    return (*(default if "default" in recipes else ()), *(YOLO_CHECKS if "yolo" in recipes else ()),
            *(YOLO_BATCH_CHECKS if "yolo-batch" in recipes else ()))


@dataclass
class CheckResult:
    """A check's value; ``applies=False`` where the target is not this run's (a GPU target in a
    CPU run): the value is shown, ``passed`` is ``None`` and the line says "n/a"."""

    check: Check
    value: float | None
    reason: str = ""
    batch_size: int | None = None
    applies: bool = True

    @property
    def passed(self) -> bool | None:
        if self.value is None or not self.applies:
            return None
        return self.value <= self.check.target if self.check.memory_mib else self.value >= self.check.target

    def line(self) -> str:
        c = self.check
        bound = f"target {'<=' if c.memory_mib else '>='} {c.target:g}"
        if self.value is None:
            return f"{c.name}: n/a ({self.reason}) ({bound})"
        verdict = "PASS" if self.passed else "FAIL" if self.applies else "n/a on the CPU"
        return f"{c.name} = {self.value:,.0f} ({bound}): {verdict}" if c.memory_mib else \
            f"{c.name} = {self.value:.2f} ({bound}): {verdict}"

    def to_dict(self) -> dict:
        return {
            "name": self.check.name,
            "batch_size": self.batch_size,
            "numerator": self.check.numerator,
            "denominator": self.check.denominator,
            "numerator_recipe": self.check.recipes[0],
            "denominator_recipe": self.check.recipes[1],
            "per_core": self.check.per_core,
            "memory_mib": self.check.memory_mib,
            "value": self.value,
            "target": self.check.target,
            "passed": self.passed,
            "applies": self.applies,
            "reason": self.reason,
        }


@dataclass
class BenchReport:
    """Everything ``detaug bench`` prints (:meth:`format`) and writes with ``--json``.

    The report of the first batch size; :attr:`more_runs` holds the reports of the others
    (same dataset and environment), :attr:`scaling` the ``--scaling`` rows. :attr:`results` holds
    the rows of every recipe of the run (:attr:`recipes`, output sides in :attr:`sizes`).
    """

    settings: BenchSettings
    dataset: BenchDataset
    environment: dict
    results: list[VariantResult]
    checks: list[CheckResult] = field(default_factory=list)
    images_requested: int | None = None
    images_per_variant: str = ""
    warmup: int | None = None
    more_runs: list[BenchReport] = field(default_factory=list)
    scaling: dict | None = None
    recipes: tuple[str, ...] = ("default",)
    sizes: dict[str, int] = field(default_factory=dict)
    rounds: int = 1

    def result(self, name: str, recipe: str = "default") -> VariantResult | None:
        """The row of variant ``name`` in ``recipe`` (the decode limit, shared, in any); in a CPU
        run ``detaug-cpu`` is the ``detaug`` row (:func:`same_row`)."""
        for wanted in dict.fromkeys((name, same_row(name, self.settings.device))):
            row = next((r for r in self.results if r.variant.name == wanted and r.recipe in (recipe, None)), None)
            if row is not None:
                return row
        return None

    def size_of(self, recipe: str) -> int:
        return self.sizes.get(recipe, self.settings.size)

    @property
    def runs(self) -> list[BenchReport]:
        """This report and :attr:`more_runs`: one per batch size, in the order run."""
        return [self, *self.more_runs]

    def decode(self) -> dict | None:
        """The decode limit of this batch size: ``img_per_s``, ``settings``, ``sweep``, or ``None``."""
        r = self.result("decode")
        if r is None:
            return None
        return {
            "batch_size": self.settings.batch_size,
            "status": r.status,
            "message": r.message,
            "img_per_s": r.images_per_second,
            "settings": r.extra.get("settings"),
            "sweep": r.extra.get("sweep", []),
        }

    def format(self) -> str:
        env, s = self.environment, self.settings
        gpu = s.device == "gpu"
        sizes = ", ".join(str(r.settings.batch_size) for r in self.runs)
        if tuple(self.recipes) == ("default",):
            title = f"default detection recipe ({RECIPE_TITLE.format(size=s.size)})"
            size_text = f"size {s.size}"
        else:
            title = "recipes " + "; ".join(
                f"{name} ({RECIPE_TITLES[name].format(size=self.size_of(name))})" for name in self.recipes)
            size_text = "size " + ", ".join(f"{self.size_of(name)} ({name})" for name in self.recipes)
        adapters = "" if s.adapter_threads else " (detaug rows: the adapters' own split, the JSON rows' description)"
        lines = [
            f"detaug bench: {title}",
            f"GPU: {env['gpu']} | CPUs: {env['cpus']} | "
            + " | ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
            (
                f"device {s.device} | batch {sizes} | DALI threads {s.threads}{adapters} | "
                f"DataLoader workers {s.workers} | {size_text} | seed {s.seed}"
            ),
            f"dataset: {self.dataset.describe()}",
        ]
        if self.images_per_variant:
            lines.append(
                f"timed: {self.images_per_variant} per variant after {self.warmup} warm-up batches"
                + ("" if gpu or self.images_requested else " (a short CPU run; --images N for a longer one)")
            )
        if self.rounds > 1:
            lines.append(f"rounds: {self.rounds}, the variants taking turns; each row but the peers' is its "
                         "median round (every round's img/s in the JSON)")
        for run in self.runs:
            lines += ["", f"batch {run.settings.batch_size}:"] if len(self.runs) > 1 else [""]
            lines += run._table()
        lines += ["", ("CPU peers are timed in whole waves of DataLoader workers; per core: img/s over "
                       "the DataLoader workers or DALI threads of the CPU paths (at most the CPUs here).")]
        described = {r.variant.name: r.description for r in self.results
                     if r.description and r.variant.kind in ("cpu-peer", "gpu-peer")}
        lines += [f"{name} runs: {text}" for name, text in described.items()]
        if "yolo" in self.recipes:
            lines.append(
                "src img/s: source images read and decoded per second, img/s times the images per sample "
                f"(YOLO: {source_images_per_sample('yolo'):g} for detaug, 4 mosaic tiles plus the MixUp "
                f"partners; {source_images_per_sample('yolo', mixup=False):g} for albumentations, which has "
                "no MixUp; detaug decodes only the visible part of each tile): compare it, not img/s, "
                "with the decode limit (one image each).")
        if "yolo-batch" in self.recipes:
            lines.append("yolo-batch: the YOLO recipe with Mosaic(pool='batch') and MixUp(pool='batch'): "
                         "partners are other samples of the batch, each photo decoded once (1 source image "
                         "per sample); its peer is albumentations' Mosaic of the yolo recipe.")
        lines += _missing_peer_lines([r for run in self.runs for r in run.results])
        if gpu:
            lines.append(
                "GPU MiB: the peak of device-wide GPU memory in use above the start of the variant "
                "(DALI's pools and decoders, PyTorch's cache), sampled every 50 ms."
            )
        if self.scaling:
            lines += ["", *_scaling_lines(self.scaling)]
        lines += ["", "checks" + ("" if gpu else " (the targets are for a GPU run)") + ":"]
        for run in self.runs:
            prefix = f"[batch {run.settings.batch_size}] " if len(self.runs) > 1 else ""
            lines += [f"  {prefix}{c.line()}" for c in run.checks]
        return "\n".join(lines)

    def _table(self) -> list[str]:
        """One row per result: with several recipes a ``recipe`` column; with the YOLO recipe
        the source images per second, their ratio to the decode limit and the ratio to the
        default recipe; on a GPU the GPU memory."""
        gpu = self.settings.device == "gpu"
        several = len(self.recipes) > 1
        yolo = any(r.startswith("yolo") for r in self.recipes)
        columns = ["variant", *(["recipe"] if several else []), "img/s",
                   *(["src img/s", "src vs decode", "vs default"] if yolo else []),
                   "vs decode", "vs best CPU", "per core", "images", "s", *(["GPU MiB"] if gpu else []), "note"]
        header = tuple(columns)
        rows = [header]
        for r in self.results:
            m = r.measurement
            lead = [r.variant.label, *([r.recipe or "-"] if several else [])]
            if m is None:
                rows.append((*lead,) + ("-",) * (len(header) - len(lead) - 1) + (f"{r.status}: {r.message}",))
                continue
            note = r.variant.note_for(self.settings.device)
            if r.variant.name == "decode" and r.extra.get("settings"):
                note = "best of the sweep: " + _settings_text(r.extra["settings"])
            src = r.source_images_per_second
            row = (
                *lead,
                f"{m.images_per_second:,.1f}",
                *([f"{src:,.1f}", _ratio(r.sources_vs_decode), _ratio(r.vs_default_recipe)] if yolo else []),
                _ratio(r.vs_decode),
                _ratio(r.vs_cpu_peer),
                "-" if r.per_core is None else f"{r.per_core:,.1f}",
                str(m.images),
                f"{m.seconds:.2f}",
                *(["-" if m.gpu_peak_mib is None else f"{m.gpu_peak_mib:,.0f}"] if gpu else []),
                note,
            )
            rows.append(row)
        return format_table(rows)

    def to_dict(self) -> dict:
        s = self.settings
        runs = [
            {
                "batch_size": run.settings.batch_size,
                "decode": run.decode(),
                "results": [r.to_dict(s.device) for r in run.results],
                "checks": [c.to_dict() for c in run.checks],
            }
            for run in self.runs
        ]
        return {
            "schema": SCHEMA,
            "settings": {
                "device": s.device,
                "batch_size": s.batch_size,
                "batch_sizes": [run.settings.batch_size for run in self.runs],
                "workers": s.workers,
                "threads": s.threads,
                "size": s.size,
                "recipes": list(self.recipes),
                "sizes": {name: self.size_of(name) for name in self.recipes},
                "seed": s.seed,
                "images_requested": self.images_requested,
                "warmup": self.warmup,
                "rounds": self.rounds,
                "cpus": available_cpus(),
                "decoder_defaults": _decoder_defaults(s.device),
            },
            "environment": self.environment,
            "dataset": self.dataset.to_dict(),
            "decode": runs[0]["decode"],
            "results": [row for run in runs for row in run["results"]],
            "checks": [c for run in runs for c in run["checks"]],
            "runs": runs,
            "scaling": self.scaling,
        }


def _decoder_defaults(device: str) -> dict:
    """What detaug's loaders decode with by default here (:mod:`detaug.decoding`)."""
    from detaug.decoding import decoder_options, default_num_threads

    try:
        options = decoder_options(device == "gpu")
    except ValueError as exc:  # a bad DETAUG_HW_DECODER_LOAD
        options = {"error": str(exc)}
    return {"decoder_options": options, "num_threads": default_num_threads()}


def _settings_text(settings: dict) -> str:
    parts = []
    if settings.get("hw_decoder_load") is not None:
        parts.append(f"hw_decoder_load {settings['hw_decoder_load']:g}")
    threads = settings["num_threads"]
    parts.append(f"{threads} thread" + ("" if threads == 1 else "s"))
    parts.append("window decoding" if settings.get("window") else "whole images")
    return ", ".join(parts)


def _scaling_lines(scaling: dict) -> list[str]:
    lines = ["scaling (img/s):"]
    for row in scaling.get("megapixels", []):
        ips = row["img_per_s"]
        rate = "-" if ips is None else f"{ips:,.1f} img/s ({ips * row['megapixels']:,.1f} MP/s)"
        lines.append(f"  {row['megapixels']:g} MP ({row['size_wh'][0]}x{row['size_wh'][1]}), batch "
                     f"{row['batch_size']}, {row['variant']}: {rate}" + (f" {row['message']}" if row["message"] else ""))
    for row in scaling.get("batch", []):
        ips = row["img_per_s"]
        rate = "-" if ips is None else f"{ips:,.1f} img/s"
        lines.append(f"  batch {row['batch_size']}, {row['variant']}: {rate}" + (f" {row['message']}" if row["message"] else ""))
    return lines


def _missing_peer_lines(results: list[VariantResult]) -> list[str]:
    """How to install each peer that was unavailable, without changing the installed torch."""
    missing = {r.variant.name for r in results if r.variant.kind in ("cpu-peer", "gpu-peer") and r.status == "unavailable"
               and "CUDA GPU" not in r.message}
    lines = []
    if missing & {"albumentations", "albumentations-mosaic"}:
        lines.append(f"albumentations missing: {PEERS_PIP} (from the detaug clone; it leaves torch as it is)")
    if missing & {"torchvision", "torchvision-gpu"}:
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
        batch_size: images per batch (the first of ``batch_sizes``).
        warmup: warm-up batches per variant.
        images: images timed per variant; ``None``: ``epochs`` epochs of the dataset.
        epochs: ``(DALI-based, CPU peers)`` epochs timed when ``images`` is ``None``.
        batch_sizes: the batch sizes every variant runs at.
        scaling_images: images timed per ``--scaling`` row.
        scaling_unique: distinct photos resized for each megapixel row.
    """

    num_images: int
    batch_size: int
    warmup: int
    images: int | None = None
    epochs: tuple[int, int] = (1, 1)
    batch_sizes: tuple[int, ...] = ()
    scaling_images: int = 4096
    scaling_unique: int = 32


#: A GPU run is the full run of docs/benchmarks.md; a CPU run is short (under a minute on 2
#: cores with every variant, 192 images timed each: fewer move the ratios by a fifth;
#: ``images=`` / ``--images`` for a longer one).
DEFAULTS: dict[str, Defaults] = {
    "gpu": Defaults(num_images=2048, batch_size=64, warmup=5, epochs=(10, 2), batch_sizes=(64, 256)),
    "cpu": Defaults(num_images=256, batch_size=16, warmup=2, images=192, batch_sizes=(16,),
                    scaling_images=32, scaling_unique=8),
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
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    images_dir: str | os.PathLike[str] | None = None,
    allow_paths_outside: bool = False,
    repeat_to: int | None = None,
    num_images: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    device: Literal["auto", "gpu", "cpu"] | None = None,
    batch_size: int | None = None,
    batch_sizes: Sequence[int] | None = None,
    workers: int | None = None,
    threads: int | None = None,
    size: int | None = None,
    seed: int = 0,
    only: Sequence[str] | None = None,
    recipes: Sequence[str] | None = None,
    images: int | None = None,
    peer_images: int | None = None,
    warmup: int | None = None,
    rounds: int = 1,
    scaling: bool = False,
    megapixels: Sequence[float] | None = None,
    scaling_batch_sizes: Sequence[int] | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    train: bool = False,
    steps: int | None = None,
) -> BenchReport | TrainReport:
    """Run the selected variants on one dataset at each batch size and return the report.

    Every ``None`` takes the default of the device (:data:`DEFAULTS`) or of the machine.

    Args:
        data: what :func:`detaug.bench.dataset.prepare_dataset` takes: a folder with
            ``annotations.json`` + ``images/``, a Pascal VOC folder, a COCO JSON file (its images
            in ``images_dir``) or a list of VOC folders; ``None`` generates (once, cached)
            ``num_images`` synthetic JPEGs.
        images_dir: the images folder of a COCO JSON ``data``.
        allow_paths_outside: accept ``file_name`` entries of a COCO JSON ``data`` that leave
            ``images_dir`` (``--allow-paths-outside``; docs/security.md).
        repeat_to: repeat the images of ``data`` to this many (written as links in a temporary
            folder, removed at the end).
        device: ``"gpu"``, ``"cpu"``, or ``None``/``"auto"``: the GPU when CUDA is available.
        batch_size: one batch size (the same as ``batch_sizes=[batch_size]``).
        batch_sizes: every variant runs at each; default 64 and 256 on a GPU, 16 on the CPU.
        workers, threads: DataLoader workers of the peers, DALI threads; by default from the
            CPUs available (:func:`~detaug.bench.harness.default_workers`, ``default_threads``).
        size: output side of every recipe; ``None``: each recipe's own
            (:data:`~detaug.bench.recipe.DEFAULT_SIZES`: 512 for the default recipe, 640 for YOLO).
        only: variant names (:data:`VARIANT_NAMES`), applied to every recipe; all by default.
        recipes: the recipes measured side by side (:data:`~detaug.bench.recipe.RECIPES`; default
            ``["default"]``): each runs its variants (:data:`VARIANTS`, :data:`YOLO_VARIANTS`); the
            decode limit runs once for all.
        images: images timed per variant (and per sweep setting of ``decode``). ``None``: on the
            GPU 10 epochs for the DALI-based variants and 2 for the peers; on the CPU 192 images.
            DataLoader peers round up to whole waves of ``workers`` batches.
        peer_images: images timed per peer (CPU DataLoaders, torchvision on the GPU) instead of
            ``images``: the peers are 20 to 300 times slower, so fewer of their images time as well.
        warmup: warm-up batches (the DataLoader peers take at least one wave, ``workers``).
        rounds: every variant but the peers is timed this many times, the variants taking turns
            (all of them once per round, at every batch size); each row is the round with the
            median img/s (the lower of the middle two for an even count), and lists every
            round's img/s (``rounds`` in the JSON row). Machines whose pace drifts (shared hosts)
            then give ratios that a single slow or fast moment does not decide. The decode
            limit sweeps its settings in the first round and times the best one in the others.
        scaling: add the megapixel rows (``megapixels``, default 0.3, 1, 4, 12) and batch rows
            (``scaling_batch_sizes``, default 8, 32, 128, 256) for :data:`SCALING_VARIANTS`.
        log: progress messages (default: stderr).
        train: time a detector's training loop on each loader instead
            (:func:`detaug.bench.train.run_train_bench`: a :class:`~detaug.bench.train.TrainReport`;
            ``warmup`` and ``steps`` are its steps, ``only`` its rows, ``size`` its input side).

    Raises:
        ValueError: bad arguments or dataset, or ``device="gpu"`` without CUDA.
    """
    log = log if log is not None else (lambda msg: print(msg, file=sys.stderr, flush=True))
    device = pick_bench_device(device)
    if train:
        from detaug.bench.train import run_train_bench

        ignored = [flag for flag, given in (
            ("--recipes", recipes is not None and list(_recipes(recipes)) != ["default"]), ("--images", images),
            ("--peer-images", peer_images), ("--rounds", rounds != 1), ("--scaling", scaling),
            ("--megapixels", megapixels), ("--scaling-batch-sizes", scaling_batch_sizes)) if given]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: not for --train (its rows: the default recipe, --warmup and "
                             "--steps steps)")

        return run_train_bench(
            data=data, images_dir=images_dir, repeat_to=repeat_to, num_images=num_images, cache_dir=cache_dir,
            device=device, batch_sizes=_batch_sizes(batch_size, batch_sizes, DEFAULTS[device]) if (
                batch_size is not None or batch_sizes is not None) else None,
            workers=workers, threads=threads, size=size, seed=seed, only=only, warmup=warmup, steps=steps,
            progress=progress, log=log)
    if steps is not None:
        raise ValueError("--steps is a number of training steps: give it with --train")
    defaults = DEFAULTS[device]
    sizes = _batch_sizes(batch_size, batch_sizes, defaults)
    recipes = _recipes(recipes)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"--size should be a positive int, got {size!r}")
    recipe_sizes = {name: DEFAULT_SIZES[name] if size is None else size for name in RECIPES}
    base = BenchSettings(
        device=device,
        batch_size=sizes[0],
        workers=default_workers() if workers is None else workers,
        threads=default_threads() if threads is None else threads,
        adapter_threads=threads,
        size=recipe_sizes["default"],
        seed=seed,
    )
    selected = _select(only)
    planned = _planned(selected, recipes, device)
    if not planned:
        raise ValueError(f"--only {','.join(sorted(selected))}: none of them runs the recipes {','.join(recipes)}")
    if images is not None and (isinstance(images, bool) or not isinstance(images, int) or images < 1):
        raise ValueError(f"--images should be a positive int, got {images!r}")
    warmup = defaults.warmup if warmup is None else warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"--warmup should be an int >= 1, got {warmup!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"--rounds should be an int >= 1, got {rounds!r}")
    num_images = defaults.num_images if num_images is None else num_images
    megapixels = tuple(DEFAULT_MEGAPIXELS if megapixels is None else megapixels)
    scaling_sizes = tuple(DEFAULT_SCALING_BATCHES if scaling_batch_sizes is None else scaling_batch_sizes)
    if any(mp <= 0 for mp in megapixels) or any(b < 1 for b in scaling_sizes):
        raise ValueError("--megapixels should be > 0 and --scaling-batch-sizes >= 1")

    work = tempfile.mkdtemp(prefix="detaug-bench-")
    try:
        dataset = prepare_dataset(
            data, images_dir=images_dir, allow_paths_outside=allow_paths_outside, repeat_to=repeat_to, work_dir=work,
            num_images=num_images, cache_dir=cache_dir, seed=seed, progress=progress,
        )
        log(f"dataset: {dataset.describe()}")
        runner = _Runner(dataset, defaults, images, warmup, log, peer_images)
        if any(v.kind in ("cpu-peer", "gpu-peer") for v in planned):
            _warn_about_shared_memory(replace(base, batch_size=max(sizes), size=max(recipe_sizes.values())), log)
        trials: dict[int, dict[tuple[str | None, str], list[VariantResult]]] = {b: {} for b in sizes}
        peers = [v for v in planned if v.name in PEER_ORDER]
        others = [v for v in planned if v.name not in PEER_ORDER]
        for phase, times in ((peers, 1), (others, rounds)):
            for round_ in range(times):
                if times > 1:
                    log(f"round {round_ + 1} of {times}")
                for b in sizes:
                    for variant in phase:
                        settings = replace(base, batch_size=b, recipe=variant.recipe or "default",
                                           size=recipe_sizes[variant.recipe or "default"])
                        earlier = trials[b].setdefault((variant.recipe, variant.name), [])
                        result = runner.run(variant, settings, decode_configs=_best_decode_config(earlier))
                        result.size = settings.size if variant.recipe is not None else None
                        earlier.append(result)
        results = {b: {key: _median_round(runs) for key, runs in by_key.items()} for b, by_key in trials.items()}
        reports = []
        environment = _environment(device)
        for b in sizes:
            ordered = [results[b][(v.recipe, v.name)] for v in _all_variants() if (v.recipe, v.name) in results[b]]
            _fill_ratios(ordered)
            report = BenchReport(
                rounds=rounds,
                settings=replace(base, batch_size=b),
                dataset=dataset,
                environment=environment,
                results=ordered,
                images_requested=images,
                images_per_variant=runner.per_variant,
                warmup=warmup,
                recipes=recipes,
                sizes={name: recipe_sizes[name] for name in recipes},
            )
            report.checks = [_evaluate(c, report) for c in checks_for(recipes, device)]
            reports.append(report)
        main_report = reports[0]
        main_report.more_runs = reports[1:]
        if scaling:  # the default recipe's detaug iterator and the decode limit
            main_report.scaling = _run_scaling(runner, base, main_report, megapixels, scaling_sizes, Path(work))
        return main_report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _batch_sizes(batch_size: int | None, batch_sizes: Sequence[int] | None, defaults: Defaults) -> tuple[int, ...]:
    if batch_size is not None and batch_sizes is not None:
        raise ValueError("give --batch-size or --batch-sizes, not both")
    sizes = tuple(batch_sizes) if batch_sizes is not None else (batch_size,) if batch_size is not None else (
        defaults.batch_sizes or (defaults.batch_size,))
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch sizes should be positive ints, got {list(sizes)}")
    return tuple(dict.fromkeys(sizes))


def _variant(name: str, recipe: str = "default") -> Variant:
    return next(v for v in _all_variants() if v.name == name and v.recipe in (recipe, None))


def _all_variants() -> tuple[Variant, ...]:
    """Every variant in report order: the default recipe's (the decode limit first), then the YOLO
    recipe's."""
    return (*VARIANTS, *YOLO_VARIANTS, *YOLO_BATCH_VARIANTS)


def _recipes(recipes: Sequence[str] | None) -> tuple[str, ...]:
    """The recipes asked for, in :data:`RECIPES` order, without repeats; ``None``: the default."""
    if recipes is None:
        return ("default",)
    if isinstance(recipes, str):
        recipes = [recipes]
    names = {n.strip() for n in recipes if n and n.strip()}
    unknown = names - set(RECIPES)
    if unknown or not names:
        raise ValueError(f"unknown recipe(s) {sorted(unknown)}; choose from {', '.join(RECIPES)}")
    return tuple(n for n in RECIPES if n in names)


def same_row(name: str, device: str) -> str:
    """The variant whose row measures ``name`` in a run on ``device``: in a CPU run ``detaug-cpu``
    is ``detaug`` (the same ``DetectionLoader(CocoSource, device="cpu")``, one row for both);
    else ``name``."""
    return "detaug" if name == "detaug-cpu" and device == "cpu" else name


def _planned(selected: set[str], recipes: Sequence[str], device: str = "gpu") -> list[Variant]:
    """The variants to run, in :data:`RUN_ORDER` (peers first), each recipe's after the other's:
    the selected names among the variants of ``recipes``, the decode limit once for all; no
    two that measure the same loader on ``device`` (:func:`same_row`)."""
    selected = {same_row(name, device) for name in selected}
    chosen = [v for v in _all_variants() if v.name in selected and (v.recipe is None or v.recipe in recipes)]
    rank = {name: k for k, name in enumerate(RUN_ORDER)}
    return sorted(chosen, key=lambda v: (rank[v.name], RECIPES.index(v.recipe or "default")))


class _Runner:
    """Runs variants on one dataset with the run's image counts and warm-up."""

    def __init__(self, dataset: BenchDataset, defaults: Defaults, images: int | None, warmup: int,
                 log: Callable[[str], None], peer_images: int | None = None) -> None:
        self.dataset, self.defaults, self.images, self.warmup, self.log = dataset, defaults, images, warmup, log
        self.peer_images = peer_images
        if images is not None:
            self.per_variant = f"{images} images" + (f", peers {peer_images}" if peer_images else "")
        elif defaults.images is not None:
            self.per_variant = f"{defaults.images} images"
        else:
            self.per_variant = (f"{defaults.epochs[0]} epochs ({defaults.epochs[0] * dataset.num_images} images), "
                                f"peers {defaults.epochs[1]}")

    def count(self, variant: Variant, dataset: BenchDataset | None = None) -> int:
        if self.peer_images is not None and variant.kind in ("cpu-peer", "gpu-peer"):
            return self.peer_images
        if self.images is not None:
            return self.images
        return _default_images(variant, self.defaults, dataset or self.dataset)

    def run(self, variant: Variant, settings: BenchSettings, dataset: BenchDataset | None = None,
            decode_configs: list | None = None) -> VariantResult:
        dataset = dataset or self.dataset
        count = self.count(variant, dataset)
        self.log(f"running {variant.label}, batch {settings.batch_size} ({count} images) ...")
        if variant.name == "decode":
            result = _run_decode(variant, dataset, settings, count, self.warmup, self.log, decode_configs)
        else:
            result = _run_variant(variant, dataset, settings, count, self.warmup, self.log)
        if result.measurement is not None:
            self.log(f"  {result.measurement.images_per_second:,.1f} img/s")
        else:
            self.log(f"  {result.status}: {result.message}")
        return result


def _cores(variant: Variant, settings: BenchSettings, threads: int | None = None) -> int | None:
    """CPU cores of a variant that makes its images on the CPU: its DataLoader workers (the main
    process with none), or its DALI threads; at most the CPUs available."""
    if not variant.on_cpu(settings.device):
        return None
    if variant.kind == "cpu-peer":
        used = max(settings.workers, 1)
    elif variant.kind == "detaug" and not threads:
        used, _ = adapter_cpu_use(variant.name, settings)
    else:
        used = threads or settings.threads
    return max(1, min(used, available_cpus()))


def _describe(variant: Variant, settings: BenchSettings) -> str:
    """What ``variant`` runs with ``settings`` (the peers: loader, decoder, recipe; the DALI
    variants: threads and decoder options); ``""`` for a GPU-only peer in a CPU run."""
    if variant.runs_on == "gpu" and settings.device != "gpu":
        return ""
    if variant.kind in ("cpu-peer", "gpu-peer"):
        from detaug.bench.peers import peer_description

        return peer_description(variant.name, settings)
    if variant.kind == "limit":
        return "DALI readers.coco + decoders.image / image_slice; the sweep's best setting"
    from detaug.decoding import decoder_options

    on_gpu = not variant.on_cpu(settings.device)
    try:
        options = decoder_options(on_gpu)
    except ValueError as exc:
        options = {"error": str(exc)}
    decoder = ", ".join(f"{k}={v}" for k, v in options.items()) or "DALI's CPU decoder"
    if variant.kind == "detaug":
        threads, workers = adapter_cpu_use(variant.name, settings)
        return f"{threads} DALI threads beside {workers} planning workers; decoder {decoder}"
    return f"{settings.threads} DALI threads; decoder {decoder}"


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
    peer = variant.kind in ("cpu-peer", "gpu-peer")
    epochs = defaults.epochs[1] if peer else defaults.epochs[0]
    return epochs * dataset.num_images


def _run_variant(
    variant: Variant,
    dataset: BenchDataset,
    settings: BenchSettings,
    images: int,
    warmup: int,
    log: Callable[[str], None],
    batches: Iterator | None = None,
    threads: int | None = None,
) -> VariantResult:
    peer = variant.kind == "cpu-peer"
    quantum = max(settings.workers, 1) if peer else 1
    warmup_batches = max(warmup, quantum) if peer else warmup
    common = {
        "batch_size": settings.batch_size,
        "cpu_cores": _cores(variant, settings, threads),
        "description": _describe(variant, settings),
    }
    try:
        m = measure(
            batches if batches is not None else variant.batches(dataset, settings),
            images=images,
            warmup_batches=warmup_batches,
            batch_quantum=quantum,
            device=settings.device,
        )
    except VariantUnavailable as exc:
        return VariantResult(variant, "unavailable", message=str(exc), **common)
    except Exception as exc:  # noqa: BLE001 - one broken variant must not end the whole run
        log("".join(traceback.format_exception(exc)).rstrip())
        return VariantResult(variant, "error", message=f"{type(exc).__name__}: {exc}".splitlines()[0], **common)
    return VariantResult(variant, "ok", measurement=m, **common)


def _run_decode(
    variant: Variant,
    dataset: BenchDataset,
    settings: BenchSettings,
    images: int,
    warmup: int,
    log: Callable[[str], None],
    configs: list | None = None,
) -> VariantResult:
    """The decode variant: every setting of the sweep (or ``configs``) timed; the row is the
    best, with ``extra = {"settings": ..., "sweep": [...]}``."""
    from detaug.bench.decode import iter_decode, recipe_crops_first, sweep_configs

    if configs is None:
        configs = sweep_configs(settings.device, settings.threads, window=recipe_crops_first())
    sweep, best, best_config = [], None, None
    for config in configs:
        r = _run_variant(variant, dataset, settings, images, warmup, log,
                         batches=iter_decode(dataset, settings, config=config), threads=config.num_threads)
        entry = {"settings": config.to_dict(), "img_per_s": r.images_per_second, "status": r.status,
                 "message": r.message}
        sweep.append(entry)
        log(f"  {config.label()}: " + (f"{r.images_per_second:,.1f} img/s" if r.measurement else f"{r.status}: {r.message}"))
        if r.measurement is not None and (best is None or r.images_per_second > best.images_per_second):
            best, best_config = r, config
    if best is None:
        failed = sweep[0] if sweep else {"status": "error", "message": "no decoder setting to try"}
        return VariantResult(variant, failed["status"], message=failed["message"], batch_size=settings.batch_size,
                             extra={"settings": None, "sweep": sweep})
    best.extra = {"settings": {**best_config.to_dict(), "device": "mixed" if settings.device == "gpu" else "cpu"},
                  "sweep": sweep}
    return best


def _best_decode_config(earlier: list[VariantResult]) -> list | None:
    """The decode setting a later round times: the best of the first round's sweep (``None``:
    sweep, in the first round or where it found none)."""
    from detaug.bench.decode import DecodeConfig

    chosen = earlier[0].extra.get("settings") if earlier else None
    return [DecodeConfig.from_dict(chosen)] if chosen else None


def _median_round(runs: list[VariantResult]) -> VariantResult:
    """The row of a variant timed ``len(runs)`` times: the round with the median img/s (the lower
    middle one of an even count), with every round's img/s in ``extra["rounds"]``; a decode row
    keeps the first round's ``settings`` and ``sweep``. One round: that row, as it is."""
    if len(runs) == 1:
        return runs[0]
    timed = sorted((r for r in runs if r.measurement is not None), key=lambda r: r.images_per_second)
    if not timed:
        return runs[0]
    row = timed[(len(timed) - 1) // 2]
    row.extra = {**runs[0].extra, "rounds": [r.images_per_second if r.measurement is not None else None for r in runs]}
    return row


def _fill_ratios(results: list[VariantResult]) -> None:
    """Each row's ratios (same batch size): to the decode limit (img/s, and source images per
    second), to raw DALI (rows of the default recipe, which raw DALI runs), to the best CPU peer
    of the row's recipe, and a YOLO row's to its counterpart in the default recipe."""
    raw = next((r.images_per_second for r in results if r.variant.name == "raw-dali" and r.measurement), None)
    limit = next((r.images_per_second for r in results if r.variant.name == "decode" and r.measurement), None)
    default_rates = {r.variant.name: r.images_per_second for r in results if r.recipe == "default" and r.measurement}
    for r in results:
        ips = r.images_per_second
        if ips is None:
            continue
        best_peer = _best_cpu_peer(results, peer_recipe(r.recipe or "default"))
        r.vs_raw_dali = ips / raw if raw and r.recipe in ("default", None) else None
        r.vs_decode = ips / limit if limit else None
        r.sources_vs_decode = r.source_images_per_second / limit if limit else None
        r.vs_cpu_peer = ips / best_peer if best_peer else None
        if r.recipe not in ("default", None):
            counterpart = default_rates.get(r.variant.counterpart or r.variant.name)
            r.vs_default_recipe = ips / counterpart if counterpart else None


def _best_cpu_peer(results: list[VariantResult], recipe: str = "default") -> float | None:
    """The img/s of the fastest CPU peer of ``recipe``, or ``None``."""
    rates = [r.images_per_second for r in results
             if r.variant.kind == "cpu-peer" and r.recipe == recipe and r.measurement]
    return max(rates) if rates else None


def _evaluate(check: Check, report: BenchReport) -> CheckResult:
    """``check`` on ``report``'s rows; a GPU target (``check.gpu_only``) in a CPU run keeps its
    value but does not apply (its line says "n/a", ``--check`` ignores it)."""
    result = _check_value(check, report)
    result.applies = not check.gpu_only or report.settings.device == "gpu"
    return result


def _check_value(check: Check, report: BenchReport) -> CheckResult:
    batch = report.settings.batch_size
    top_recipe, bottom_recipe = check.recipes
    top = report.result(check.numerator, top_recipe)
    if top is None or top.measurement is None:
        return CheckResult(check, None, _why_missing(check.numerator, top, top_recipe), batch)
    if check.memory_mib:
        if top.measurement.gpu_peak_mib is None:
            return CheckResult(check, None, "no GPU memory figure (a CPU run)", batch)
        return CheckResult(check, top.measurement.gpu_peak_mib, batch_size=batch)
    if check.denominator == "cpu-peer":
        bottom = _best_cpu_peer(report.results, peer_recipe(top_recipe))
        if bottom is None:
            return CheckResult(check, None, "no CPU peer measured", batch)
        return CheckResult(check, top.images_per_second / bottom, batch_size=batch)
    other = report.result(check.denominator, bottom_recipe)
    if other is None or other.measurement is None:
        return CheckResult(check, None, _why_missing(check.denominator, other, bottom_recipe), batch)
    if check.per_core:
        if top.per_core is None or other.per_core is None:
            return CheckResult(check, None, "no per-core figure", batch)
        return CheckResult(check, top.per_core / other.per_core, batch_size=batch)
    return CheckResult(check, top.images_per_second / other.images_per_second, batch_size=batch)


def _why_missing(name: str, result: VariantResult | None, recipe: str = "default") -> str:
    label = name if recipe == "default" else f"{name} ({recipe} recipe)"
    if result is None:
        return f"{label} not run"
    return f"{label} {result.status}"


def _run_scaling(
    runner: _Runner,
    base: BenchSettings,
    report: BenchReport,
    megapixels: Sequence[float],
    batch_sizes: Sequence[int],
    work: Path,
) -> dict:
    """The ``--scaling`` rows: :data:`SCALING_VARIANTS` on the photos resized to each of
    ``megapixels`` (at the first batch size), and on the bench dataset at each of ``batch_sizes``.
    The decode variant runs at the best setting of the main sweep (no new sweep)."""
    from detaug.bench.decode import DecodeConfig

    decode = report.decode()
    best = [DecodeConfig.from_dict(decode["settings"])] if decode and decode.get("settings") else None
    defaults = runner.defaults
    count = runner.images if runner.images is not None else defaults.scaling_images

    def row(variant: Variant, settings: BenchSettings, dataset: BenchDataset) -> VariantResult:
        if variant.name == "decode" and best is None:
            return VariantResult(variant, "unavailable", message="the decode variant did not run")
        runner.log(f"scaling: {variant.label}, batch {settings.batch_size}, {dataset.max_size[0]}x{dataset.max_size[1]} ...")
        if variant.name == "decode":
            return _run_decode(variant, dataset, settings, count, runner.warmup, runner.log, best)
        return _run_variant(variant, dataset, settings, count, runner.warmup, runner.log)

    mp_rows, batch_rows = [], []
    for mp in megapixels:
        try:
            resized = write_resized_dataset(report.dataset, mp, work / f"mp-{mp:g}",
                                            max_unique=defaults.scaling_unique,
                                            num_images=max(report.dataset.num_images, base.batch_size))
        except Exception as exc:  # noqa: BLE001 - a row that says why
            mp_rows += [{"megapixels": mp, "size_wh": [0, 0], "batch_size": base.batch_size, "variant": name,
                         "img_per_s": None, "status": "error", "message": f"{type(exc).__name__}: {exc}"}
                        for name in SCALING_VARIANTS]
            continue
        for name in SCALING_VARIANTS:
            r = row(_variant(name), base, resized)
            mp_rows.append({"megapixels": mp, "size_wh": list(resized.max_size), "batch_size": base.batch_size,
                            "variant": name, "img_per_s": r.images_per_second, "status": r.status,
                            "message": r.message})
    for b in batch_sizes:
        for name in SCALING_VARIANTS:
            r = row(_variant(name), replace(base, batch_size=b), report.dataset)
            batch_rows.append({"batch_size": b, "variant": name, "img_per_s": r.images_per_second,
                               "status": r.status, "message": r.message})
    return {"variants": list(SCALING_VARIANTS), "images_per_row": count, "megapixels": mp_rows, "batch": batch_rows}


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
    from detaug.cli_support import OneLineParser, int_at_least, positive_int

    gpu, cpu = DEFAULTS["gpu"], DEFAULTS["cpu"]
    parser = OneLineParser(
        prog=prog,
        description=(
            "Measure the default detection recipe (IoU crop, flip, affine, resize, colour jitter, "
            "normalize; --recipes default,yolo adds the YOLO-style recipe beside it) through detaug's PyTorch iterator (GPU and CPU) and Keras Sequence, a "
            "hand-written raw DALI pipeline, torchvision.transforms.v2 / albumentations in "
            "DataLoaders and torchvision v2 on the GPU, against the decode limit (DALI decoding "
            "alone, best of a sweep of decoder settings), on one COCO-style JPEG dataset; print "
            "img/s, ratios, per-core figures, memory and the target checks. Defaults fit the "
            f"machine: {default_threads()} DALI threads and {default_workers()} DataLoader workers "
            f"here ({available_cpus()} CPUs); a GPU run times {gpu.epochs[0]} epochs of "
            f"{gpu.num_images} images at batch {' and '.join(map(str, gpu.batch_sizes))}, a CPU run "
            f"{cpu.images} images of {cpu.num_images} at batch {cpu.batch_size}. "
            "`detaug bench --startup ...` measures start-up instead (its own --help)."
        ),
    )
    parser.add_argument(
        "--data", type=Path,
        help="what you have: a folder with annotations.json + images/, a Pascal VOC folder "
        "(Annotations/, JPEGImages/), or a COCO JSON file (its images in --images-dir); default: "
        "a generated synthetic dataset",
    )
    parser.add_argument("--images-dir", type=Path,
                        help="images folder of a COCO JSON --data (default: images/ next to it, else its folder)")
    parser.add_argument("--allow-paths-outside", action="store_true",
                        help="accept file_name entries of a COCO JSON --data that are absolute or leave its images "
                             "folder (default: an error naming them; docs/security.md)")
    parser.add_argument(
        "--realdata", type=Path, metavar="DIR",
        help="every Pascal VOC folder directly under DIR, merged (e.g. ../shared/realdata); instead of --data",
    )
    parser.add_argument("--repeat-to", type=positive_int, metavar="N",
                        help="repeat the images of --data / --realdata to N (links, no copies), so small sets time well")
    parser.add_argument(
        "--num-images", type=positive_int,
        help=f"images to generate without --data (default {gpu.num_images} on a GPU, {cpu.num_images} on the CPU)",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="where generated datasets are kept (default ~/.cache/detaug/bench)"
    )
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                        help="default auto: the GPU when PyTorch and DALI see one")
    parser.add_argument("--batch-size", type=positive_int, help="one batch size (as --batch-sizes N)")
    parser.add_argument(
        "--batch-sizes", type=_int_list, metavar="B1,B2",
        help=f"every variant at each (default {','.join(map(str, gpu.batch_sizes))} on a GPU, "
        f"{','.join(map(str, cpu.batch_sizes))} on the CPU)",
    )
    parser.add_argument(
        "--workers", type=int_at_least(0),
        help=f"DataLoader workers of the peers (default: one per CPU, {default_workers()} here)",
    )
    parser.add_argument("--threads", type=positive_int,
                        help=f"DALI CPU threads (default: CPUs / LOCAL_WORLD_SIZE, at most 16: {default_threads()} here)")
    parser.add_argument(
        "--size", type=positive_int,
        help="output side in pixels of every recipe (default: " + ", ".join(
            f"{v} for {k}" for k, v in DEFAULT_SIZES.items()) + ")",
    )
    parser.add_argument(
        "--recipe", "--recipes", dest="recipes", action="append", type=_recipe_list, metavar="NAME[,NAME]",
        help=f"the recipes measured side by side in one run, repeatable or comma-separated: "
        f"{', '.join(RECIPES)} (default: default). yolo: detaug's yolo_recipe (Mosaic, RandomPerspective, "
        "affine, letterbox, flip, MixUp, HSV) through the three detaug iterators and albumentations' "
        "Mosaic in a DataLoader (albumentations-mosaic); rows and checks are labelled by recipe",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only",
        help=f"comma-separated variants (default all): {','.join(VARIANT_NAMES)}",
    )
    parser.add_argument(
        "--images",
        type=positive_int,
        help=f"images timed per variant and decoder setting (default: on a GPU {gpu.epochs[0]} epochs for the "
        f"DALI-based variants, {gpu.epochs[1]} for the peers; on the CPU {cpu.images})",
    )
    parser.add_argument(
        "--peer-images",
        type=positive_int,
        help="images timed per peer (torchvision, albumentations, their GPU and Mosaic rows) instead of --images",
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        help=f"warm-up batches (default {gpu.warmup} on a GPU, {cpu.warmup} on the CPU; DataLoaders: "
        "at least one per worker)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="time every variant but the peers N times, taking turns, and report each one's median round "
        "(default 1; 3 on machines whose pace drifts)",
    )
    parser.add_argument("--scaling", action="store_true",
                        help="add img/s rows at several megapixels and batch sizes (decode limit and detaug)")
    parser.add_argument("--megapixels", type=_float_list, metavar="MP1,MP2",
                        help=f"megapixels of --scaling (default {','.join(f'{m:g}' for m in DEFAULT_MEGAPIXELS)})")
    parser.add_argument("--scaling-batch-sizes", type=_int_list, metavar="B1,B2",
                        help=f"batch sizes of --scaling (default {','.join(map(str, DEFAULT_SCALING_BATCHES))})")
    from detaug.bench.train import TRAIN_DEFAULTS, TRAIN_ROW_NAMES, TRAIN_SIZE

    tg, tc = TRAIN_DEFAULTS["gpu"], TRAIN_DEFAULTS["cpu"]
    parser.add_argument(
        "--train", action="store_true",
        help=f"instead: time a fast detector's training loop (ResNet-18 trunk, 1x1 head, {TRAIN_SIZE}x{TRAIN_SIZE}) "
        "fed by each loader, against the same steps on one cached batch (img/s, ratio, data wait, CPU cores, GPU "
        f"memory); --warmup / --steps its steps (default {tg.warmup} / {tg.steps} on a GPU at batch "
        f"{','.join(map(str, tg.batch_sizes))}, {tc.warmup} / {tc.steps} on the CPU at batch "
        f"{','.join(map(str, tc.batch_sizes))}), --only its rows ({','.join(TRAIN_ROW_NAMES)}); per rank with "
        "DDP under torchrun",
    )
    parser.add_argument("--steps", type=positive_int, help="timed training steps of --train")
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the results as JSON here")
    parser.add_argument("--check", action="store_true", help="exit with status 1 when a target check fails")
    parser.add_argument("--quiet", action="store_true", help="no progress messages")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def _recipe_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in RECIPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown recipe(s) {unknown or [text]}; choose from {', '.join(RECIPES)}")
    return names


def _positive_list(convert: Callable[[str], float], noun: str) -> Callable[[str], list]:
    """An argparse ``type``: a comma-separated list of positive ``convert``-ed values (``noun``
    names them in the errors)."""
    def parse(text: str) -> list:
        try:
            values = [convert(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list of {noun}: {text!r}") from None
        if not values or any(not v > 0 for v in values):
            raise argparse.ArgumentTypeError(f"should be positive {noun}, got {text!r}")
        return values

    return parse


_int_list = _positive_list(int, "integers")
_float_list = _positive_list(float, "numbers")


def _startup(argv: list[str]) -> int:
    """``detaug bench --startup ...``: :func:`detaug.bench.startup.main` with the other arguments."""
    try:
        from detaug.bench import startup
    except ModuleNotFoundError as exc:
        if exc.name not in ("detaug.bench.startup",):
            raise
        print("detaug bench: error: --startup needs detaug/bench/startup.py, which this install does not have",
              file=sys.stderr)
        return 2
    return int(startup.main([a for a in argv if a != "--startup"]) or 0)


def main(argv: Sequence[str] | None = None, *, debug: bool = False) -> int:
    """``detaug bench``; returns the exit status: 2 for a bad option or dataset (one line naming
    it; ``--debug`` adds the traceback), 1 with ``--check`` when a target fails. With
    ``--startup``, :func:`detaug.bench.startup.main` runs instead."""
    from detaug.cli_support import log_to_stderr, run_guarded

    argv = list(sys.argv[1:] if argv is None else argv)
    log_to_stderr()  # also for python -m detaug.bench
    if "--startup" in argv:
        return _startup(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = debug or args.debug
    if args.json_path is not None and args.json_path.is_dir():
        parser.error(f"--json {args.json_path}: is a folder; give a file name")
    if args.realdata is not None and args.data is not None:
        parser.error("give --data or --realdata, not both")

    def run() -> int:
        try:
            data = realdata_folders(args.realdata) if args.realdata is not None else args.data
            report = run_bench(
                data=data,
                images_dir=args.images_dir,
                allow_paths_outside=args.allow_paths_outside,
                repeat_to=args.repeat_to,
                num_images=args.num_images,
                cache_dir=args.cache_dir,
                device=args.device,
                batch_size=args.batch_size,
                batch_sizes=args.batch_sizes,
                workers=args.workers,
                threads=args.threads,
                size=args.size,
                seed=args.seed,
                only=args.only.split(",") if args.only else None,
                recipes=[n for group in args.recipes for n in group] if args.recipes else None,
                images=args.images,
                peer_images=args.peer_images,
                warmup=args.warmup,
                rounds=args.rounds,
                scaling=args.scaling,
                megapixels=args.megapixels,
                scaling_batch_sizes=args.scaling_batch_sizes,
                progress=not args.quiet,
                log=(lambda msg: None) if args.quiet else None,
                train=args.train,
                steps=args.steps,
            )
        except ValueError as exc:
            if debug:
                traceback.print_exc()
            parser.error(str(exc).splitlines()[0])  # one line, exit status 2
        if getattr(report, "rank", 0) != 0:  # under torchrun rank 0 prints and writes for all
            return 0
        print(report.format(), flush=True)
        if args.json_path is not None:
            args.json_path.parent.mkdir(parents=True, exist_ok=True)
            args.json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
            print(f"\nresults written to {args.json_path}")
        if args.check and any(c.passed is False for run in report.runs for c in run.checks):
            return 1
        return 0

    return run_guarded(parser.prog, run, debug)
