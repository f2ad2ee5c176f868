"""The variants ``detaug bench`` measures (:data:`VARIANTS` of the default recipe,
:data:`YOLO_VARIANTS` of the YOLO recipe, :data:`MASKS_VARIANTS` of the masks recipe), the order
they run in, ``--only``'s names, and
:class:`VariantResult`, the table row each one gives. What each variant is:
:mod:`detaug.bench.runner`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from detaug.bench.albumentations_peers import ALBUMENTATIONS_CROP_NOTE, ALBUMENTATIONS_MOSAIC_NOTE
from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, Measurement
from detaug.bench.recipe import source_images_per_sample


Kind = Literal["limit", "detaug", "reference", "cpu-peer", "gpu-peer"]


#: The variants of the ``--scaling`` rows.
SCALING_VARIANTS = ("decode", "detaug")


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
    Variant("torchvision", "torchvision.transforms.v2", "cpu-peer",
            "detaug.bench.torchvision_peers:iter_torchvision",
            runs_on="cpu"),
    Variant(
        "albumentations",
        "albumentations",
        "cpu-peer",
        "detaug.bench.albumentations_peers:iter_albumentations",
        note=ALBUMENTATIONS_CROP_NOTE,
        runs_on="cpu",
    ),
    Variant("torchvision-gpu", "torchvision.transforms.v2 on the GPU", "gpu-peer",
            "detaug.bench.torchvision_peers:iter_torchvision_gpu", runs_on="gpu"),
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
        "detaug.bench.albumentations_peers:iter_albumentations_mosaic",
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
#: The default recipe with an instance mask per box (``--recipes masks``; :mod:`detaug.bench.mask_data`):
#: the COCO-reader iterators, on the device and on the CPU; no peer (none of them moves masks here).
MASKS_VARIANTS: tuple[Variant, ...] = tuple(
    replace(v, recipe="masks", note=f"{v.note_for('gpu')}; masks=True: an ellipse mask per box, in the targets",
            cpu_note=v.cpu_note and f"{v.cpu_note}; masks=True: an ellipse mask per box, in the targets")
    for v in VARIANTS if v.name in ("detaug", "detaug-cpu")
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


def _variant(name: str, recipe: str = "default") -> Variant:
    return next(v for v in _all_variants() if v.name == name and v.recipe in (recipe, None))


def _all_variants() -> tuple[Variant, ...]:
    """Every variant in report order: the default recipe's (the decode limit first), then the YOLO
    recipes', then the masks recipe's."""
    return (*VARIANTS, *YOLO_VARIANTS, *YOLO_BATCH_VARIANTS, *MASKS_VARIANTS)


def same_row(name: str, device: str) -> str:
    """The variant whose row measures ``name`` in a run on ``device``: in a CPU run ``detaug-cpu``
    is ``detaug`` (the same ``DetectionLoader(CocoSource, device="cpu")``, one row for both);
    else ``name``."""
    return "detaug" if name == "detaug-cpu" and device == "cpu" else name


def _select(only: Sequence[str] | None) -> set[str]:
    if only is None:
        return set(VARIANT_NAMES)
    names = {n.strip() for n in only if n.strip()}
    unknown = names - set(VARIANT_NAMES)
    if unknown or not names:
        raise ValueError(f"unknown variant(s) {sorted(unknown)}; choose from {', '.join(VARIANT_NAMES)}")
    return names
