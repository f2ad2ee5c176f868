"""Which Keras :class:`~detaug.keras.DetectionSequence` is made for, and that Keras' pieces.

The choice is read from the environment once, when :mod:`detaug.keras` is first imported
(:data:`KERAS_FLAVOR`); nothing here imports Keras until the base class, the module or the
backend is asked for (:func:`keras_base`, :func:`keras_module`, :func:`keras_backend`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

__all__ = ["KERAS_FLAVOR", "KERAS_FLAVORS", "KERAS_FLAVOR_ENV", "keras_backend", "keras_base", "keras_module"]

#: Environment variable that picks the Keras class ``DetectionSequence`` subclasses, read when
#: :mod:`detaug.keras` is first imported: ``"keras"`` (Keras 3's ``PyDataset``), ``"tf_keras"``
#: (legacy Keras 2's ``tf_keras.utils.Sequence``, for ``fit_generator`` code) or ``"auto"``
#: (default: ``tf_keras`` when ``TF_USE_LEGACY_KERAS`` is set to ``1``/``true`` and tf-keras is
#: installed, as ``tf.keras`` then is; else Keras 3 when installed).
KERAS_FLAVOR_ENV = "DETAUG_KERAS"
KERAS_FLAVORS = ("auto", "keras", "tf_keras")


def _keras_flavor() -> str | None:
    """``"keras"`` (Keras 3), ``"tf_keras"`` (legacy Keras 2) or ``None`` (no Keras installed),
    from :data:`KERAS_FLAVOR_ENV` and ``TF_USE_LEGACY_KERAS`` (looks for the packages, imports neither)."""
    choice = os.environ.get(KERAS_FLAVOR_ENV, "auto").strip().lower() or "auto"
    if choice not in KERAS_FLAVORS:
        raise ImportError(f"{KERAS_FLAVOR_ENV}={choice!r}: expected one of {', '.join(KERAS_FLAVORS)}")
    has_tf_keras = importlib.util.find_spec("tf_keras") is not None
    if choice == "tf_keras":
        if not has_tf_keras:
            raise ImportError(f"{KERAS_FLAVOR_ENV}=tf_keras but tf-keras is not installed (pip install tf-keras)")
        return "tf_keras"
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
    if choice == "auto" and legacy and has_tf_keras:
        return "tf_keras"
    if importlib.util.find_spec("keras") is not None:
        return "keras"
    return None


#: The Keras the sequence is made for: ``"keras"``, ``"tf_keras"`` or ``None`` (no Keras).
KERAS_FLAVOR = _keras_flavor()


def keras_base() -> type:
    """``keras.utils.PyDataset`` (Keras 3), ``tf_keras.utils.Sequence`` (legacy Keras 2, see
    :data:`KERAS_FLAVOR_ENV`), or ``object`` when Keras is not installed (the classic protocol
    is then implemented by the sequence alone). Imports that Keras."""
    if KERAS_FLAVOR is None:
        return object
    if KERAS_FLAVOR == "tf_keras":
        import tf_keras

        return tf_keras.utils.Sequence
    try:
        import keras
    except ImportError as err:  # installed, but its backend is missing (TensorFlow by default)
        raise ImportError(
            f"keras is installed but cannot be imported ({err}); set KERAS_BACKEND to an "
            "installed backend before importing it, e.g. KERAS_BACKEND=torch"
        ) from err
    return getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence


def keras_module() -> Any:
    """The active Keras module (``keras`` or ``tf_keras``)."""
    return importlib.import_module("tf_keras" if KERAS_FLAVOR == "tf_keras" else "keras")


def keras_backend() -> str | None:
    """Keras' backend name, ``None`` without Keras (legacy Keras: ``"tensorflow"``)."""
    if KERAS_FLAVOR is None:
        return None
    if KERAS_FLAVOR == "tf_keras":
        return "tensorflow"
    import keras

    return keras.backend.backend()
