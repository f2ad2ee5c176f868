"""Parameters and parameter helpers that several transform families share.

One definition each, imported by the families that use them (``affine``, ``perspective``, ``pad``,
``crop``, ``resize``): a family module imports none of the others (tests/test_layers.py).
Coordinates: padding is in whole pixels, ``(left, top, right, bottom)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from detaug.transforms.schema import Param

if TYPE_CHECKING:
    from detaug.transforms.base import Transform

__all__ = ["FILL", "PADDING_DOC", "PADDING_MODE", "ScalarOrList", "padding_ltrb", "whole_numbers"]

#: ``fill`` of the warps: the grey level painted where the output shows no input pixel.
FILL = Param("fill", "number", 0, "grey level (0-255) painted where the output shows no input pixel", low=0, high=255)

#: torchvision's ``padding`` argument: an int (all sides), [left/right, top/bottom] or
#: [left, top, right, bottom], in whole pixels.
PADDING_DOC = "pixels added: p (every side), [left/right, top/bottom] or [left, top, right, bottom]"

#: ``padding_mode``: only torchvision's default is possible here (see :mod:`detaug.transforms.pad`).
PADDING_MODE = Param("padding_mode", "choice", "constant",
                     "only 'constant' (painted with fill); edge/reflect/symmetric are not supported",
                     choices=("constant",))


class ScalarOrList:
    """Mixin: the fields named in ``scalar_fields`` (``"numbers"`` params) also take a single
    number, as torchvision's ``padding=4`` or ``min_size=800``; it is stored as a 1-list."""

    scalar_fields: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = [p.name for p in self.schema]  # type: ignore[attr-defined]
        args = list(args)
        for field in self.scalar_fields:
            i = names.index(field)
            if field in kwargs and _is_scalar(kwargs[field]):
                kwargs[field] = [kwargs[field]]
            elif i < len(args) and _is_scalar(args[i]):
                args[i] = [args[i]]
        super().__init__(*args, **kwargs)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def whole_numbers(transform: Transform, field: str, values: tuple[float, ...]) -> tuple[int, ...]:
    """``values`` as ints, or a :class:`~detaug.errors.RecipeError` on ``field`` naming the first
    fractional one."""
    for v in values:
        if v != int(v):
            raise transform.error(field, f"expected whole pixels, got {v:g} in {[float(x) for x in values]!r}")
    return tuple(int(v) for v in values)


def padding_ltrb(padding: tuple[int, ...]) -> tuple[int, int, int, int]:
    """torchvision's ``padding`` (1, 2 or 4 ints) as ``(left, top, right, bottom)``."""
    if len(padding) == 1:
        return (padding[0],) * 4  # type: ignore[return-value]
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    return padding[0], padding[1], padding[2], padding[3]
