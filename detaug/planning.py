"""Planning batches on the host, before DALI: which samples, read and checked, then planned.

Batch ``step`` of ``epoch`` on one rank is a pure function of the dataset, the recipe and
:class:`~detaug.epochs.EpochSpec` (see :mod:`detaug.epochs` for the order and the shards, :mod:`detaug.seeds`
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
of time (:mod:`detaug.plan_ahead` runs :func:`~detaug.plan_jobs.plan_group_job` in worker processes), and again
after a resume, with the same result; and because a sample's plan does not depend on its
batch-mates (partners from ``pool="batch"`` aside), consecutive batches can be planned by one
``plan_batch`` call (:meth:`BatchPlanner.plan_many`), with the same result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from detaug.decoded_shapes import DecodedShapes
from detaug.epochs import EpochSpec, batch_slice
from detaug.errors import DatasetError, ImageError, RecipeError
from detaug.field_selection import AREA, select_fields
from detaug.formats.images import annotation_frame, exif_matrix, orient_boxes, probe_image
from detaug.gathered import (
    _boxes_from_masks, _clip_to_image, _Findings, _Gathered, _placeholder, _reason, _row_labels, _Rows, _without_noise,
)
from detaug.keypoints import KEYPOINTS, flip_permutation, move_keypoints, orient_keypoints
from detaug.masks import MASKS, mask_rows, move_masks
from detaug.plan import Partners
from detaug.planned_batch import PlannedBatch
from detaug.rotated import ROTATED_BOXES, move_rotated_boxes, orient_rotated_boxes
from detaug.seeds import sample_keys
from detaug.sources import box_area, field_specs

if TYPE_CHECKING:  # the planner reads a recipe through its methods; recipes sit above it (tests/test_layers.py)
    from detaug.transforms import Compose

__all__ = ["ON_ERROR", "BatchPlanner"]

#: What an unreadable or undecodable image does: ``"skip"`` (replaced, named, counted) or ``"raise"``.
ON_ERROR = ("skip", "raise")


class BatchPlanner:
    """Plans the batches of one rank (picklable: worker processes get a copy).

    Args:
        source: a source of :mod:`detaug.sources` (or :class:`~detaug.decoded_shapes.DecodedShapes` in a worker).
        transforms: the recipe.
        spec: the epoch rules and seed.
        on_error: ``"skip"`` or ``"raise"`` (see the module docstring, step 2).
        fields: the per-box fields to carry (:func:`~detaug.field_selection.select_fields`: ``"all"`` the source's,
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
