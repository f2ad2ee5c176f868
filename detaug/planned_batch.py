"""A planned batch (:class:`PlannedBatch`, what :class:`~detaug.planning.BatchPlanner` gives) and
its targets as columns over all its boxes (:func:`batch_columns`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detaug.masks import MASKS, join_masks
from detaug.plan_layout import PlanLayout

__all__ = ["BatchFindings", "PlannedBatch", "batch_columns"]


@dataclass
class BatchFindings:
    """A batch's skipped images and repaired boxes (:class:`PlannedBatch`'s ``skipped`` and
    ``repaired``) without its arrays: what the loader's caller records of a batch made in the
    background feed, whose planned batch is freed there (freeing it took 0.05-0.06 ms of the
    caller's ``next()`` a batch of 64 on the dev machine, of 0.18-0.28 ms in all)."""

    skipped: list[dict[str, Any]]
    repaired: list[dict[str, Any]]

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


@dataclass
class PlannedBatch:
    """One planned batch (``B`` samples).

    Attributes:
        epoch, step: which batch.
        positions: int64 ``[B]`` dataset positions of the samples (replacements included).
        image_ids: int64 ``[B]``.
        data: per sample, the image data DALI reads: uint8 ``[L]`` encoded bytes, or a decoded
            ``uint8 [H, W, 3]`` array; ``None`` where a worker planned decoded arrays from their
            shapes (the caller loads them, :meth:`~detaug.planning.BatchPlanner.load_data`).
        params: float32 ``[B, P]`` parameter vectors, laid out by :attr:`layout`: DALI's
            ``"params"`` input (:func:`detaug.pipeline.feed`); :meth:`plan` reads a field.
        boxes: per sample float32 ``[M, 4]`` xyxy boxes on the output image.
        labels: per sample int64 ``[M]``, the labels of the boxes kept, in their order.
        fields: per sample ``{name: [M, ...]}``, each field of :attr:`~detaug.planning.BatchPlanner.fields` for
            the boxes kept (``area``: float32, recomputed on the output boxes); empty dicts
            without fields. ``boxes``, ``labels`` and ``fields`` are lists, or, for a plan from a
            planning worker, sequences read as lists whose items are made when read
            (:class:`~detaug.sample_rows.SampleRows`: views of :attr:`joined`).
        partners: per partner slot (``Compose.num_partners`` of them: ``Mosaic``'s tiles 1-3, then
            ``MixUp``'s partner), per sample, the image data of that partner (as ``data``; a 1x1
            placeholder where not needed), or ``None`` for a slot whose partners are batch-mates
            (``pool="batch"``: the pipeline reuses the batch's images, their batch positions are
            in ``params``); empty without mixing transforms; ``None`` with ``data`` ``None``
            (:meth:`~detaug.planning.BatchPlanner.fill_data`). A recipe with ``CopyPaste`` adds one last entry,
            :attr:`pasted`.
        partner_positions: int64 ``[B, J]`` dataset positions of the partners (replacements
            included), -1 where not needed.
        skipped: ``{"image_id", "file", "reason"}`` of each unreadable image this batch holds
            (see *Findings* in :mod:`detaug.planning`: once per image and epoch over all batches).
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
    boxes: Sequence[np.ndarray]
    labels: Sequence[np.ndarray]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    repaired: list[dict[str, Any]] = field(default_factory=list)
    partners: list[list[np.ndarray] | None] | None = field(default_factory=list)
    partner_positions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    fields: Sequence[dict[str, np.ndarray]] = field(default_factory=list)
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

    @property
    def findings(self) -> BatchFindings:
        """The batch's skipped images and repaired boxes, without its arrays."""
        return BatchFindings(self.skipped, self.repaired)

    def new_findings(self, warned: set[tuple[str, str]]) -> list[str]:
        """:meth:`BatchFindings.new_findings` of this batch."""
        return self.findings.new_findings(warned)


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
