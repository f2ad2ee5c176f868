"""The rows of ``detaug bench --train`` (:data:`TRAIN_ROWS`, ``--only`` names), the order they run
in and their defaults by device (:data:`TRAIN_DEFAULTS`). What each row is:
:mod:`detaug.bench.train`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


#: Input side of the training rows.
TRAIN_SIZE = 320
#: Timed steps of the torchvision row at most: it runs at a few percent of the ceiling (221 img/s
#: against 4,753 on an H100, issue 37), where 600 steps of 256 images would take 12 minutes.
PEER_STEPS = 100
RowKind = Literal["ceiling", "iterator", "keras-ceiling", "keras", "peer"]


@dataclass(frozen=True)
class TrainDefaults:
    """``batch_sizes``, ``warmup`` steps and timed ``steps`` of ``--train`` on a device."""

    batch_sizes: tuple[int, ...]
    warmup: int
    steps: int


#: A GPU run: the issue's 20 warm-up and 600 timed steps at batch 64 and 256; the CPU: a few steps
#: of a few images (about a minute on 2 cores with every row).
TRAIN_DEFAULTS: dict[str, TrainDefaults] = {
    "gpu": TrainDefaults(batch_sizes=(64, 256), warmup=20, steps=600),
    "cpu": TrainDefaults(batch_sizes=(2,), warmup=1, steps=2),
}


@dataclass(frozen=True)
class TrainRow:
    """A row of ``--train``: ``name`` (``--only``), ``label``, ``kind``, ``note``; ``ceiling``: the
    row its ratio is taken against."""

    name: str
    label: str
    kind: RowKind
    note: str
    ceiling: str = "ceiling"


TRAIN_ROWS: tuple[TrainRow, ...] = (
    TrainRow("ceiling", "ceiling (one cached batch)", "ceiling",
             "the same steps on one batch kept on the device: the model alone"),
    TrainRow("detaug", "detaug iterator, COCO reader", "iterator",
             "DetectionLoader(CocoSource), its defaults; targets moved per sample"),
    TrainRow("detaug-list", "detaug iterator, sample list", "iterator",
             "DetectionLoader(SampleListSource), its defaults; targets moved per sample"),
    TrainRow("detaug-cuda-decoder", "detaug iterator, CUDA decoder", "iterator",
             "DetectionLoader(CocoSource, hw_decoder_load=0.0): Huffman decoding on DALI's CPU threads, for "
             "a GPU-bound step (docs/loader.md); an option, not checked; a GPU run only"),
    TrainRow("detaug-process", "detaug iterator, loader in its own process", "iterator",
             "DetectionLoader(CocoSource, feed_process=True): the loader in a child process; on a GPU it "
             "needs NVIDIA MPS (the note says whether an MPS daemon was found); an option, not checked"),
    TrainRow("ceiling-padded", "ceiling, padded targets (one cached batch)", "ceiling",
             "the same steps on one batch of padded targets kept on the device", ceiling="ceiling-padded"),
    TrainRow("detaug-padded", "detaug iterator, padded targets", "iterator",
             "DetectionLoader(CocoSource, targets='padded'): [B, M, 4] boxes", ceiling="ceiling-padded"),
    TrainRow("keras-ceiling", "Keras ceiling (one cached batch)", "keras-ceiling",
             "the same network in Keras (torch backend) in fit on one cached batch", ceiling="keras-ceiling"),
    TrainRow("sequence", "detaug Keras Sequence in fit", "keras",
             "model.fit(DetectionSequence, shuffle=False), the sequence's defaults", ceiling="keras-ceiling"),
    TrainRow("torchvision", "torchvision.transforms.v2, DataLoader", "peer",
             f"DataLoader workers = CPUs of the rank; pinned images, targets moved per sample; "
             f"at most {PEER_STEPS} timed steps"),
)
TRAIN_ROW_NAMES = tuple(row.name for row in TRAIN_ROWS)
#: Run order: the DataLoader peer first (its workers fork before DALI starts threads here).
TRAIN_RUN_ORDER = ("torchvision", "ceiling", "detaug", "detaug-list", "detaug-cuda-decoder", "detaug-process",
                   "ceiling-padded", "detaug-padded", "keras-ceiling", "sequence")


def selected_rows(only: Sequence[str] | None) -> set[str]:
    """The row names ``only`` selects (``None``: all); ``ValueError`` for an unknown one."""
    selected = set(TRAIN_ROW_NAMES) if only is None else {n.strip() for n in only if n.strip()}
    unknown = selected - set(TRAIN_ROW_NAMES)
    if unknown or not selected:
        raise ValueError(f"unknown training row(s) {sorted(unknown)}; choose from {', '.join(TRAIN_ROW_NAMES)}")
    return selected
