"""Planning batches on the host, before DALI: which samples, read and checked, then planned.

Batch ``step`` of ``epoch`` on one rank is a pure function of the dataset, the recipe and
:class:`EpochSpec` (see :mod:`detaug.epochs` for the order and the shards, :mod:`detaug.seeds`
for the seed contract). :meth:`BatchPlanner.plan` computes it:

1. the batch's dataset positions: ``shard_order(epoch)[step * B : (step + 1) * B]``;
2. each sample is read (a file path is read here; encoded bytes are taken as given) and its
   header probed (:func:`detaug.formats.images.probe_image`); an image that cannot be read or
   decoded raises :class:`~detaug.errors.ImageError` with ``on_error="raise"``; with
   ``on_error="skip"`` it is replaced by the next readable sample of the rank's epoch order
   (cyclically), so the batch keeps its size, and the skip is recorded (see *Findings* below);
3. boxes annotated on the stored pixels of an EXIF-rotated image are moved to the displayed
   frame the decoder delivers (``orientation="auto"``; see :mod:`detaug.formats.images`), and
   their keypoints with them (swapped by ``keypoint_flip_pairs`` where the EXIF map mirrors);
4. a recipe with mixing transforms (``Mosaic``, ``MixUp``) draws each sample's partner images
   from its key (:meth:`detaug.transforms.Compose.partner_draws`: dataset positions uniform over
   ``len(source)``), and reads and checks them as in 2.-3.; a partner that cannot be read is
   replaced by the next position (cyclically), recorded as skipped (``on_error="raise"``:
   raised); partners that are not needed (``MixUp`` not applied) are 1x1 placeholders; with
   ``pool="batch"`` a partner is a batch-mate (a batch position from the key), read already;
5. :meth:`detaug.transforms.Compose.plan_batch` plans every sample from its key
   ``(seed, epoch, image_id)``: the decode region, warp matrices, photometric parameters and
   the exact output boxes;
6. labels and per-box fields follow their boxes: each sample's boxes (its own, then each
   partner's, in the slots' order) are planned with their row numbers as labels, and the rows
   the recipe keeps pick the labels and every field (``iscrowd``, ``difficult``, a track id,
   ...: :attr:`BatchPlanner.fields`); boxes dropped before planning (clipped away in 3.) drop
   their rows too. ``area`` is recomputed on the output boxes (``fields="all"`` gives it for
   every source); ``keypoints`` are moved by their box's own map, marked ``v = 0`` where they
   leave the image and swapped by the recipe's ``keypoint_flip_pairs`` where the sample is
   mirrored (:func:`detaug.keypoints.move_keypoints`); ``rotated_boxes`` become the
   minimum-area rectangle of their visible part (:func:`detaug.rotated.move_rotated_boxes`);
   ``masks`` are resampled by their box's map, nearest (:func:`detaug.masks.move_masks`), uint8
   ``[M, H, W]`` on the output canvas.
   Labels never change a draw: the plan
   is the same with any fields;
7. output coordinates below float32's resolution at their box's far edge (``|x1| <
   spacing(x2) / 2``) are 0: the rounding noise of the exact border rule (a rotated box cut by
   the canvas edge comes out at ``1e-15``, not 0) is not handed on.

*Findings* (``PlannedBatch.skipped`` / ``repaired``): an image that cannot be read, and the
boxes clipped when one is read (step 3), are recorded by the one batch of the epoch that holds
the image's position first (over all ranks: the rank's own), once: never by a batch that meets
it as another sample's replacement or as a partner. The loaders' lists, the concatenation of
their batches', therefore name each image once per epoch, whichever batches probe it. A position
no batch of any rank holds (left out by ``drop_last``) is recorded by each batch that meets it.

Because a batch depends on nothing else, it can be planned in any process, in any order, ahead
of time (:mod:`detaug.plan_ahead` runs :func:`plan_group_job` in worker processes), and again
after a resume, with the same result; and because a sample's plan does not depend on its
batch-mates (partners from ``pool="batch"`` aside), consecutive batches can be planned by one
``plan_batch`` call (:meth:`BatchPlanner.plan_many`), with the same result.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from detaug.epochs import batch_slice, num_batches, shard_order, shard_size
from detaug.errors import DatasetError, ImageError, RecipeError
from detaug.formats.images import annotation_frame, exif_matrix, orient_boxes, probe_image
from detaug.formats.validation import BOX_CLIPPED, BOX_OUTSIDE, Report, check_boxes
from detaug.keypoints import KEYPOINTS, flip_permutation, move_keypoints, orient_keypoints
from detaug.masks import MASKS, join_masks, mask_rows, masks_to_boxes, move_masks
from detaug.plan import Partners
from detaug.plan_layout import PlanLayout
from detaug.rotated import ROTATED_BOXES, move_rotated_boxes, orient_rotated_boxes
from detaug.seeds import sample_keys
from detaug.sources import FieldSpec, box_area, field_specs

if TYPE_CHECKING:  # the planner reads a recipe through its methods; recipes sit above it (tests/test_layers.py)
    from detaug.transforms import Compose

__all__ = [
    "FIELD_CHOICES", "ON_ERROR", "EpochSpec", "PlannedBatch", "BatchPlanner", "DecodedShapes", "DecodeFailure",
    "batch_columns", "field_outputs", "select_fields", "undecodable", "init_plan_worker", "plan_group_job",
    "source_groups",
]

#: What an unreadable or undecodable image does: ``"skip"`` (replaced, named, counted) or ``"raise"``.
ON_ERROR = ("skip", "raise")

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


@dataclass(frozen=True)
class EpochSpec:
    """What decides the batches of a rank: the epoch rules of :mod:`detaug.epochs` and the seed."""

    n: int
    batch_size: int
    shard_id: int = 0
    num_shards: int = 1
    shuffle: bool = False
    drop_last: bool = False
    seed: int = 0
    #: sizes of consecutive sample groups stored together (tar shards), or ``None``
    groups: tuple[int, ...] | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return num_batches(self.n, self.num_shards, self.batch_size, drop_last=self.drop_last)

    def after(self, epoch: int, step: int, ahead: int = 1) -> tuple[int, int]:
        """``(epoch, step)`` of the batch ``ahead`` steps after batch ``step`` of ``epoch``: past
        an epoch's last batch come the next epoch's first (what the loaders prepare while an
        epoch ends)."""
        k = step + ahead
        return epoch + k // len(self), k % len(self)

    def order(self, epoch: int) -> np.ndarray:
        """int64 ``[shard_size]``: the rank's dataset positions in ``epoch``."""
        return shard_order(self.n, epoch, shard_id=self.shard_id, num_shards=self.num_shards,
                           shuffle=self.shuffle, seed=self.seed, drop_last=self.drop_last, groups=self.groups)

    def first_places(self, epoch: int) -> np.ndarray | None:
        """int64 ``[n]``: where each dataset position first comes in ``epoch``'s order of all
        ranks (rule 1 of :mod:`detaug.epochs`, before padding); ``None`` when that is the
        position itself (no shuffle)."""
        if not self.shuffle:
            return None
        order = shard_order(self.n, epoch, shard_id=0, num_shards=1, shuffle=True, seed=self.seed,
                            drop_last=False, groups=self.groups)
        places = np.empty(self.n, dtype=np.int64)
        places[order] = np.arange(self.n, dtype=np.int64)
        return places

    def holder(self, place: int) -> tuple[int, int] | None:
        """``(shard_id, step)`` of the batch that holds the sample at ``place`` of the epoch's
        order of all ranks (:meth:`first_places`), or ``None`` when no batch holds it (left out
        by ``drop_last``). Rule 3 of :mod:`detaug.epochs`: place ``g`` is rank ``g % W``'s
        ``g // W``-th sample."""
        w = self.num_shards
        per_rank = shard_size(self.n, w, drop_last=self.drop_last)
        if place >= per_rank * w:
            return None
        within = place // w
        if within >= min(per_rank, len(self) * self.batch_size):
            return None
        return place % w, within // self.batch_size


