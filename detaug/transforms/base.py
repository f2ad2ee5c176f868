"""Base classes of detaug transforms and the registry used by recipe (de)serialisation."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np

from detaug.plan import PlanState
from detaug.seeds import SampleRandom

__all__ = ["Transform", "GeometricTransform", "PhotometricTransform", "TRANSFORMS", "register"]

#: Transform classes by name, for ``Compose.from_dict``.
TRANSFORMS: dict[str, type["Transform"]] = {}


def register(cls: type["Transform"]) -> type["Transform"]:
    """Class decorator: make ``cls`` available to recipes under its class name."""
    TRANSFORMS[cls.__name__] = cls
    return cls


def _plain(value: Any) -> Any:
    """Tuples and NumPy scalars to JSON/YAML-friendly lists and Python numbers."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class Transform:
    """A transform of images and their boxes.

    Subclasses store each ``__init__`` argument as an attribute of the same name, which is what
    ``to_dict`` serialises.
    """

    def to_dict(self) -> dict[str, Any]:
        """``{"name": class name, <init argument>: value, ...}`` (plain lists and numbers)."""
        params = inspect.signature(type(self).__init__).parameters
        out: dict[str, Any] = {"name": type(self).__name__}
        for name in params:
            if name != "self":
                out[name] = _plain(getattr(self, name))
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "name")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()  # type: ignore[union-attr]


class GeometricTransform(Transform):
    """A transform that moves pixels: one affine matrix per sample, applied to image and boxes.

    Class attributes describe how it combines with its neighbours when detaug fuses consecutive
    geometric transforms into one ``warp_affine``:

    * ``crops``: the output canvas may miss parts of the input canvas (crops, rotations);
    * ``reveals``: the output canvas may show points outside the input canvas, painted with
      ``fill`` (zoom-out, padding, rotations).

    A transform that ``reveals`` after one that ``crops`` starts a new warp, so that the area the
    crop removed is painted with ``fill`` exactly as when the two run one after the other.
    """

    crops: ClassVar[bool] = False
    reveals: ClassVar[bool] = False
    fill: float = 0

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        """Sample this transform's parameters for a batch, drawing from ``state.rand`` only.

        Every call must consume the same number of draws for every sample, whatever the
        others' data (see :mod:`detaug.seeds`): draw for all rows and select, or reserve a
        fixed block of positions.

        Returns ``(step [B, 3, 3] float64, canvas_hw [B, 2])``: the forward matrix from the
        current canvas to the new one, and the new canvas' ``(height, width)`` in pixels.
        """
        raise NotImplementedError


class PhotometricTransform(Transform):
    """A transform of pixel values only (boxes unchanged); runs after all geometric transforms."""

    #: Names of the per-sample float32 parameters ``plan`` returns, in order.
    param_names: ClassVar[tuple[str, ...]] = ()

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        """Per-sample parameters: one float32 ``[B]`` array per name in ``param_names``, drawn
        from ``rand`` (``B = rand.batch_size``) the same way for every sample."""
        return []

    def dali(self, images: Any, params: list[Any]) -> Any:
        """Add this transform's DALI operators to the graph; ``params`` are DataNodes."""
        raise NotImplementedError


def validate_range(
    name: str, value: Any, *, center: float | None = None, low: float | None = None
) -> tuple[float, float]:
    """Turn ``value`` (a number ``v`` or a pair) into a ``(min, max)`` pair.

    A single number ``v`` means ``(center - v, center + v)`` (``center`` given) and must be
    non-negative. ``low`` is the smallest allowed bound.
    """
    if isinstance(value, (int, float)):
        if center is None:
            raise ValueError(f"{name} must be a (min, max) pair, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} as a single number must be non-negative, got {value}")
        pair = (center - float(value), center + float(value))
    else:
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number or a (min, max) pair, got {value!r}") from None
        if lo > hi:
            raise ValueError(f"{name} must have min <= max, got ({lo}, {hi})")
        pair = (lo, hi)
    if low is not None and pair[0] < low:
        raise ValueError(f"{name} values must be >= {low}, got {value!r}")
    return pair


def validate_probability(p: float) -> float:
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"p must be between 0 and 1, got {p}")
    return float(p)


def validate_size(size: Any) -> tuple[int, int]:
    """``size`` as ``(height, width)``: an int means a square."""
    if isinstance(size, int):
        size = (size, size)
    try:
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size must be an int or a (height, width) pair, got {size!r}") from None
    if h <= 0 or w <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return h, w
