"""The typed plan: what a recipe plans per sample for DALI, each field named, with shape and dtype.

A recipe's :class:`PlanLayout` is built once (``Compose.plan_layout``) from what its parts
contribute: the decode region of the sample's image, each warp segment's matrix and output
size, the mixing transforms' tiles and partners, each photometric transform's parameters, the
batch positions of partners taken from the batch. The batch planner (:mod:`detaug.batch_plan`)
fills it by name (:meth:`PlanLayout.pack`), the DALI pipeline (:mod:`detaug.pipeline`) reads it
by name (:meth:`PlanLayout.slice`, :meth:`PlanLayout.field`), and
:class:`~detaug.planned_batch.PlannedBatch` carries it beside the values (``planned.plan(name)``).

The values travel to DALI as one float32 array ``params [B, P]`` (one external source, each
field a slice of it): every field is carried in float32, whatever its :attr:`PlanField.dtype`,
which says what its values are (``"int32"``: whole numbers, batch positions below ``2**24``,
exact in float32; :meth:`PlanLayout.read` gives them back in that dtype). Field names are
dotted: ``"warp0.matrix"``, ``"mixup.ratio"``; a *group* is the fields under one prefix
(``"warp0"``: its matrix and size), contiguous in ``params``.
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

__all__ = ["DTYPES", "PlanFieldSpec", "PlanField", "PlanLayout"]

#: What a field's values are (all travel as float32).
DTYPES = ("float32", "int32")


@dataclass(frozen=True)
class PlanField:
    """One planned field: ``shape`` per sample (``()``: one number), at ``start`` of the vector."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    doc: str
    start: int

    @property
    def size(self) -> int:
        """Floats it takes in a sample's vector."""
        return math.prod(self.shape)

    @property
    def slice(self) -> slice:
        """Where it sits in a sample's vector."""
        return slice(self.start, self.start + self.size)


#: A field's declaration: ``(name, shape, dtype, doc)``.
PlanFieldSpec = tuple[str, tuple[int, ...], str, str]


class PlanLayout:
    """The fields of a recipe's per-sample parameter vector, in order (see the module docstring).

    Args:
        specs: ``(name, shape, dtype, doc)`` per field, in vector order; names unique, not one
            the prefix of a group of others (``"a"`` and ``"a.b"``).
    """

    def __init__(self, specs: Iterable[PlanFieldSpec]) -> None:
        fields, start = [], 0
        for name, shape, dtype, doc in specs:
            shape = tuple(int(k) for k in shape)
            if dtype not in DTYPES:
                raise ValueError(f"plan field {name!r}: dtype {dtype!r} is not one of {DTYPES}")
            fields.append(PlanField(name, shape, dtype, doc, start))
            start += fields[-1].size
        self.fields: tuple[PlanField, ...] = tuple(fields)
        self._by_name = {f.name: f for f in self.fields}
        if len(self._by_name) != len(self.fields):
            twice = sorted({f.name for f in self.fields if [g.name for g in self.fields].count(f.name) > 1})
            raise ValueError(f"plan fields named twice: {twice}")
        for name in self._by_name:
            if any(other.startswith(name + ".") for other in self._by_name):
                raise ValueError(f"plan field {name!r} is also the prefix of other fields")
        #: floats per sample (``P``)
        self.size = start
        self._key: bytes | None = None  # the declarations, pickled: how a layout travels

    def specs(self) -> tuple[PlanFieldSpec, ...]:
        """The declarations this layout was built from."""
        return tuple((f.name, f.shape, f.dtype, f.doc) for f in self.fields)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name or (isinstance(name, str) and bool(self.group(name)))

    def field(self, name: str) -> PlanField:
        """The field ``name``; a ``KeyError`` listing the fields where there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"the plan has no field {name!r}; it has {', '.join(self.names) or 'none'}") from None

    def group(self, prefix: str) -> list[PlanField]:
        """The field ``prefix`` itself, or the fields named ``prefix.*``, in order."""
        if prefix in self._by_name:
            return [self._by_name[prefix]]
        return [f for f in self.fields if f.name.startswith(prefix + ".")]

    def slice(self, name: str) -> slice:
        """Where field (or group) ``name`` sits in a sample's vector."""
        group = self.group(name)
        if not group:
            self.field(name)  # raises, naming the fields
        return slice(group[0].start, group[-1].start + group[-1].size)

    def pack(self, values: Mapping[str, np.ndarray], batch_size: int) -> np.ndarray:
        """float32 ``[B, P]``: every field's values (``[B, *shape]``, or ``[B, size]``), each at
        its place; a ``ValueError`` names a field missing, unknown or of the wrong shape."""
        missing = [name for name in self.names if name not in values]
        unknown = [name for name in values if name not in self._by_name]
        if missing or unknown:
            raise ValueError(f"plan values do not fit the layout: missing {missing}, unknown {unknown}")
        out = np.empty((batch_size, self.size), dtype=np.float32)
        for f in self.fields:
            value = np.asarray(values[f.name])
            if value.shape not in ((batch_size, *f.shape), (batch_size, f.size)):
                raise ValueError(f"plan field {f.name!r}: expected [{batch_size}, {', '.join(map(str, f.shape))}] "
                                 f"values, got {list(value.shape)}")
            out[:, f.slice] = value.reshape(batch_size, f.size)
        return out

    def read(self, params: np.ndarray, name: str) -> np.ndarray:
        """Field ``name`` of parameter vectors ``params`` (``[B, P]``, or one ``[P]``):
        ``[B, *shape]`` (``[*shape]``) in the field's dtype."""
        f = self.field(name)
        params = np.asarray(params)
        value = params[..., f.slice].reshape(params.shape[:-1] + f.shape)
        return value.astype(f.dtype) if f.dtype != "float32" else value

    def describe(self) -> str:
        """One line per field: name, shape, dtype, doc."""
        return "\n".join(f"{f.name:<28} {str(list(f.shape)):<8} {f.dtype:<8} {f.doc}" for f in self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlanLayout) and self.specs() == other.specs()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        if self._key is None:
            self._key = pickle.dumps(self.specs())
        return _layout, (self._key,)

    def __repr__(self) -> str:
        return f"PlanLayout({len(self.fields)} fields, {self.size} floats: {', '.join(self.names)})"


_layouts: dict[bytes, PlanLayout] = {}


def _layout(key: bytes) -> PlanLayout:
    """The layout of the pickled declarations ``key``, built once per process: a plan that
    travels from a worker carries its layout as one bytes object, and unpickling it is a
    look-up, not a rebuild of its fields (about 5 us a batch on the loader's main thread, not 10)."""
    layout = _layouts.get(key)
    if layout is None:
        layout = _layouts[key] = PlanLayout(pickle.loads(key))
        layout._key = key
    return layout