@dataclass
class PlannedBatch:
    """One planned batch (``B`` samples).

    Attributes:
        epoch, step: which batch.
        positions: int64 ``[B]`` dataset positions of the samples (replacements included).
        image_ids: int64 ``[B]``.
        data: per sample, the image data DALI reads: uint8 ``[L]`` encoded bytes, or a decoded
            ``uint8 [H, W, 3]`` array; ``None`` where a worker planned decoded arrays from their
            shapes (the caller loads them, :meth:`BatchPlanner.load_data`).
        params: float32 ``[B, P]`` parameter vectors, laid out by :attr:`layout`: DALI's
            ``"params"`` input (:func:`detaug.pipeline.feed`); :meth:`plan` reads a field.
        boxes: per sample float32 ``[M, 4]`` xyxy boxes on the output image.
        labels: per sample int64 ``[M]``, the labels of the boxes kept, in their order.
        fields: per sample ``{name: [M, ...]}``, each field of :attr:`BatchPlanner.fields` for
            the boxes kept (``area``: float32, recomputed on the output boxes); empty dicts
            without fields.
        partners: per partner slot (``Compose.num_partners`` of them: ``Mosaic``'s tiles 1-3, then
            ``MixUp``'s partner), per sample, the image data of that partner (as ``data``; a 1x1
            placeholder where not needed), or ``None`` for a slot whose partners are batch-mates
            (``pool="batch"``: the pipeline reuses the batch's images, their batch positions are
            in ``params``); empty without mixing transforms; ``None`` with ``data`` ``None``
            (:meth:`BatchPlanner.fill_data`). A recipe with ``CopyPaste`` adds one last entry,
            :attr:`pasted`.
        partner_positions: int64 ``[B, J]`` dataset positions of the partners (replacements
            included), -1 where not needed.
        skipped: ``{"image_id", "file", "reason"}`` of each unreadable image this batch holds
            (see *Findings* in the module docstring: once per image and epoch over all batches).
        repaired: ``{"image_id", "file", "reason", "count"}`` of boxes clipped to (or dropped
            outside) an image whose size the annotation did not declare (found when read; once
            per image and epoch, as ``skipped``).
        joined: ``(counts, {"boxes", "labels", field names: arrays})``: the same ``boxes``,
            ``labels`` and ``fields`` joined over the batch (``counts[i]``: sample ``i``'s
            boxes), where the plan came from a worker that joined them for the trip
            (:mod:`detaug.plan_ahead`); else ``None``. See :func:`batch_columns`.
        pasted: ``CopyPaste``'s paste masks, uint8 ``[H, W, 1]`` per sample (1 where a pasted
            object's pixels land on the canvas pasted on; ``[1, 1, 1]`` zeros where none), the
            pipeline's last input; ``None`` for other recipes.
        layout: the fields of ``params`` by name (the recipe's ``plan_layout``,
            :mod:`detaug.plan_layout`); ``None`` for a batch built by hand without one.
    """

    epoch: int
    step: int
    positions: np.ndarray
    image_ids: np.ndarray
    data: list[np.ndarray] | None
    params: np.ndarray
    boxes: list[np.ndarray]
    labels: list[np.ndarray]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    repaired: list[dict[str, Any]] = field(default_factory=list)
    partners: list[list[np.ndarray] | None] | None = field(default_factory=list)
    partner_positions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    fields: list[dict[str, np.ndarray]] = field(default_factory=list)
    joined: tuple[list[int], dict[str, np.ndarray]] | None = None
    layout: PlanLayout | None = None
    pasted: list[np.ndarray] | None = None

    def plan(self, name: str) -> np.ndarray:
        """Plan field ``name`` of every sample: ``[B, *shape]`` in the field's dtype (for example
        ``plan("warp0.matrix")``: float32 ``[B, 2, 3]``; :attr:`layout` lists the fields)."""
        if self.layout is None:
            raise ValueError("this planned batch carries no plan layout")
        return self.layout.read(self.params, name)

    def image_arrays(self) -> list[np.ndarray]:
        """The image data the batch carries: ``data``, then each partner slot's (slots of
        batch-mates, and data left out, carry none)."""
        return list(self.data or []) + [a for images in self.partners or [] if images is not None for a in images]

    def new_findings(self, warned: set[tuple[str, str]]) -> list[str]:
        """Warning texts for this batch's skipped images and repaired boxes not warned of
        before (one per file and reason); ``warned`` is updated."""
        messages = []
        for found in self.skipped + self.repaired:
            key = (found["file"], found["reason"])
            if key not in warned:
                warned.add(key)
                verb = "skipped" if "count" not in found else f"{found['count']} box(es) of"
                messages.append(f"{verb} {found['file']} (image_id {found['image_id']}): {found['reason']}")
        return messages


