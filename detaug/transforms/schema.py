"""Parameter schemas of transforms: names, types, ranges and defaults, checked in one place.

Every transform declares its parameters as a tuple of :class:`Param` (``Transform.schema``). The
schema is the single source of truth for

* validation: :meth:`Param.normalize` turns a value given in Python or read from YAML/JSON into
  the stored form, or raises :class:`ParamError` saying what was expected and what was given
  (``degrees: "15"`` is an error, not the range ``(1, 5)``; ``expand: "no"`` is an error, not
  ``True``);
* the constructor's signature (``inspect.signature``, ``help()``), ``to_dict`` and ``from_dict``;
* the generated table of docs/transforms.md (:func:`detaug.transforms.table.markdown_table`).

No DALI, torch or Keras here.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["Param", "ParamError", "REQUIRED", "closest"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Default of a parameter that must be given.
REQUIRED: Any = _Required()

KINDS = ("number", "int", "bool", "probability", "range", "size", "numbers", "choice", "values", "transforms")


class ParamError(ValueError):
    """A parameter value that does not fit its schema (the transform adds its own name)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def closest(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'X'?)"`` for the known name closest to ``name``, or ``""``."""
    match = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    if not match and isinstance(name, str):  # case slips: "randomaffine"
        lowered = {k.lower(): k for k in known}
        match = [lowered[name.lower()]] if name.lower() in lowered else []
    return f" (did you mean {match[0]!r}?)" if match else ""


