"""Epoch schedules: a recipe whose values change with the epoch (``Compose(schedule=...)``).

A schedule maps transforms of the recipe to the fields it sets per epoch::

    schedule = {
        "RandomAffine": {"degrees": {"epochs": [0, 10], "values": [0, 15]}},        # linear ramp
        "ColorJitter": {"brightness": {"epochs": [0, 5, 20], "values": [0, 0.2, 0.4],
                                       "mode": "step"}},                          # piecewise constant
        "Mosaic": {"off_from_epoch": 90},                                         # p = 0 from epoch 90
    }

* **Which transform**: its name where the recipe holds one of that name, else its index in the
  recipe's ``transforms`` list (``2`` or ``"2"``). Only the recipe's own entries, not the
  transforms inside a composition (``OneOf``...).
* **Which field**: one of the transform's parameters of kind ``probability``, ``number``,
  ``range`` or ``numbers`` that the host plans (:data:`PIPELINE_FIELDS`, read by the DALI graph,
  cannot change per epoch: ``fill``, ``mean``...). A scheduled field replaces the transform's own
  value at every epoch.
* **A field's schedule** (:class:`FieldSchedule`): ``epochs`` (integers ``>= 0``, increasing) and
  ``values`` (one per epoch, each what the field takes: ``15`` or ``[-15, 15]`` for a range).
  ``mode: "linear"`` (the default) interpolates between the points (each number of a pair on its
  own); ``mode: "step"`` holds ``values[k]`` from ``epochs[k]`` until the next point. Before the
  first point the first value holds, after the last the last.
* **A switch**: ``{"off_from_epoch": N}`` sets the transform's ``p`` to 0 from epoch ``N`` on (its
  own ``p`` before): ultralytics' ``close_mosaic=10`` of a 100-epoch run is
  ``{"Mosaic": {"off_from_epoch": 90}}``.

Epochs are absolute, the loaders' ``epoch`` (:mod:`detaug.seeds`): no rule needs the number of
epochs of the run, so the loaders take none. The recipe of epoch ``e`` is
:meth:`RecipeSchedule.at` (``Compose.at_epoch``): the same transforms with the scheduled values,
built and checked like any recipe; the planner plans each batch with the recipe of its epoch
(its keys' epoch column), so a sample stays a pure function of ``(seed, epoch, image_id)`` and a
resumed loader (``load_state_dict``, ``set_epoch``) gets the recipe of its epoch. A schedule
changes values only, never the DALI graph: the plan layout and the warp segments of every
epoch's recipe are the recipe's own (checked when the schedule is built), so one pipeline serves
every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from detaug.errors import RecipeError
from detaug.transforms.base import Transform, _plain
from detaug.transforms.schema import Param, closest

__all__ = ["FieldSchedule", "MODES", "OFF_FROM_EPOCH", "PIPELINE_FIELDS", "RecipeSchedule", "SCHEDULABLE_KINDS"]

#: How values between two points are taken.
MODES = ("linear", "step")
#: Parameter kinds a schedule may set.
SCHEDULABLE_KINDS = ("probability", "number", "range", "numbers")
#: Fields read by the DALI graph (not only by the planner): a schedule cannot change them.
PIPELINE_FIELDS = ("fill", "value", "mean", "std", "kernel_size", "per_channel", "num_output_channels", "size")
#: The switch's key: ``p`` is 0 from this epoch on.
OFF_FROM_EPOCH = "off_from_epoch"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class FieldSchedule:
    """One field's values over the epochs (see the module docstring).

    Attributes:
        epochs: the points, integers ``>= 0``, strictly increasing.
        values: the field's value at each point, as the field's :class:`Param` stores it
            (a float, or a tuple of floats).
        mode: ``"linear"`` or ``"step"``.
    """

    epochs: tuple[int, ...]
    values: tuple[Any, ...]
    mode: str = "linear"

    def at(self, epoch: int) -> Any:
        """The value at ``epoch`` (a float or a tuple of floats)."""
        e = self.epochs
        if epoch <= e[0]:
            return self.values[0]
        if epoch >= e[-1]:
            return self.values[-1]
        k = int(np.searchsorted(e, epoch, side="right")) - 1  # e[k] <= epoch < e[k + 1]
        lo, hi = self.values[k], self.values[k + 1]
        if self.mode == "step" or epoch == e[k]:
            return lo
        t = (epoch - e[k]) / (e[k + 1] - e[k])
        if isinstance(lo, tuple):
            return tuple(a + t * (b - a) for a, b in zip(lo, hi))
        return lo + t * (hi - lo)

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": list(self.epochs), "values": _plain(list(self.values)), "mode": self.mode}


class RecipeSchedule:
    """The schedule of a recipe: per transform index, per field, a :class:`FieldSchedule`.

    Args:
        spec: the ``schedule`` mapping (module docstring), from Python or a recipe file.
        transforms: the recipe's transforms.

    Every problem is a :class:`~detaug.errors.RecipeError` with field ``schedule.<key>.<field>``
    (``<key>`` as the schedule names the transform): an unknown or ambiguous transform, an
    unknown field or one that cannot be scheduled, points out of order, a value the field
    does not take.
    """

    def __init__(self, spec: Mapping[Any, Any] | None, transforms: Sequence[Transform]) -> None:
        self.spec: dict[Any, Any] = {}
        #: ``{transform index: {field: FieldSchedule}}``
        self.fields: dict[int, dict[str, FieldSchedule]] = {}
        #: ``{transform index: epoch}`` of the ``off_from_epoch`` switches
        self.off_from: dict[int, int] = {}
        if spec is None:
            return
        if not isinstance(spec, Mapping):
            raise RecipeError(f"a schedule is a mapping of transforms to their fields' schedules, got {spec!r}",
                              field="schedule")
        for key, rules in spec.items():
            index = self._target(key, transforms)
            t = transforms[index]
            name = type(t).__name__

            def fail(problem: str, field: str | None = None) -> RecipeError:
                where = f"schedule.{key}" + (f".{field}" if field else "")
                return RecipeError(problem, field=where)

            if not isinstance(rules, Mapping) or not rules:
                raise fail(f"expected a mapping of fields to schedules (or {{{OFF_FROM_EPOCH}: N}}), got {rules!r}")
            if index in self.fields or index in self.off_from:
                raise fail("scheduled twice (by name and by index)")
            params = {p.name: p for p in t.schema}
            fields: dict[str, FieldSchedule] = {}
            stored: dict[str, Any] = {}
            for field, rule in rules.items():
                if field == OFF_FROM_EPOCH:
                    if "p" not in params or params["p"].kind != "probability":
                        raise fail(f"{name} has no probability p to switch off", field)
                    if not _is_int(rule) or rule < 0:
                        raise fail(f"expected an epoch (an integer >= 0), got {rule!r}", field)
                    self.off_from[index] = int(rule)
                    stored[field] = int(rule)
                    continue
                if field not in params:
                    known = [p.name for p in t.schema if self._schedulable(p)] + [OFF_FROM_EPOCH]
                    raise fail(f"unknown field{closest(str(field), known)}; schedulable: {', '.join(known)}", str(field))
                p = params[field]
                if not self._schedulable(p):
                    why = ("is read by the DALI pipeline, which one recipe builds once"
                           if p.name in PIPELINE_FIELDS else f"is of kind {p.kind!r}")
                    raise fail(f"cannot be scheduled: it {why}; schedulable kinds: {', '.join(SCHEDULABLE_KINDS)}",
                               field)
                fields[field] = self._field(rule, p, lambda problem, f=field: fail(problem, f))
                stored[field] = fields[field].to_dict()
            if "p" in fields and index in self.off_from:
                raise fail(f"both p and {OFF_FROM_EPOCH} are scheduled: give one", "p")
            if fields:
                self.fields[index] = fields
            self.spec[str(key)] = stored

    def __bool__(self) -> bool:
        return bool(self.fields or self.off_from)

    @staticmethod
    def _schedulable(p: Param) -> bool:
        return p.kind in SCHEDULABLE_KINDS and p.name not in PIPELINE_FIELDS

    @staticmethod
    def _target(key: Any, transforms: Sequence[Transform]) -> int:
        """The index of the transform that ``key`` (a name or an index) names."""
        names = [type(t).__name__ for t in transforms]
        if _is_int(key) or (isinstance(key, str) and key.isdigit()):
            index = int(key)
            if not 0 <= index < len(transforms):
                raise RecipeError(f"index {index} out of range: the recipe has {len(transforms)} transforms",
                                  field=f"schedule.{key}")
            return index
        if not isinstance(key, str) or key not in names:
            raise RecipeError(f"no transform {key!r} in the recipe{closest(str(key), names)}; "
                              f"the recipe has: {', '.join(names)}", field=f"schedule.{key}")
        if names.count(key) > 1:
            at = [i for i, n in enumerate(names) if n == key]
            raise RecipeError(f"the recipe has {len(at)} {key} (at {at}): name one by its index", field=f"schedule.{key}")
        return names.index(key)

    @staticmethod
    def _field(rule: Any, p: Param, fail: Any) -> FieldSchedule:
        """One field's :class:`FieldSchedule` from its mapping, each value checked by ``p``."""
        if not isinstance(rule, Mapping):
            raise fail(f"expected {{epochs: [...], values: [...], mode: linear|step}}, got {rule!r}")
        unknown = [k for k in rule if k not in ("epochs", "values", "mode")]
        if unknown:
            raise fail(f"unknown key {unknown[0]!r}{closest(str(unknown[0]), ['epochs', 'values', 'mode'])}; "
                       "known: epochs, values, mode")
        epochs, values, mode = rule.get("epochs"), rule.get("values"), rule.get("mode", "linear")
        if mode not in MODES:
            raise fail(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}{closest(str(mode), MODES)}")
        if not isinstance(epochs, (list, tuple)) or not epochs or not all(_is_int(e) and e >= 0 for e in epochs):
            raise fail(f"epochs: expected a non-empty list of epochs (integers >= 0), got {epochs!r}")
        if any(b <= a for a, b in zip(epochs, epochs[1:])):
            raise fail(f"epochs: expected increasing epochs, got {list(epochs)!r}")
        if not isinstance(values, (list, tuple)) or len(values) != len(epochs):
            raise fail(f"values: expected one value per epoch ({len(epochs)}), got {values!r}")
        checked = []
        for e, v in zip(epochs, values):
            try:
                checked.append(p.normalize(v))
            except ValueError as err:
                raise fail(f"value at epoch {e}: {getattr(err, 'message', err)}") from None
            if checked[-1] is None:
                raise fail(f"value at epoch {e}: null cannot be scheduled")
        shapes = {len(v) if isinstance(v, tuple) else None for v in checked}
        if len(shapes) > 1:
            raise fail(f"values: every value must have the same form (numbers, or lists of one length), got {values!r}")
        return FieldSchedule(tuple(int(e) for e in epochs), tuple(checked), mode)

    def points(self) -> list[int]:
        """Every epoch where a rule changes (to check the recipes of, besides epoch 0)."""
        out = {0}
        for fields in self.fields.values():
            for s in fields.values():
                out.update(s.epochs)
        out.update(self.off_from.values())
        return sorted(out)

    def values_at(self, epoch: int) -> dict[int, dict[str, Any]]:
        """``{transform index: {field: value}}`` at ``epoch`` (plain Python values)."""
        out: dict[int, dict[str, Any]] = {}
        for index, fields in self.fields.items():
            out[index] = {f: _plain(s.at(epoch)) for f, s in fields.items()}
        for index, start in self.off_from.items():
            if epoch >= start:
                out.setdefault(index, {})["p"] = 0.0
        return out

    def transforms_at(self, transforms: Sequence[Transform], epoch: int) -> list[Transform]:
        """The transforms with the values of ``epoch`` (the others as they are); a value a
        transform refuses (a cross-field check of its ``setup``) is a :class:`RecipeError`
        naming the epoch."""
        out = list(transforms)
        for index, values in self.values_at(epoch).items():
            t = transforms[index]
            args = {k: v for k, v in t.to_dict().items() if k != "name"}
            args.update(values)
            try:
                out[index] = type(t)(**args)
            except RecipeError as err:
                key = next((k for k in self.spec if RecipeSchedule._target(k, transforms) == index), index)
                raise RecipeError(f"at epoch {epoch}: {err.problem}",
                                  field=f"schedule.{key}" + (f".{err.field}" if err.field else "")) from None
        return out

    def to_dict(self) -> dict[Any, Any]:
        return {k: dict(v) for k, v in self.spec.items()}