def batch_columns(planned: PlannedBatch) -> tuple[list[int], np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """A batch's targets as columns over all its boxes: ``(counts, boxes, labels, fields)``:
    ``counts[i]`` sample ``i``'s boxes, ``boxes`` float32 ``[N, 4]``, ``labels`` ``[N]``, each
    field ``[N, ...]``, in sample order. Taken as they are from :attr:`PlannedBatch.joined`
    where a worker joined them (no per-sample arrays to join again), else joined here."""
    names = list(planned.fields[0]) if planned.fields else []
    if planned.joined is not None:
        counts, arrays = planned.joined
        boxes, labels = arrays["boxes"], arrays["labels"]
        fields = {name: arrays[name] for name in names}
    else:
        counts = [len(lab) for lab in planned.labels]
        boxes = np.concatenate([np.asarray(b, dtype=np.float32).reshape(-1, 4) for b in planned.boxes])
        labels = np.concatenate(planned.labels)
        fields = {name: join_masks([f[name] for f in planned.fields]) if name == MASKS else  # sizes may differ
                  np.concatenate([np.asarray(f[name]) for f in planned.fields]) for name in names}
    return list(counts), boxes.astype(np.float32, copy=False).reshape(-1, 4), labels.reshape(-1), fields


def source_groups(source: Any) -> tuple[int, ...] | None:
    """The sizes of the groups of consecutive samples ``source`` stores together (a
    :class:`~detaug.shards.ShardSource`'s tar files), for :class:`EpochSpec`; ``None`` for others."""
    sizes = getattr(source, "shard_sizes", None)
    return None if sizes is None else tuple(int(k) for k in sizes)


class BatchPlanner:
    """Plans the batches of one rank (picklable: worker processes get a copy).

    Args:
        source: a source of :mod:`detaug.sources` (or :class:`DecodedShapes` in a worker).
        transforms: the recipe.
        spec: the epoch rules and seed.
        on_error: ``"skip"`` or ``"raise"`` (see the module docstring, step 2).
        fields: the per-box fields to carry (:func:`select_fields`: ``"all"`` the source's,
            ``"none"``, or names); kept in :attr:`fields`.
    """

    def __init__(self, source: Any, transforms: Compose, spec: EpochSpec, on_error: str = "skip",
                 fields: Any = "all") -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, got {on_error!r}")
        self.source, self.transforms, self.spec, self.on_error = source, transforms, spec, on_error
        self.fields = select_fields(source, fields)
        # plan_batch gives the kept boxes' geometry (keypoints, rotated boxes: detaug.rotated; masks: detaug.masks)
        self._points = KEYPOINTS in self.fields or ROTATED_BOXES in self.fields or MASKS in self.fields
        if self._points and transforms.keypoint_flip_pairs:
            try:
                flip_permutation(transforms.keypoint_flip_pairs, field_specs(source)[KEYPOINTS].shape[0])
            except ValueError as err:
                raise RecipeError(str(err), field="keypoint_flip_pairs") from None
        paster = getattr(transforms, "blend_stage", None)
        if getattr(paster, "pastes_masks", False) and MASKS not in self.fields:
            raise RecipeError("pastes objects by their masks, but no masks are carried (the source has none, or "
                              "fields= leaves them out)", transform=type(paster).__name__)
        if getattr(transforms, "boxes_from_masks", False) and MASKS not in self.fields:
            raise RecipeError("boxes_from_masks=True, but no masks are carried (the source has none, or fields= "
                              "leaves them out): boxes cannot come from masks", field="boxes_from_masks")
        self._order: tuple[int, np.ndarray] | None = None
        self._places: tuple[int, np.ndarray | None] | None = None

    def holds(self, epoch: int, step: int, position: int) -> bool:
        """Whether batch ``step`` of ``epoch`` records what is found of ``position`` (*Findings*
        in the module docstring): it holds it first of all the batches of all ranks, or no
        batch does."""
        if self._places is None or self._places[0] != epoch:
            self._places = (epoch, self.spec.first_places(epoch))  # computed once something is found
        places = self._places[1]
        holder = self.spec.holder(int(position) if places is None else int(places[position]))
        return holder is None or holder == (self.spec.shard_id, step)

    def order(self, epoch: int) -> np.ndarray:
        """The rank's positions in ``epoch`` (cached: batches of one epoch are planned in a row)."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.spec.order(epoch))
        return self._order[1]

    def positions(self, epoch: int, step: int) -> np.ndarray:
        """int64 ``[B]``: the positions batch ``step`` of ``epoch`` asks for (before replacements)."""
        order = self.order(epoch)
        return order[batch_slice(step, self.spec.batch_size, len(order))]

    def plan(self, epoch: int, step: int, *, bad: Mapping[int, str] | None = None) -> PlannedBatch:
        """Read, check and plan batch ``step`` of ``epoch``; ``bad``: positions known to fail
        in DALI although their header is fine, with the reason (skipped as unreadable ones are)."""
        return self._assemble(self._gather(epoch, step, bad or {}))

    def plan_many(self, epoch: int, steps: Sequence[int], *, bad: Mapping[int, str] | None = None
                  ) -> list[PlannedBatch | Exception]:
        """Batches ``steps`` of ``epoch``, each as :meth:`plan` gives it, or the error planning
        it raised (:class:`~detaug.errors.ImageError` with ``on_error="raise"``, ...), in the
        order of ``steps``. The batches are read one by one, then planned by one
        :meth:`~detaug.transforms.Compose.plan_batch` call over all their samples: the recipe's
        per-call costs are paid once for the group (a sample's plan does not depend on its
        batch-mates, so the plans are the same), except for recipes whose partners are
        batch-mates (``pool="batch"``), planned batch by batch."""
        bad = bad or {}
        gathered: list[_Gathered | Exception] = []
        for step in steps:
            try:
                gathered.append(self._gather(epoch, step, bad))
            except Exception as err:  # noqa: BLE001 - this batch's error; the others are planned
                gathered.append(err)
        ready = [g for g in gathered if isinstance(g, _Gathered)]
        if len(ready) < 2 or self.transforms.batch_slots:
            return [g if isinstance(g, Exception) else self._assemble(g) for g in gathered]
        planned = self._plan_batch(_Gathered.joined_inputs(ready))
        results: list[PlannedBatch | Exception] = []
        start = 0
        for g in gathered:
            if isinstance(g, Exception):
                results.append(g)
                continue
            stop = start + len(g.image_ids)
            results.append(self._assemble(g, tuple(part[start:stop] for part in planned)))
            start = stop
        return results

    def _gather(self, epoch: int, step: int, bad: Mapping[int, str]) -> _Gathered:
        """Steps 1-4 and the rows of step 6 of the module docstring for batch ``step``: its
        samples and partners read, checked and keyed, ready for ``plan_batch``."""
        if not 0 <= step < len(self.spec):
            raise IndexError(f"batch {step} out of range for an epoch of {len(self.spec)} batches")
        order = self.order(epoch)
        wanted = self.positions(epoch, step)
        start = step * self.spec.batch_size
        positions, data, shapes, boxes, tables, ids = [], [], [], [], [], []
        findings = _Findings(lambda p: self.holds(epoch, step, p))
        for k, position in enumerate(wanted):
            candidates = (int(order[(start + k + tries) % len(order)]) for tries in range(len(order)))
            found = self._read_first(candidates, bad, findings)
            if found is None:
                raise DatasetError(f"no image of shard {self.spec.shard_id} can be read; the last: {findings.last}")
            p, (d, hw, b, table, image_id) = found
            positions.append(p)
            data.append(d)
            shapes.append(hw)
            boxes.append(b)
            tables.append(table)
            ids.append(image_id)
        image_ids = np.asarray(ids, dtype=np.int64)
        keys = sample_keys(self.spec.seed, epoch, image_ids)
        partners, partner_data, partner_positions = None, [], np.zeros((len(ids), 0), np.int64)
        partner_tables: list[list[_Rows]] = []
        if self.transforms.num_partners:
            batch = (positions, shapes, boxes, tables)
            partners, partner_tables, partner_data, partner_positions = self._partners(keys, batch, bad, findings)
        rows, lookup = _row_labels(tables, partner_tables)
        if partners is not None:
            partners = Partners(partners.shapes, partners.boxes, rows[1:])
        return _Gathered(epoch, step, np.asarray(positions, dtype=np.int64), image_ids, keys, data, shapes, boxes,
                         rows[0], lookup, partners, partner_data, partner_positions, findings.skipped,
                         findings.repaired)

    def _plan_batch(self, inputs: tuple) -> tuple[list, ...]:
        """``Compose.plan_batch`` of ``inputs``, with the kept boxes' geometry where keypoints
        are carried (asked for only then: a recipe subclass may not take the keyword)."""
        if self._points:
            return self.transforms.plan_batch(*inputs, geometry=True)
        return self.transforms.plan_batch(*inputs)

    def _assemble(self, g: _Gathered, planned: tuple[list, ...] | None = None) -> PlannedBatch:
        """Step 5 (unless ``planned`` gives its outputs: ``plan_batch``'s for these samples) and
        step 6 of the module docstring: the :class:`PlannedBatch` of a gathered batch."""
        if planned is None:
            planned = self._plan_batch(g.plan_inputs())
        params, out_boxes, kept = planned[:3]
        geometries = planned[3] if self._points else [None] * len(kept)
        out_boxes = [_without_noise(b) for b in out_boxes]
        out_labels, out_fields = [], []
        paster = getattr(self.transforms, "blend_stage", None)
        paster = paster if getattr(paster, "pastes_masks", False) else None  # CopyPaste: targets updated below
        for i, (b, r, table, geometry) in enumerate(zip(out_boxes, kept, g.lookup, geometries)):
            r = np.asarray(r, dtype=np.int64)
            picked = {name: table.fields[name][r] for name in self.fields if name in table.fields}
            if geometry is not None and MASKS in picked:
                picked[MASKS] = move_masks(picked[MASKS], geometry, geometry.out_hw)
                if paster is not None:  # the pasted objects on top: the others' masks, boxes, drops (host)
                    pasted = np.isin(r, g.partners.labels[self.transforms.slots_of(paster)[0]][i])
                    keep, b, picked[MASKS] = paster.paste_targets(b, picked[MASKS], pasted)
                    out_hw, r, b = geometry.out_hw, r[keep], b[keep]
                    geometry = geometry.take(keep)
                    geometry.out_hw = out_hw
                    picked = {name: value[keep] for name, value in picked.items()}
                if getattr(self.transforms, "boxes_from_masks", False):  # a recipe subclass may lack it
                    b = _boxes_from_masks(b, picked[MASKS])
            out_boxes[i] = b
            out_labels.append(table.labels[r])
            if geometry is not None and KEYPOINTS in picked:
                picked[KEYPOINTS] = move_keypoints(picked[KEYPOINTS], geometry, self.transforms.keypoint_flip_pairs)
            if geometry is not None and ROTATED_BOXES in picked:
                picked[ROTATED_BOXES] = move_rotated_boxes(picked[ROTATED_BOXES], geometry)
            if AREA in self.fields:
                picked[AREA] = box_area(b)
            out_fields.append({name: picked[name] for name in self.fields if name in picked})
        decoded_shapes = isinstance(self.source, DecodedShapes)
        partners = None if decoded_shapes else g.partner_data
        pasted = self._paste_masks(g, paster, np.stack(params)) if paster is not None else None
        if pasted is not None and partners is not None:
            partners = list(partners) + [pasted]  # the pipeline's last input (pipeline.input_names)
        return PlannedBatch(
            epoch=g.epoch, step=g.step, positions=g.positions, image_ids=g.image_ids,
            data=None if decoded_shapes else g.data,
            params=np.stack(params).astype(np.float32, copy=False), boxes=list(out_boxes),
            labels=out_labels, skipped=g.skipped, repaired=g.repaired,
            partners=partners, partner_positions=g.partner_positions, pasted=pasted,
            fields=out_fields, layout=self.transforms.plan_layout,
        )

    def _paste_masks(self, g: _Gathered, paster: Any, params: np.ndarray) -> list[np.ndarray]:
        """Per sample, uint8 ``[H, W, 1]``: the canvas pixels that ``paster`` (``CopyPaste``)
        pastes, from its partner's masks and the sample's plan (its ``paste_image``)."""
        layout, slot = self.transforms.plan_layout, self.transforms.slots_of(paster)[0]
        size, choice = layout.read(params, "copypaste.size"), layout.read(params, "copypaste.choice")
        applied = layout.read(params, "copypaste.applied")
        out = []
        for i, table in enumerate(g.lookup):
            rows = np.asarray(g.partners.labels[slot][i], dtype=np.int64)
            masks = table.fields[MASKS][rows] if len(rows) else []
            out.append(paster.paste_image(masks, g.partners.shapes[slot][i][:2], size[i], float(choice[i]),
                                          bool(applied[i])))
        return out

    def _read_first(self, candidates: Iterable[int], bad: Mapping[int, str], findings: _Findings,
                    loaded: Mapping[int, tuple] | None = None) -> tuple[int, tuple] | None:
        """The first of ``candidates`` that can be read: ``(position, what _read gives)``, taken
        from ``loaded`` where it is there; ``None`` when none can. Each unreadable one goes to
        ``findings`` (or is raised, with ``on_error="raise"``): the one skip rule of samples and
        partners."""
        for p in candidates:
            if loaded is not None and p in loaded:
                return p, loaded[p]
            try:
                return p, self._read(p, bad, findings)
            except ImageError as err:
                if self.on_error == "raise":
                    raise
                findings.skip(p, {"image_id": err.image_id, "file": err.file, "reason": err.reason})
        return None

    def _read(self, p: int, bad: Mapping[int, str], findings: _Findings
              ) -> tuple[np.ndarray, tuple[int, int], np.ndarray, _Rows, int]:
        """``(data, (h, w), boxes, their labels and fields, image_id)`` of position ``p``
        (:meth:`load`), boxes clipped to an image whose size was not declared (dropped with
        their rows when nothing is left; the repairs go to ``findings``); :class:`ImageError`
        when it cannot be read."""
        if p in bad:
            raise ImageError(self.source.file_of(p), self.source.samples[p].image_id, bad[p])
        d, hw, b, lab, image_id, exif = self._load(p)
        sample = self.source.samples[p]
        table = _Rows(np.asarray(lab, dtype=np.int64).reshape(-1), self._fields_of(sample))
        if exif is not None and KEYPOINTS in table.fields:  # annotated on the stored pixels, as the boxes
            table.fields[KEYPOINTS] = orient_keypoints(table.fields[KEYPOINTS], exif, self.transforms.keypoint_flip_pairs)
        if exif is not None and ROTATED_BOXES in table.fields:
            table.fields[ROTATED_BOXES] = orient_rotated_boxes(table.fields[ROTATED_BOXES], exif)
        if MASKS in table.fields:  # decoded (COCO polygons, RLE), checked against the image's size, oriented
            rows, why = mask_rows(table.fields[MASKS], hw, exif)
            if rows is None:
                raise ImageError(self.source.file_of(p), int(image_id), f"masks: {why}")
            table.fields[MASKS] = rows
        if getattr(sample, "size", None) is None and len(b):
            repaired: list[dict[str, Any]] = []
            b, keep = _clip_to_image(b, hw, self.source.file_of(p), image_id, repaired)
            findings.repair(p, repaired)
            table = table.take(keep)
        return d, hw, b, table, image_id

    def _fields_of(self, sample: Any) -> dict[str, np.ndarray]:
        """The fields of :attr:`fields` that ``sample`` holds (``area`` is computed, not read)."""
        given = getattr(sample, "fields", None)
        if not given:
            return {}
        return {name: given[name] if name == MASKS else np.asarray(given[name])
                for name in self.fields if name != AREA and name in given}

    def _partners(self, keys: np.ndarray, batch: tuple[list, ...], bad: Mapping[int, str], findings: _Findings,
                  ) -> tuple[Partners, list[list[_Rows]], list[list[np.ndarray] | None], np.ndarray]:
        """Draw, read and check the partner images of a batch (step 4 of the module docstring):
        ``(Partners for plan_batch (their labels: the source's), their labels and fields per
        slot and sample, their data per slot and sample (``None`` for a slot of
        ``Compose.batch_slots``: the pipeline takes those from the batch), positions [B, J])``.
        ``batch``: the batch's own ``(positions, shapes, boxes, tables)``, read already."""
        n = len(self.source)
        drawn, needed = self.transforms.partner_draws(keys, n)
        b, j = drawn.shape
        from_batch = self.transforms.batch_slots
        mate_positions, mate_shapes, mate_boxes, mate_tables = batch
        positions = np.full((b, j), -1, dtype=np.int64)
        shapes = [[None] * b for _ in range(j)]
        boxes = [[None] * b for _ in range(j)]
        tables: list[list[Any]] = [[None] * b for _ in range(j)]
        data: list[list[Any] | None] = [None if k in from_batch else [None] * b for k in range(j)]
        loaded: dict[int, tuple] = {}  # a position drawn twice in a batch is read once
        for i in range(b):
            for k in range(j):
                if k in from_batch:  # a batch-mate: read already, decoded once by the pipeline
                    m = int(drawn[i, k])
                    positions[i, k] = mate_positions[m] if needed[i, k] else -1
                    shapes[k][i], boxes[k][i], tables[k][i] = mate_shapes[m], mate_boxes[m], mate_tables[m]
                    continue
                if not needed[i, k]:
                    data[k][i], shapes[k][i] = self.placeholder(), (1, 1)
                    boxes[k][i], tables[k][i] = np.zeros((0, 4), np.float32), _Rows(np.zeros(0, np.int64), {})
                    continue
                candidates = (int((drawn[i, k] + tries) % n) for tries in range(n))
                found = self._read_first(candidates, bad, findings, loaded)
                if found is None:
                    raise DatasetError(f"no image of the dataset can be read as a partner; the last: {findings.last}")
                p, read = found
                loaded[p] = read
                positions[i, k] = p
                data[k][i], shapes[k][i], boxes[k][i], tables[k][i], _ = read
        labels = [[t.labels for t in slot] for slot in tables]
        return Partners(shapes, boxes, labels), tables, data, positions

    def placeholder(self) -> np.ndarray:
        """The image data fed for a partner that is not needed: a 1x1 grey image, encoded (PNG)
        or decoded as the source's images are."""
        return _placeholder(bool(getattr(self.source, "decoded", False)))

    def load(self, position: int) -> tuple[np.ndarray, tuple[int, int], np.ndarray, np.ndarray, int]:
        """``(data, (height, width) as decoded, boxes xyxy in that frame, labels, image_id)`` of a
        sample, or :class:`ImageError` when its image cannot be read or decoded."""
        return self._load(position)[:5]

    def _load(self, position: int) -> tuple[np.ndarray, tuple[int, int], np.ndarray, np.ndarray, int, np.ndarray | None]:
        """:meth:`load`, and the EXIF map ``[3, 3]`` the boxes were moved by to the decoded
        frame (``None``: not moved), for the points of the boxes (step 3 of the module docstring)."""
        source = self.source
        sample = source.samples[position]
        try:
            data, boxes, labels, image_id = source.load(position)
        except (OSError, ValueError) as err:
            raise ImageError(source.file_of(position), sample.image_id, _reason(err)) from err
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        if data.ndim != 1:  # decoded arrays: no header, no EXIF
            return data, (int(data.shape[0]), int(data.shape[1])), boxes, labels, int(image_id), None
        info = probe_image(data)
        if info.problem is not None:
            raise ImageError(source.file_of(position), int(image_id), info.problem)
        orientation = getattr(source, "orientation", "auto")
        if orientation == "ignore":
            return data, info.stored_hw, boxes, labels, int(image_id), None
        if orientation == "auto" and info.orientation != 1 and len(boxes):
            if annotation_frame(getattr(sample, "size", None), info, orientation) == "stored":
                boxes = orient_boxes(boxes, info.orientation, info.stored_hw)
                return data, info.displayed_hw, boxes, labels, int(image_id), exif_matrix(info.orientation, info.stored_hw)
        return data, info.displayed_hw, boxes, labels, int(image_id), None

    def load_data(self, positions: np.ndarray) -> list[np.ndarray]:
        """The image data of ``positions`` (a worker planned decoded arrays from their shapes)."""
        return [self.source.load(int(p))[0] for p in positions]

    def fill_data(self, planned: PlannedBatch) -> None:
        """Read the image data a worker left out (decoded arrays are planned from their shapes):
        ``planned.data`` and ``planned.partners`` (placeholders where a partner is not needed)."""
        if planned.data is None:
            planned.data = self.load_data(planned.positions)
        if planned.partners is None:
            from_batch = self.transforms.batch_slots
            planned.partners = [
                None if k in from_batch else
                [self.source.load(int(p))[0] if p >= 0 else self.placeholder() for p in planned.partner_positions[:, k]]
                for k in range(planned.partner_positions.shape[1])
            ] + ([planned.pasted] if planned.pasted is not None else [])


_PLACEHOLDERS: dict[bool, np.ndarray] = {}


def _placeholder(decoded: bool) -> np.ndarray:
    """A 1x1 grey (114) image: ``uint8 [1, 1, 3]``, or its PNG bytes ``uint8 [L]`` (read-only, cached)."""
    if decoded not in _PLACEHOLDERS:
        pixel = np.full((1, 1, 3), 114, dtype=np.uint8)
        if decoded:
            image = pixel
        else:
            from PIL import Image

            buffer = io.BytesIO()
            Image.fromarray(pixel).save(buffer, format="PNG")
            image = np.frombuffer(buffer.getvalue(), dtype=np.uint8)
        image.flags.writeable = False
        _PLACEHOLDERS[decoded] = image
    return _PLACEHOLDERS[decoded]


@dataclass
class _Rows:
    """An image's boxes' labels (int64 ``[N]``) and fields (``{name: [N, ...]}``), row for row."""

    labels: np.ndarray
    fields: dict[str, np.ndarray]

    def take(self, rows: np.ndarray) -> _Rows:
        """The rows ``rows`` (indices or a boolean mask)."""
        return _Rows(self.labels[rows], {name: arr[rows] for name, arr in self.fields.items()})


class _Findings:
    """What one batch records of the images it reads (*Findings* in the module docstring):
    the skipped images and repaired boxes of the positions ``records(position)`` says are its
    own, each position once."""

    def __init__(self, records: Any) -> None:
        self.records = records
        self.skipped: list[dict[str, Any]] = []
        self.repaired: list[dict[str, Any]] = []
        self.last: dict[str, Any] | None = None  # the last unreadable image met, recorded or not
        self._seen: set[tuple[str, int]] = set()

    def skip(self, position: int, found: dict[str, Any]) -> None:
        """Image ``position`` cannot be read (``found``: its image id, file and reason)."""
        self.last = found
        if self._first("skip", position):
            self.skipped.append(found)

    def repair(self, position: int, found: list[dict[str, Any]]) -> None:
        """Boxes of image ``position`` were repaired when it was read (``found``: by reason)."""
        if found and self._first("repair", position):
            self.repaired.extend(found)

    def _first(self, kind: str, position: int) -> bool:
        key = (kind, int(position))
        if key in self._seen or not self.records(position):
            return False
        self._seen.add(key)
        return True


@dataclass
class _Gathered:
    """A batch read and checked, not yet planned (:meth:`BatchPlanner._gather`): what
    :meth:`~detaug.transforms.Compose.plan_batch` takes (``shapes``, ``boxes``, ``rows``,
    ``keys``, ``partners``), and what the plan is assembled with (``lookup``: per sample the
    labels and fields its kept rows index; the data, positions and findings)."""

    epoch: int
    step: int
    positions: np.ndarray
    image_ids: np.ndarray
    keys: np.ndarray
    data: list[np.ndarray]
    shapes: list[tuple[int, int]]
    boxes: list[np.ndarray]
    rows: list[np.ndarray]
    lookup: list[_Rows]
    partners: Partners | None
    partner_data: list[list[np.ndarray] | None]
    partner_positions: np.ndarray
    skipped: list[dict[str, Any]]
    repaired: list[dict[str, Any]]

    def plan_inputs(self) -> tuple[list, list, list, np.ndarray, Partners | None]:
        """The arguments of ``plan_batch`` for these samples."""
        return self.shapes, self.boxes, self.rows, self.keys, self.partners

    @staticmethod
    def joined_inputs(batches: list[_Gathered]) -> tuple[list, list, list, np.ndarray, Partners | None]:
        """The arguments of one ``plan_batch`` call for the samples of ``batches``, in order
        (partner slots must not be batch positions)."""
        partners = None
        if batches[0].partners is not None:
            slots = range(len(batches[0].partners.shapes))
            partners = Partners(*([[x for g in batches for x in getattr(g.partners, name)[k]] for k in slots]
                                  for name in ("shapes", "boxes", "labels")))
        return ([s for g in batches for s in g.shapes], [b for g in batches for b in g.boxes],
                [r for g in batches for r in g.rows], np.concatenate([g.keys for g in batches]), partners)


def _row_labels(tables: list[_Rows], partner_tables: list[list[_Rows]]) -> tuple[list[list[np.ndarray]], list[_Rows]]:
    """The labels to plan with, and what the kept ones index (step 6 of the module docstring).

    Sample ``i``'s boxes (its own, then each partner slot's) are numbered ``0 .. T_i - 1`` in
    that order: ``rows[0][i]`` are its own rows, ``rows[1 + k][i]`` partner slot ``k``'s; the
    labels and fields of all of them, concatenated in the same order, are ``lookup[i]``, so
    that the kept rows index them whatever order the recipe returns its boxes in."""
    j = len(partner_tables)
    rows: list[list[np.ndarray]] = [[] for _ in range(1 + j)]
    lookup = []
    for i, own in enumerate(tables):
        parts = [own] + [partner_tables[k][i] for k in range(j)]
        start = 0
        for slot, part in enumerate(parts):
            rows[slot].append(np.arange(start, start + len(part.labels), dtype=np.int64))
            start += len(part.labels)
        if j == 0:
            lookup.append(own)
            continue
        fields = {}
        for name, arr in own.fields.items():  # a partner without the field (not of the source's kind): -1 rows
            fields[name] = np.concatenate([
                part.fields[name] if name in part.fields else np.full((len(part.labels), *arr.shape[1:]), -1, arr.dtype)
                for part in parts])
        lookup.append(_Rows(np.concatenate([part.labels for part in parts]), fields))
    return rows, lookup


def _boxes_from_masks(boxes: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """float32 ``[M, 4]``: each box replaced by its moved mask's bounds
    (:func:`detaug.masks.masks_to_boxes`), kept where its mask is empty."""
    tight = masks_to_boxes(masks)
    empty = ~np.asarray(masks).reshape(len(masks), -1).any(axis=1)
    return np.where(empty[:, None], boxes, tight).astype(np.float32)


def _without_noise(boxes: np.ndarray) -> np.ndarray:
    """float32 ``[M, 4]`` xyxy output boxes with each near edge that lies below float32's
    resolution at its far edge (``|x1| < spacing(x2) / 2``, likewise ``y1``) set to 0 (step 7 of
    the module docstring: the float64 rounding of the exact border rule, ``1e-15`` for 0)."""
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    near, far = b[:, :2], b[:, 2:]
    noise = (near != 0) & (np.abs(near) < np.spacing(np.abs(far)) / 2)
    if not noise.any():
        return b
    b = b.copy()
    b[:, :2][noise] = 0.0
    return b


def _clip_to_image(boxes: np.ndarray, hw: tuple[int, int], file: str, image_id: int,
                   repaired: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Boxes checked against the decoded image ``hw`` by the sources' own rule
    (:func:`detaug.formats.validation.check_boxes`: clipped, or dropped when no area is left):
    ``(the boxes kept, bool [N] which rows were kept)``; each repair is recorded with its count."""
    report = Report(file)
    sizes = np.tile(np.asarray(hw, dtype=np.float64), (len(boxes), 1))
    checked, keep = check_boxes(boxes, sizes, report, lambda j: (file, image_id, None))
    for reason in (BOX_CLIPPED, BOX_OUTSIDE):
        if report.counts[reason]:
            repaired.append({"image_id": image_id, "file": file, "reason": reason, "count": report.counts[reason]})
    return checked[keep], keep


def undecodable(planned: PlannedBatch) -> list[tuple[int, str]]:
    """``(dataset position, reason)`` of the encoded images of ``planned``, its samples' and
    its Mosaic/MixUp partners', that Pillow cannot decode fully: the culprits of a batch DALI
    failed on although every header was fine. Each position once, samples first."""
    from PIL import Image

    images = list(zip(planned.positions.tolist(), planned.data or []))
    for k, column in enumerate(planned.partners or []):
        if column is not None:  # None: batch-mates (pool="batch"), checked as samples
            images += [(p, d) for p, d in zip(planned.partner_positions[:, k].tolist(), column) if p >= 0]
    found, seen = [], set()
    for p, d in images:
        if d.ndim != 1 or p in seen:
            continue
        seen.add(p)
        try:
            with Image.open(io.BytesIO(d.tobytes())) as im:
                im.load()
        except Exception as err:  # noqa: BLE001 - any failure marks the culprit
            found.append((int(p), f"cannot be decoded: {err}"))
    return found


class DecodeFailure(Exception):
    """DALI failed on a batch (an image whose header was fine); the adapter finds the culprit."""

    def __init__(self, planned: PlannedBatch, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.planned = planned

    def error(self, source: Any, culprits: list[tuple[int, str]]) -> Exception:
        """What the user gets when the culprit is not skipped: an :class:`ImageError` naming the
        first of ``culprits`` (``(dataset position, reason)``, :func:`undecodable`), or, when
        there are none, a ``RuntimeError`` naming every file of the batch."""
        planned = self.planned
        if culprits:
            p, reason = culprits[0]
            return ImageError(source.file_of(p), int(source.samples[p].image_id), reason)
        files = [source.file_of(int(p)) for p in planned.positions]
        return RuntimeError(f"batch {planned.step} of epoch {planned.epoch} (files {files}) failed in DALI: {self}")


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError):  # the ImageError names the file: the cause's words, without the path again
        cause = err.__cause__ if isinstance(err.__cause__, OSError) else err
        return f"cannot read the file: {cause.strerror or cause}"
    return str(err)


class DecodedShapes:
    """What planning workers get of a source of decoded arrays: each image's shape, not its
    pixels (``load`` returns a read-only zero-stride view of that shape), boxes, labels, ids,
    per-box fields."""

    decoded = True
    orientation = "ignore"

    def __init__(self, source: Any) -> None:
        self.samples = [_Shape(np.shape(s.image), s.boxes, s.labels, s.image_id, getattr(s, "fields", None) or {})
                        for s in source.samples]
        self.field_specs = field_specs(source)

    def __len__(self) -> int:
        return len(self.samples)

    def file_of(self, index: int) -> str:
        return f"sample {index} (array {self.samples[index].shape})"

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        s = self.samples[index]
        data = np.broadcast_to(np.zeros((), np.uint8), (*s.shape[:2], 3))
        return data, s.boxes, s.labels, s.image_id


@dataclass
class _Shape:
    shape: tuple[int, ...]
    boxes: np.ndarray
    labels: np.ndarray
    image_id: int
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    size: None = None


def worker_planner(planner: BatchPlanner) -> BatchPlanner:
    """The planner to send to worker processes (decoded arrays stay in this process)."""
    if getattr(planner.source, "decoded", False) and not isinstance(planner.source, DecodedShapes):
        return BatchPlanner(DecodedShapes(planner.source), planner.transforms, planner.spec, planner.on_error,
                            fields=planner.fields)
    return planner


# -- worker processes (module-level, so that workers import neither Keras nor torch) ---------------

_PLANNER: BatchPlanner | None = None


def init_plan_worker(payload: bytes) -> None:
    """A planning worker's initializer: the pickled :class:`BatchPlanner` (:func:`planner_payload`),
    read once for all the worker's jobs."""
    global _PLANNER
    _PLANNER = pickle.loads(payload)


def plan_group_job(epoch: int, steps: Sequence[int], bad: Mapping[int, str] | None = None
                   ) -> list[PlannedBatch | Exception]:
    """In a planning worker: :meth:`BatchPlanner.plan_many` of batches ``steps`` (one batch:
    what :meth:`BatchPlanner.plan` gives, or its error)."""
    if _PLANNER is None:
        raise RuntimeError("this planning worker has no planner (init_plan_worker did not run)")
    return _PLANNER.plan_many(epoch, steps, bad=bad)


def planner_payload(planner: BatchPlanner) -> bytes:
    """The bytes :func:`init_plan_worker` takes (decoded arrays are sent as their shapes)."""
    return pickle.dumps(worker_planner(planner), protocol=pickle.HIGHEST_PROTOCOL)
