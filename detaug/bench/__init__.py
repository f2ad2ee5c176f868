"""``detaug bench``: the default detection recipe measured side by side in one run.

The recipe (IoU crop, flip, affine, resize, colour jitter, normalize; numbers in
:mod:`detaug.bench.recipe`) runs through detaug's PyTorch iterator and Keras Sequence, a
hand-written raw DALI pipeline (:mod:`detaug.bench.raw_dali`), and torchvision.transforms.v2 and
albumentations in DataLoaders (:mod:`detaug.bench.peers`), all on one COCO-style JPEG dataset
(:mod:`detaug.bench.dataset`). :mod:`detaug.bench.runner` times them with
:mod:`detaug.bench.harness`, prints img/s, ratios and the targets:

* detaug / raw DALI >= 0.9;
* detaug / faster CPU peer >= 20;
* Keras Sequence / PyTorch iterator >= 0.5.

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
