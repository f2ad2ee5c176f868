"""Compositions: ``OneOf``, ``RandomChoice``, ``RandomApply``, ``SomeOf``, each a transform made
of transforms, chosen per sample.

A composition is one recipe entry; in YAML/JSON its ``transforms`` field is a list of entries
like the recipe's own (``{"name": "OneOf", "transforms": [{"name": ...}, ...]}``), checked the
same way: a wrong nested field is a :class:`~detaug.errors.RecipeError` whose field names the
path, ``transforms[2] OneOf.transforms[1] Resize.size: ...``.

**Kind.** Its kind is its children's: all geometric (kind ``"warp"``) or all photometric
(``"photometric"``); mixing them, or nesting an output stage (``Normalize``) or a mixing
transform (``Mosaic``, ``MixUp``), is a ``RecipeError`` (write two compositions). ``kind``,
``crops``, ``reveals``, ``fill``, ``projective``, ``param_names`` and ``neutral`` are therefore
attributes of the instance (the class says
``"composition"``, for the docs table).

**Vectorised planning** (:mod:`detaug.seeds`): a composition first draws its choice for every
sample (a fixed number of draws), then plans **every** child for the whole batch, in order (each
child's draws are fixed too), and keeps, per sample, what the chosen children planned:

* geometric: the children run one after the other on a private copy of the plan state, each
  applied (its step and canvas) only to the samples that chose it, the identity elsewhere; boxes
  a child drops (``RandomIoUCrop``) are dropped only for those samples. The composition's step
  is the product of the applied steps: one warp, like any geometric transform. It crops if a
  child crops, reveals if a child reveals, with the revealing children's common ``fill``
  (different fills: ``RecipeError``). Where several children can apply to one sample
  (``RandomApply``, ``SomeOf``), a child that reveals after one that crops is a ``RecipeError``:
  in one warp the area the crop removed would show again (``Compose`` starts a new warp there;
  put them in separate entries).
* photometric: a sample's parameters of a child it did not choose are the child's ``neutral``
  values (``ColorJitter``: ``(1, 1, 1, 0)``), with which its DALI op leaves the pixels as they
  are; the composition's DALI graph is its children's, in order (each op runs on every sample).
  Regions painted over (``RandomErasing``) are the chosen children's.

A chosen child runs as it does alone, with its own probability ``p`` (torchvision's
``RandomChoice``/``RandomApply``; albumentations forces the chosen child on: give it ``p=1``).
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from detaug.errors import RecipeError
from detaug.plan import PlanState
from detaug.seeds import SampleRandom
from detaug.transforms.base import TRANSFORMS, Param, Transform, register, where_applied
from detaug.transforms.schema import REQUIRED, closest

__all__ = ["Composition", "OneOf", "RandomChoice", "RandomApply", "SomeOf", "build_entry", "entry_transform", "field_path",
           "entry_lines"]

_TRANSFORMS = Param("transforms", "transforms", REQUIRED, "the transforms (recipe entries) to choose from")
_WEIGHTS_DOC = "relative weights of the transforms (null: uniform)"
_NESTED = re.compile(r"transforms\[(\d+)\](?: ([^.\s]+)(?:\.(.*))?)?$")


def build_entry(spec: Any, index: int, owner: str) -> Transform:
    """Entry ``index`` of composition ``owner``'s ``transforms``: a transform as given, or built
    from a ``{"name": ..., <field>: ...}`` mapping. Errors name the nested path
    (``field="transforms[1] Resize.size"``, see :func:`field_path`)."""
    here = f"transforms[{index}]"
    if isinstance(spec, Transform):
        return spec
    if not isinstance(spec, Mapping):
        raise RecipeError(f"an entry is a transform or a mapping with a 'name', got {spec!r}", transform=owner, field=here)
    kind, fields = entry_transform(spec, lambda problem, _: RecipeError(problem, transform=owner, field=here))
    try:
        return kind(**fields)
    except RecipeError as err:
        inner = ".".join(x for x in (err.transform, err.field) if x)
        raise RecipeError(err.problem, transform=owner, field=f"{here} {inner}" if inner else here) from None


def entry_transform(spec: Mapping[str, Any],
                    fail: Callable[[str, bool], RecipeError]) -> tuple[type[Transform], dict[str, Any]]:
    """The transform class that the recipe entry ``spec`` names (its ``"name"``, a registered
    transform) and the entry's other fields, its arguments. An entry without a ``"name"``, or
    whose name is no transform, raises ``fail(problem, at_name)``: the caller locates the
    error (``at_name``: the problem is the name's value, not the entry's)."""
    fields = dict(spec)
    name = fields.pop("name", None)
    if name is None:
        raise fail("entry has no 'name'", False)
    if name not in TRANSFORMS:
        raise fail(f"unknown transform {name!r}{closest(name, TRANSFORMS)}", True)
    return TRANSFORMS[name], fields


def field_path(field: str | None) -> tuple:
    """The recipe path of a :class:`RecipeError`'s ``field`` inside its entry, for line look-ups:
    ``"size"`` -> ``("size",)``; ``"transforms[1] OneOf.transforms[0] Resize.size"`` ->
    ``("transforms", 1, "transforms", 0, "size")``."""
    if not field:
        return ()
    match = _NESTED.match(field)
    if not match:
        return (field,)
    index, _, rest = match.groups()
    return ("transforms", int(index)) + field_path(rest)


def entry_lines(node: Any, where: tuple, out: dict[tuple, int]) -> None:
    """Record in ``out`` the 1-based lines of one recipe entry (a PyYAML node at path ``where``,
    e.g. ``("transforms", 2)``), of its fields (``where + (field,)``) and, recursively, of the
    entries of its ``transforms`` list (``where + ("transforms", j)``)."""
    import yaml

    out[where] = node.start_mark.line + 1
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        out[where + (key.value,)] = key.start_mark.line + 1
        if key.value == "transforms" and isinstance(value, yaml.SequenceNode):
            for j, entry in enumerate(value.value):
                entry_lines(entry, where + ("transforms", j), out)


def fork_state(state: PlanState) -> PlanState:
    """A deep copy of ``state`` (arrays shared inside it stay shared in the copy) whose geometry
    and ``alive`` flags change independently; the random streams (``rand``) are the same object,
    so draws advance the recipe's counter."""
    return copy.deepcopy(state, memo={id(state.rand): state.rand})


