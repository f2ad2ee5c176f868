"""Keras adapter: :class:`DetectionSequence`, an indexable ``PyDataset`` (``Sequence``) of
augmented detection batches, for ``model.fit(seq)``.

The package, one job a module:

* :mod:`detaug.keras.sequence`: the Keras face, :class:`DetectionSequence` (arguments, epochs,
  ``seq[i]``, errors), the only module that imports Keras;
* :mod:`detaug.keras.batches`: ``SequenceBatches``, how batch ``i`` is made (plan, pipeline,
  prefetch, targets), on the argument rules and bookkeeping shared with the PyTorch loader
  (:mod:`detaug.loader_core`);
* :mod:`detaug.keras.plan_ahead`: ``PlanAhead``, worker processes planning the batches of the
  current and the next epoch before they are asked for (also importable as ``detaug.keras.prefetch``,
  its former name: the same module);
* :mod:`detaug.keras.pipeline_queue`: ``PipelineQueue``, the DALI pipeline that Keras' ``workers``
  share, two batches at once, and the batches prefetched for a sequential reader;
* :mod:`detaug.keras.targets`: Keras box formats and the padded targets;
* :mod:`detaug.keras.flavor`: which Keras (Keras 3, or legacy ``tf_keras``), read from the
  environment when this package is first imported;
* :mod:`detaug.keras.data`: the same batches as a ``tf.data.Dataset`` or a Grain source.

Importing this package imports no Keras (nor torch): :class:`DetectionSequence` is loaded, with
its Keras base class, when it is first asked for (``from detaug.keras import DetectionSequence``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The names detaug/keras.py held, at the same place.
from detaug.keras.flavor import KERAS_FLAVOR, KERAS_FLAVOR_ENV, KERAS_FLAVORS  # noqa: F401
from detaug.keras.plan_ahead import PLAN_AHEAD_BATCHES, PLAN_AHEAD_DATA_BYTES  # noqa: F401
from detaug.keras.targets import (  # noqa: F401
    KERAS_BOX_FORMATS,
    OVERFLOW_POLICIES,
    PAD_VALUE,
    BoxOverflowWarning,
    to_keras_boxes,
)

if TYPE_CHECKING:
    from detaug.keras.sequence import DetectionSequence

__all__ = ["KERAS_BOX_FORMATS", "KERAS_FLAVOR", "BoxOverflowWarning", "DetectionSequence", "to_keras_boxes"]

_LAZY = {"DetectionSequence": "DetectionSequence", "_Base": "_Base"}  # name here -> name in detaug.keras.sequence


def __getattr__(name: str) -> Any:
    """``DetectionSequence`` (and its base class ``_Base``), imported with Keras on first use."""
    if name in _LAZY:
        from detaug.keras import sequence

        value = getattr(sequence, _LAZY[name])
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
