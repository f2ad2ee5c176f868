"""The decode limit: DALI reading and decoding the bench dataset, and nothing else.

No augmentation pipeline can deliver images faster than DALI decodes them, so ``detaug bench``
measures that rate first and gives every variant's ratio to it. The ``decode`` variant is the
best of a small sweep (:func:`sweep_configs`) of one pipeline (:func:`build_decode_pipeline`)::

    readers.coco (the same files, shuffled)
      -> [window] random_bbox_crop with the recipe's IoU-crop settings (the window the plan needs)
      -> decoders.image_slice (window) / decoders.image (whole image), device "mixed" on a GPU

over

* ``hw_decoder_load`` in (0.0, 0.65, 0.8, 0.99) on a GPU (the share of JPEGs for the hardware
  decoder where the GPU has one; 0.65 is DALI's default, 0.8 the loaders'; nothing on the CPU);
* DALI threads: the bench's threads and half of them;
* window decoding (``window=True``) where the recipe's first geometric step crops (the default
  recipe's IoU crop), as detaug decodes only the region its plan needs; whole images otherwise.

The batches are not copied anywhere: each ``pipe.run()`` returns DALI's outputs (on the GPU for
``mixed``), and the harness's CUDA synchronization closes the timed window.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings
from detaug.bench.recipe import RecipeSpec
from detaug.decoding import DALI_HW_DECODER_LOAD, HW_DECODER_LOAD

__all__ = [
    "GPU_LOADS",
    "DecodeConfig",
    "DecodedBatch",
    "build_decode_pipeline",
    "iter_decode",
    "recipe_crops_first",
    "sweep_configs",
]

#: ``hw_decoder_load`` values the GPU sweep tries: no hardware decoder, DALI's default, the
#: loaders' default (:data:`detaug.decoding.HW_DECODER_LOAD`), nearly all.
GPU_LOADS: tuple[float, ...] = tuple(sorted({0.0, DALI_HW_DECODER_LOAD, HW_DECODER_LOAD, 0.99}))


@dataclass(frozen=True)
class DecodeConfig:
    """One decoder setting of the sweep.

    Attributes:
        num_threads: DALI CPU threads.
        window: decode the IoU-crop window only (``image_slice``), else the whole image.
        hw_decoder_load: the hardware decoder's share on a GPU; ``None`` on the CPU.
    """

    num_threads: int
    window: bool
    hw_decoder_load: float | None = None

    def to_dict(self) -> dict:
        return {"hw_decoder_load": self.hw_decoder_load, "num_threads": self.num_threads, "window": self.window}

    @classmethod
    def from_dict(cls, settings: dict) -> DecodeConfig:
        """The setting :meth:`to_dict` wrote (other keys, such as a report's ``device``, ignored)."""
        return cls(num_threads=settings["num_threads"], window=settings["window"],
                   hw_decoder_load=settings.get("hw_decoder_load"))

    def label(self) -> str:
        parts = [] if self.hw_decoder_load is None else [f"hw_decoder_load {self.hw_decoder_load:g}"]
        parts += [f"{self.num_threads} thread" + ("" if self.num_threads == 1 else "s"),
                  "window" if self.window else "whole image"]
        return ", ".join(parts)


@dataclass(frozen=True)
class DecodedBatch:
    """What the decode variant yields per batch: its image count (``shape[0]``), for the harness."""

    shape: tuple[int]


def recipe_crops_first(recipe=None) -> bool:
    """Whether the first geometric transform of ``recipe`` (default: the default detection
    recipe) is a crop (``RandomIoUCrop``, ``RandomResizedCrop``): then a loader decodes only the
    window its plan needs, and so does the decode limit."""
    if recipe is None:
        from detaug.transforms import default_detection_recipe

        recipe = default_detection_recipe()
    geometric = list(getattr(recipe, "geometric", []))
    return bool(geometric) and "Crop" in type(geometric[0]).__name__


def sweep_configs(device: str, threads: int, *, window: bool) -> list[DecodeConfig]:
    """The sweep: threads ``threads`` and ``threads // 2`` (distinct, at least 1), whole-image
    decoding and, with ``window``, window decoding; on a GPU each with every :data:`GPU_LOADS`."""
    counts = sorted({max(1, threads // 2), max(1, threads)})
    windows = (False, True) if window else (False,)
    loads: Sequence[float | None] = GPU_LOADS if device == "gpu" else (None,)
    return [DecodeConfig(t, w, load) for load in loads for t in counts for w in windows]


def build_decode_pipeline(dataset: BenchDataset, settings: BenchSettings, config: DecodeConfig,
                          spec: RecipeSpec | None = None):
    """The built decode pipeline for ``config`` (see the module docstring); one output: the
    decoded uint8 HWC RGB images."""
    from nvidia.dali import fn, pipeline_def, types

    spec = spec if spec is not None else RecipeSpec(size=settings.size)
    gpu = settings.device == "gpu"
    options = {} if config.hw_decoder_load is None else {"hw_decoder_load": config.hw_decoder_load}

    @pipeline_def(
        batch_size=settings.batch_size,
        num_threads=config.num_threads,
        device_id=0 if gpu else None,
        seed=settings.seed,
        prefetch_queue_depth=2,
    )
    def decode_pipeline():
        jpegs, boxes, labels = fn.readers.coco(
            file_root=str(dataset.images_dir),
            annotations_file=str(dataset.annotations_file),
            ltrb=True,
            ratio=True,
            skip_empty=True,
            random_shuffle=True,
            name="Reader",
        )
        device = "mixed" if gpu else "cpu"
        if not config.window:
            return fn.decoders.image(jpegs, device=device, output_type=types.RGB, **options)
        anchor, shape, _, _ = spec.dali_random_bbox_crop(boxes, labels)
        return fn.decoders.image_slice(jpegs, anchor, shape, device=device, output_type=types.RGB, **options)

    pipe = decode_pipeline()
    pipe.build()
    return pipe


def iter_decode(dataset: BenchDataset, settings: BenchSettings, *, config: DecodeConfig) -> Iterator[DecodedBatch]:
    """The decode variant at ``config``: endless :class:`DecodedBatch` es, one per ``pipe.run()``."""
    pipe = build_decode_pipeline(dataset, settings, config)
    try:
        while True:
            (images,) = pipe.run()
            yield DecodedBatch((len(images),))
    finally:
        del pipe