class Composition(Transform):
    """Base of compositions: builds and checks the children, plans them (see the module
    docstring). Subclasses define :meth:`choose` and, when a child can run more than once,
    :meth:`slot_children`."""

    kind = "composition"  # the class, for the docs table; an instance is "warp" or "photometric"
    #: several children may apply to one sample, one after the other
    chains: bool = True

    def setup(self) -> None:
        owner = type(self).__name__
        self.transforms = tuple(build_entry(spec, i, owner) for i, spec in enumerate(self.transforms))
        for i, t in enumerate(self.transforms):
            if t.kind not in ("warp", "photometric"):
                raise self.error(f"transforms[{i}]", f"{type(t).__name__} (kind {t.kind!r}) cannot be part of a "
                                 "composition: only geometric or photometric transforms")
        kinds = [t.kind for t in self.transforms]
        if len(set(kinds)) > 1:
            g, p = kinds.index("warp"), kinds.index("photometric")
            raise self.error("transforms", f"mixes geometric (transforms[{g}] {type(self.transforms[g]).__name__}) and "
                             f"photometric (transforms[{p}] {type(self.transforms[p]).__name__}) transforms; "
                             "write one composition of each")
        self.kind = kinds[0]
        self.slots = self.slot_children()
        if self.kind == "warp":
            self._setup_geometry()
        else:
            for i, t in enumerate(self.transforms):
                if t.neutral is None:
                    raise self.error(f"transforms[{i}]", f"{type(t).__name__} cannot be skipped for some samples only "
                                     "(it changes the channel count)")
            self.param_names = tuple(f"{s}.{name}" for s, t in enumerate(self.slots) for name in t.param_names)
            self.neutral = tuple(v for t in self.slots for v in t.neutral)

    def _setup_geometry(self) -> None:
        self.crops = any(t.crops for t in self.transforms)
        self.reveals = any(t.reveals for t in self.transforms)
        #: a child's step may be projective (``RandomPerspective``): the warp segment is then too
        self.projective = any(getattr(t, "projective", False) for t in self.transforms)
        fills = {float(t.fill) for t in self.transforms if t.reveals}
        if len(fills) > 1:
            raise self.error("transforms", f"its transforms reveal area with different fills {sorted(fills)}: "
                             "one composition is one warp with one fill")
        self.fill = fills.pop() if fills else 0.0
        if self.chains:
            index = {id(t): i for i, t in enumerate(self.transforms)}
            for a, b in itertools.combinations(range(len(self.slots)), 2):
                first, then = self.slots[a], self.slots[b]
                if first.crops and then.reveals:
                    raise self.error("transforms", f"transforms[{index[id(then)]}] {type(then).__name__} may reveal area "
                                     f"after transforms[{index[id(first)]}] {type(first).__name__} cropped: in one warp "
                                     "the cropped area would show again; put them in separate entries")

    # -- what subclasses define -----------------------------------------------------------------

    def slot_children(self) -> list[Transform]:
        """The children in the order they may run (a child may appear more than once)."""
        return list(self.transforms)

    def choose(self, rand: SampleRandom) -> np.ndarray:
        """bool ``[B, S]``: which of :attr:`slots` each sample applies; a fixed number of draws."""
        raise NotImplementedError

    def chains_of_slots(self) -> list[tuple[int, ...]]:
        """Every sequence of slots one sample may apply (for :meth:`out_size`)."""
        raise NotImplementedError

    # -- planning ---------------------------------------------------------------------------------

    def plan(self, state: PlanState | SampleRandom) -> Any:
        """Geometric: ``(step [B, 3, 3], canvas_hw [B, 2])`` from a ``PlanState``; photometric:
        the parameters from a ``SampleRandom`` (as :meth:`plan_on` without a canvas)."""
        if self.kind == "warp":
            return self._plan_geometry(state)  # type: ignore[arg-type]
        return self.plan_on(state, None)  # type: ignore[arg-type]

    def _plan_geometry(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        applied = self.choose(state.rand)
        fork = fork_state(state)
        total = np.broadcast_to(np.eye(3), (state.batch_size, 3, 3)).copy()
        for s, t in enumerate(self.slots):
            chosen = applied[:, s]
            alive = fork.alive.copy()
            step, canvas = t.plan(fork)
            step = where_applied(chosen, step)
            canvas = np.where(chosen[:, None], canvas, fork.canvas_hw)
            fork.alive = np.where(chosen[fork.sample], fork.alive, alive)
            fork.apply(step, canvas, crops=t.crops)
            total = step @ total
        state.alive = fork.alive
        return total, fork.canvas_hw

    def plan_on(self, rand: SampleRandom, canvas_hw: np.ndarray | None) -> list[np.ndarray]:
        """Photometric: every child's parameters, the child's neutral values where not chosen."""
        applied = self.choose(rand)
        out = []
        for s, t in enumerate(self.slots):
            params = t.plan_on(rand, canvas_hw)
            out += [np.where(applied[:, s], p, v).astype(np.float32) for p, v in zip(params, t.neutral)]
        return out

    def _split(self, params: list[Any]) -> list[list[Any]]:
        out, start = [], 0
        for t in self.slots:
            out.append(params[start:start + len(t.param_names)])
            start += len(t.param_names)
        return out

    def dali(self, images: Any, params: list[Any]) -> Any:
        for t, p in zip(self.slots, self._split(params)):
            images = t.dali(images, p)
        return images

    def hidden_regions(self, params: list[np.ndarray], canvas_hw: np.ndarray) -> np.ndarray | None:
        regions = [t.hidden_regions(p, canvas_hw) for t, p in zip(self.slots, self._split(params))]
        regions = [r for r in regions if r is not None]
        return np.concatenate(regions, axis=1) if regions else None

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        if self.kind != "warp":
            return in_size
        sizes = set()
        for chain in self.chains_of_slots():
            size = in_size
            for s in chain:
                size = self.slots[s].out_size(size)
            sizes.add(None if size is None else (int(size[0]), int(size[1])))
        return sizes.pop() if len(sizes) == 1 else None

    def __repr__(self) -> str:
        inner = ", ".join(map(repr, self.transforms))
        rest = "".join(f", {p.name}={getattr(self, p.name)!r}" for p in self.schema if p.name != "transforms")
        return f"{type(self).__name__}([{inner}]{rest})"


def _pick_one(rand: SampleRandom, weights: tuple[float, ...] | None, count: int) -> np.ndarray:
    """int ``[B]``: a child index per sample, by ``weights`` (uniform when ``None``); one draw."""
    u = rand.random()
    if weights is None:
        return np.minimum((u * count).astype(np.int64), count - 1)
    cumulative = np.cumsum(weights) / np.sum(weights)
    return np.minimum(np.searchsorted(cumulative, u, side="right"), count - 1)


def _check_weights(t: Composition, field: str, weights: tuple[float, ...] | None) -> None:
    if weights is None:
        return
    if len(weights) != len(t.transforms):
        raise t.error(field, f"gives {len(weights)} weights for {len(t.transforms)} transforms")
    if sum(weights) <= 0:
        raise t.error(field, f"weights must not all be 0, got {list(weights)!r}")


@register
class OneOf(Composition):
    """Apply one of ``transforms``, chosen per sample by ``weights`` (uniformly when null), with
    probability ``p`` (albumentations ``OneOf``, whose default ``p`` is 0.5 and whose weights are
    the children's ``p``; here the chosen child runs with its own ``p``)."""

    schema = (
        _TRANSFORMS,
        Param("p", "probability", 1.0, "probability of applying one of the transforms"),
        Param("weights", "numbers", None, _WEIGHTS_DOC, lengths=tuple(range(1, 257)), low=0, optional=True),
    )
    chains = False

    def setup(self) -> None:
        super().setup()
        _check_weights(self, "weights", self.weights)

    def choose(self, rand: SampleRandom) -> np.ndarray:
        apply = rand.random() < self.p
        k = _pick_one(rand, self.weights, len(self.slots))
        return apply[:, None] & (k[:, None] == np.arange(len(self.slots)))

    def chains_of_slots(self) -> list[tuple[int, ...]]:
        return [(s,) for s in range(len(self.slots))] + ([()] if self.p < 1 else [])


@register
class RandomChoice(Composition):
    """Apply one of ``transforms``, chosen per sample with probabilities ``p`` (relative weights;
    uniform when null), as torchvision ``RandomChoice``."""

    schema = (
        _TRANSFORMS,
        Param("p", "numbers", None, _WEIGHTS_DOC, lengths=tuple(range(1, 257)), low=0, optional=True),
    )
    chains = False

    def setup(self) -> None:
        super().setup()
        _check_weights(self, "p", self.p)

    def choose(self, rand: SampleRandom) -> np.ndarray:
        k = _pick_one(rand, self.p, len(self.slots))
        return k[:, None] == np.arange(len(self.slots))

    def chains_of_slots(self) -> list[tuple[int, ...]]:
        return [(s,) for s in range(len(self.slots))]


@register
class RandomApply(Composition):
    """Apply all of ``transforms``, in order, with probability ``p``, or none of them
    (torchvision ``RandomApply``)."""

    schema = (
        _TRANSFORMS,
        Param("p", "probability", 0.5, "probability of applying the transforms (all or none)"),
    )

    def choose(self, rand: SampleRandom) -> np.ndarray:
        apply = rand.random() < self.p
        return np.repeat(apply[:, None], len(self.slots), axis=1)

    def chains_of_slots(self) -> list[tuple[int, ...]]:
        return [tuple(range(len(self.slots)))] + ([()] if self.p < 1 else [])


@register
class SomeOf(Composition):
    """Apply ``n`` of ``transforms``, drawn uniformly per sample (with ``replace``, a transform may
    be drawn several times and then runs that many times), in list order, with probability ``p``
    (albumentations ``SomeOf``, whose draw is weighted by the children's ``p``)."""

    schema = (
        _TRANSFORMS,
        Param("n", "int", 1, "how many transforms to apply", low=1),
        Param("replace", "bool", False, "draw with replacement (a transform may run several times)"),
        Param("p", "probability", 1.0, "probability of applying the n transforms"),
    )

    def setup(self) -> None:
        if not self.replace and isinstance(self.transforms, tuple) and self.n > len(self.transforms):
            raise self.error("n", f"{self.n} transforms without replacement, but only {len(self.transforms)} given")
        self.chains = self.n > 1
        super().setup()

    def slot_children(self) -> list[Transform]:
        repeat = self.n if self.replace else 1
        return [t for t in self.transforms for _ in range(repeat)]

    def choose(self, rand: SampleRandom) -> np.ndarray:
        k, apply = len(self.transforms), rand.random() < self.p
        if not self.replace:
            u = rand.random(k)
            rank = np.argsort(np.argsort(u, axis=1, kind="stable"), axis=1, kind="stable")
            return apply[:, None] & (rank < self.n)
        drawn = rand.integers(k, self.n)  # [B, n]
        counts = (drawn[:, :, None] == np.arange(k)).sum(axis=1)  # [B, k]
        runs = counts[:, :, None] > np.arange(self.n)  # slot (child j, run r) for j, r
        return apply[:, None] & runs.reshape(len(drawn), k * self.n)

    def chains_of_slots(self) -> list[tuple[int, ...]]:
        k = len(self.transforms)
        if self.replace:
            picks = itertools.combinations_with_replacement(range(k), self.n)
            chains = []
            for pick in picks:
                runs = {j: pick.count(j) for j in set(pick)}
                chains.append(tuple(j * self.n + r for j in sorted(runs) for r in range(runs[j])))
        else:
            chains = list(itertools.combinations(range(k), self.n))
        return chains + ([()] if self.p < 1 else [])
