"""Which per-box fields a loader returns: its ``fields=`` argument read against the source.

``"all"`` gives every field of the source, then ``"area"`` (computed on the output boxes by
:class:`~detaug.planning.BatchPlanner`, so every source gives it); ``"none"`` gives none; a list
names them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from detaug.sources import FieldSpec, field_specs

__all__ = ["FIELD_CHOICES", "AREA", "select_fields", "field_outputs"]

#: ``fields=`` words of the loaders: every per-box field of the source, or none.
FIELD_CHOICES = ("all", "none")

#: The field computed from the output boxes (``w * h`` pixels, float32), whether the source has it or not.
AREA = "area"


def select_fields(source: Any, fields: Any = "all") -> tuple[str, ...]:
    """The per-box fields a loader returns, from its ``fields=`` argument.

    Args:
        source: the source (its ``field_specs``, :func:`detaug.sources.field_specs`).
        fields: ``"all"`` (or ``None``): every field of the source, then ``"area"`` where the
            source has none (computed on the output boxes: every source gives it); ``"none"``:
            no field; or a sequence of names: those fields, in that order (``"area"`` is
            computed on the output boxes also for a source without it).

    Raises:
        ValueError: a name the source does not have (the message lists those it has).
    """
    specs = field_specs(source)
    if fields is None or (isinstance(fields, str) and fields == "all"):
        return tuple(specs) + (() if AREA in specs else (AREA,))
    if isinstance(fields, str) and fields == "none":
        return ()
    if isinstance(fields, str) or not isinstance(fields, Iterable) or not all(isinstance(name, str) for name in fields):
        raise ValueError(f"fields must be {' or '.join(map(repr, FIELD_CHOICES))} or a list of field names, got {fields!r}")
    names = tuple(dict.fromkeys(fields))
    unknown = [name for name in names if name not in specs and name != AREA]
    if unknown:
        have = ", ".join(map(repr, specs)) or "none"
        raise ValueError(f"fields {', '.join(map(repr, unknown))}: the source has no such per-box field "
                         f"(it has {have}; 'area' is always available)")
    return names


def field_outputs(source: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """``{name: FieldSpec}`` of the fields ``names`` as the planner gives them (``area``
    float32 ``[N]``, the others as the source holds them)."""
    specs = field_specs(source)
    return {name: FieldSpec(np.dtype(np.float32), ()) if name == AREA else specs[name] for name in names}
