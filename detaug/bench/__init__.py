"""``detaug bench``: the default detection recipe measured side by side in one run.

The recipe (IoU crop, flip, affine, resize, colour jitter, normalize; numbers in
:mod:`detaug.bench.recipe`) runs through detaug's PyTorch iterator (on the GPU and on the CPU)
and Keras Sequence, a hand-written raw DALI pipeline (:mod:`detaug.bench.raw_dali`),
torchvision.transforms.v2 and albumentations in DataLoaders and torchvision v2 on the GPU
(:mod:`detaug.bench.peers`), against the decode limit (:mod:`detaug.bench.decode`: DALI decoding
alone, best of a sweep of decoder settings), all on one COCO-style JPEG dataset made from what
the user has (:mod:`detaug.bench.dataset`), at each batch size. :mod:`detaug.bench.runner` times
them with :mod:`detaug.bench.harness`, prints img/s, ratios, per-core figures, memory and the
targets (GPU run):

* both DetectionLoader paths / decode limit >= 0.85;
* Keras Sequence in fit / PyTorch iterator >= 0.8;
* detaug / best CPU peer >= 25; detaug / torchvision v2 on the GPU >= 100;
* detaug on the CPU / albumentations, per core >= 1.

``detaug bench --train`` (:mod:`detaug.bench.train`) times a fast detector's training loop fed by
each loader instead, against the same steps on one cached batch.

Use ``detaug bench --help`` (or ``python -m detaug.bench``), or :func:`run_bench` from Python.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHECKS", "DEFAULTS", "VARIANTS", "BenchReport", "main", "run_bench"]


def __getattr__(name: str) -> Any:
    """The runner's names, imported on first use (it imports torch; ``detaug --help`` and the
    harness's CPU count do not need it)."""
    if name in __all__:
        from detaug.bench import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'detaug.bench' has no attribute {name!r}")