def _given(value: Any) -> str:
    """How a wrong value is named in an error: ``the string '15'``, ``a list [1, 2, 3]``."""
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, bool):
        return f"the boolean {value}"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return f"a list {list(value)!r}"
    if isinstance(value, dict):
        return f"a mapping {value!r}"
    return f"{type(value).__name__} {value!r}"


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    try:
        import numbers

        return isinstance(value, numbers.Real) and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Param:
    """One parameter of a transform.

    Attributes:
        name: the argument's name (as in torchvision/albumentations where they have one).
        kind: ``"number"`` (a finite float), ``"int"``, ``"bool"`` (only ``true``/``false``),
            ``"probability"`` (a number in ``[0, 1]``), ``"range"`` (a ``[min, max]`` pair with
            ``min <= max``, or with ``center`` a single ``v >= 0`` meaning
            ``[center - v, center + v]``), ``"size"`` (an int for a square or ``[height, width]``,
            positive), ``"numbers"`` (a list of numbers of one of ``lengths``), ``"choice"`` (one
            of ``choices``).
        default: the default, or :data:`REQUIRED`.
        doc: one line for the docs table.
        low, high: inclusive bounds of every number (``None``: unbounded).
        center: for ``"range"``: the centre a single number is taken around.
        lengths: for ``"numbers"``: the allowed list lengths.
        choices: for ``"choice"``: the allowed values.
        optional: ``None`` (YAML ``null``) is allowed and kept as ``None``.
        int_or_size: for ``"size"``: an int is kept as an int (e.g. ``Resize``'s shorter side)
            instead of becoming a square.
        pair: for ``"size"``: what the pair's two values are, in order (``"width, height"`` for
            torchvision's ``ScaleJitter.target_size``).
        integer: for ``"values"``: every number must be an integer (kept as ``int``).
    """

    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""
    low: float | None = None
    high: float | None = None
    center: float | None = None
    lengths: tuple[int, ...] = (2,)
    choices: tuple[Any, ...] = ()
    optional: bool = False
    int_or_size: bool = False
    pair: str = "height, width"
    integer: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Param {self.name}: unknown kind {self.kind!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    # -- checking -------------------------------------------------------------------------------

    def normalize(self, value: Any) -> Any:
        """The stored form of ``value`` (tuples for pairs, floats for numbers), or
        :class:`ParamError`."""
        if value is None:
            if self.optional:
                return None
            raise ParamError(self.name, f"expected {self.expected()}, got null")
        check = getattr(self, f"_{self.kind}")
        return check(value)

    def _fail(self, value: Any, extra: str = "") -> ParamError:
        return ParamError(self.name, f"expected {self.expected()}, got {_given(value)}{extra}")

    def _bounded(self, x: float, value: Any) -> float:
        if (self.low is not None and x < self.low) or (self.high is not None and x > self.high):
            raise ParamError(self.name, f"{x:g} is out of range: expected {self._bounds_text()}, got {_given(value)}")
        return x

    def _bounds_text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"values in [{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"values >= {self.low:g}"
        if self.high is not None:
            return f"values <= {self.high:g}"
        return "finite numbers"

    def _lengths_text(self) -> str:
        n = self.lengths
        if len(n) > 2 and n == tuple(range(n[0], n[-1] + 1)):
            return f"{n[0]} to {n[-1]}"
        return " or ".join(map(str, n))

    def _around(self) -> str:
        return "[-v, v]" if self.center == 0 else f"[{self.center:g} - v, {self.center:g} + v]"

    def _number(self, value: Any) -> float:
        if not _is_number(value):
            raise self._fail(value)
        return self._bounded(float(value), value)

    def _int(self, value: Any) -> int:
        if not _is_number(value) or float(value) != int(value):
            raise self._fail(value)
        return int(self._bounded(int(value), value))

    def _bool(self, value: Any) -> bool:
        if not isinstance(value, bool):
            import numpy as np

            if not isinstance(value, np.bool_):
                raise self._fail(value)
        return bool(value)

    def _probability(self, value: Any) -> float:
        if not _is_number(value):
            raise self._fail(value)
        x = float(value)
        if not 0.0 <= x <= 1.0:
            raise ParamError(self.name, f"expected a probability in [0, 1], got {x:g}")
        return x

    def _range(self, value: Any) -> tuple[float, float]:
        if _is_number(value):
            if self.center is None:
                raise self._fail(value)
            v = float(value)
            if v < 0:
                raise ParamError(self.name, f"a single number v means {self._around()} and must be >= 0, got {v:g}")
            pair = (self.center - v, self.center + v)
        elif isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_number(v) for v in value):
            pair = (float(value[0]), float(value[1]))
            if pair[0] > pair[1]:
                raise ParamError(self.name, f"range reversed: expected [min, max] with min <= max, got {list(value)!r}")
        else:
            raise self._fail(value)
        for x in pair:
            self._bounded(x, value)
        return pair

    def _size(self, value: Any) -> int | tuple[int, int]:
        if _is_number(value) and float(value) == int(value):
            if int(value) <= 0:
                raise ParamError(self.name, f"a size must be positive, got {int(value)}")
            return int(value) if self.int_or_size else (int(value), int(value))
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_number(v) and float(v) == int(v) for v in value):
            h, w = int(value[0]), int(value[1])
            if h <= 0 or w <= 0:
                raise ParamError(self.name, f"a size must be positive, got {list(value)!r}")
            return (h, w)
        raise self._fail(value)

    def _numbers(self, value: Any) -> tuple[float, ...]:
        if not isinstance(value, (list, tuple)) or not all(_is_number(v) for v in value):
            raise self._fail(value)
        if len(value) not in self.lengths:
            raise self._fail(value, f" ({len(value)} values)")
        return tuple(self._bounded(float(v), value) for v in value)

    def _choice(self, value: Any) -> Any:
        if value not in self.choices or isinstance(value, bool) != isinstance(self.choices[0], bool):
            raise ParamError(self.name, f"expected one of {', '.join(map(repr, self.choices))}, got {_given(value)}"
                             + closest(value, [c for c in self.choices if isinstance(c, str)]))
        return value

    def _values(self, value: Any) -> tuple[float, ...] | tuple[int, ...]:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        ok = all(_is_number(v) and (not self.integer or float(v) == int(v)) for v in items)
        if not ok or (isinstance(value, (list, tuple)) and len(items) not in (1, *self.lengths)):
            raise self._fail(value, f" ({len(items)} values)" if ok else "")
        cast = int if self.integer else float
        return tuple(cast(self._bounded(cast(v), value)) for v in items)

    def _transforms(self, value: Any) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)) or not value:
            raise self._fail(value)
        return tuple(value)

    # -- describing -----------------------------------------------------------------------------

    def expected(self) -> str:
        """What a valid value looks like, in words (used in errors and the docs table)."""
        bounds = "" if self.low is None and self.high is None else f" ({self._bounds_text()})"
        text = {
            "number": f"a number{bounds}",
            "int": f"an integer{bounds}",
            "bool": "true or false",
            "probability": "a probability in [0, 1]",
            "range": (f"a number v >= 0 (meaning {self._around()}) or a [min, max] pair{bounds}"
                      if self.center is not None else f"a [min, max] pair{bounds}"),
            "size": f"an integer or a [{self.pair}] pair of positive integers",
            "numbers": f"a list of {self._lengths_text()} numbers{bounds}",
            "choice": "one of " + ", ".join(map(repr, self.choices)),
            "values": (f"{'an integer' if self.integer else 'a number'} or a list of {self._lengths_text()} "
                       f"{'integers' if self.integer else 'numbers'}{bounds}"),
            "transforms": "a non-empty list of transforms (mappings with a 'name')",
        }[self.kind]
        return text + (" or null" if self.optional else "")
