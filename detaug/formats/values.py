"""The value rules every source shares, one place each: integers, box coordinates, declared
image sizes and labels (which Python and NumPy values stand for what, and which do not)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detaug.formats.report import LABEL_RANGE, NEGATIVE_LABEL

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "as_coordinate",
    "as_int",
    "check_size",
    "label_problem",
]

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def as_int(value: Any) -> int | None:
    """The integer ``value`` stands for (a Python or NumPy integer, or an integral finite float),
    or ``None`` (bools, strings, fractions, NaN, anything else)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def as_coordinate(value: Any) -> float | None:
    """A box coordinate as a float (``inf`` for integers beyond float range), or ``None`` when
    ``value`` is not a real number (bools and strings are not)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, (float, np.floating)):
        return float(value)
    return None


def check_size(height: Any, width: Any) -> tuple[tuple[int, int] | None, str]:
    """``((h, w), "")`` for a valid declared size (positive integers <= 2**31 - 1), else
    ``(None, why)``."""
    h, w = as_int(height), as_int(width)
    if h is None or w is None or not (0 < h <= INT32_MAX and 0 < w <= INT32_MAX):
        return None, f"height {height!r:.40}, width {width!r:.40}: not positive integers <= 2**31-1"
    return (h, w), ""


def label_problem(label: int) -> str | None:
    """The error reason for a category id / label that detaug cannot carry, or ``None``."""
    if label < 0:
        return NEGATIVE_LABEL
    if label > INT32_MAX:
        return LABEL_RANGE
    return None
