"""The batch planner of a recipe: one batch's parameters and output boxes, and where to decode.

:func:`plan_batch` runs a :class:`~detaug.transforms.Compose` on the host (NumPy) for a batch:
it draws every transform's parameters from the samples' streams (:mod:`detaug.seeds`), moves the
boxes through a :class:`~detaug.plan.PlanState` (:mod:`detaug.plan` says in which order), and
works out what DALI must read: the decode region of each image (only what the first warp reads,
:mod:`detaug.decode_regions`),
each warp segment's matrix relative to it, and the parameters of the photometric transforms.
The recipe is read through its attributes and its transforms' methods; this module names no
transform. :mod:`detaug.planning` calls it (through ``Compose.plan_batch``) before DALI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from detaug.boxes import translation_matrix
from detaug.decode_regions import decode_roi, region_roi, whole_image
from detaug.plan import Partners, PlanState
from detaug.seeds import SampleRandom, as_keys

if TYPE_CHECKING:  # the recipe sits above this module (tests/test_layers.py)
    from detaug.transforms import Compose

__all__ = ["hidden_share", "partner_block", "plan_batch"]


def partner_block(recipe: Compose, rand: SampleRandom, dataset_size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The partner draws at the start of each sample's stream: ``(positions [B, J], needed
    [B, J] bool)``: a dataset position per slot (``-1`` when ``dataset_size`` is None), or
    for ``recipe.batch_slots`` a batch position (uniform over the ``B`` samples of ``rand``);
    then each mixing transform's :meth:`~detaug.transforms.mixing.MixingTransform.draw_needed`
    (the counter ends at ``J + 1`` with ``MixUp``, ``J`` without)."""
    j, n = recipe.num_partners, rand.batch_size
    highs = np.array([n if pool == "batch" else (dataset_size or 1) for pool in recipe.slot_pools], np.int64)
    positions = rand.integers(highs, j) if j else np.zeros((n, 0), np.int64)
    if dataset_size is None:
        dataset = np.array([pool == "dataset" for pool in recipe.slot_pools], dtype=bool)
        positions[:, dataset] = -1
    needed = np.ones((n, j), dtype=bool)
    for t, slots in zip(recipe.mixing, recipe.mixing_slots):
        needed[:, list(slots)] = t.draw_needed(rand)
    return positions, needed


def plan_batch(
    recipe: Compose,
    shapes: list[np.ndarray],
    boxes: list[np.ndarray],
    labels: list[np.ndarray],
    keys: np.ndarray | list[np.ndarray],
    partners: Partners | None = None,
    *,
    geometry: bool = False,
) -> tuple[list[np.ndarray], ...]:
    """Plan one batch of ``recipe`` (a :class:`~detaug.transforms.Compose`, whose
    :meth:`~detaug.transforms.Compose.plan_batch` this is, with the recipe as ``self``); a
    scheduled recipe plans at the epoch of ``keys`` (:meth:`~detaug.transforms.Compose.for_keys`).

    Args:
        shapes: per sample, the decoded image shape ``(H, W, C)`` (int).
        boxes: per sample, float32 ``[N, 4]`` absolute xyxy boxes on the source image.
        labels: per sample, int ``[N]`` (or ``[N, 1]``) category ids.
        keys: int64 ``[B, 3]`` sample keys ``(seed, epoch, image_id)`` from
            :func:`detaug.seeds.sample_keys` (or a list of ``B`` such rows). Sample ``k``'s
            outputs are a pure function of ``keys[k]``, ``shapes[k]``, ``boxes[k]`` and
            ``labels[k]`` (and its partners'): planning it alone or in any batch gives the
            same arrays, except for the partner slots of ``recipe.batch_slots``, which are
            positions in this batch.
        partners: the partner images (required when ``recipe.num_partners`` > 0), in the slots
            of :meth:`~detaug.transforms.Compose.partner_draws`.

    Returns:
        Three per-sample lists: the parameter vectors (float32 ``[num_params]``: decode ROI
        ``(x, y, w, h)``; per Mosaic tile its ROI, matrix ``[2, 3]`` and size; per warp
        segment the forward matrix (``[2, 3]`` row-major, ``[3, 3]`` when projective) and the
        output size ``(h, w)``; MixUp's partner ROI, matrix, size and blend ratio; per
        photometric transform its parameters; ``recipe.plan_layout`` names them), the output boxes
        (float32 ``[M, 4]`` xyxy: the sample's boxes first, then each partner's) and labels
        (int32 ``[M]``); with ``geometry``, a fourth list: per sample the
        :class:`~detaug.plan.PointGeometry` of its kept boxes, in the same order (what moves
        their points: keypoints, :mod:`detaug.keypoints`).
    """
    recipe = recipe.for_keys(keys)
    n = len(shapes)
    keys = as_keys(keys, batch_size=n)
    j = recipe.num_partners
    if j and partners is None:
        raise ValueError("this recipe mixes images (Mosaic/MixUp): plan_batch needs their partners "
                         "(detaug.planning.BatchPlanner draws and reads them)")
    images = [(shapes, boxes, labels)]
    if j:
        images += [(partners.shapes[k], partners.boxes[k], partners.labels[k]) for k in range(j)]  # type: ignore[union-attr]
    k_img = len(images)
    hw_all = np.zeros((n, k_img, 2))
    box_arrays, label_arrays, layer_ids = [], [], []
    for i in range(n):
        for k, (sh, bx, lb) in enumerate(images):
            hw_all[i, k] = np.asarray(sh[i]).ravel()[:2]
            b = np.asarray(bx[i], dtype=np.float64).reshape(-1, 4)
            lab = np.asarray(lb[i]).reshape(-1).astype(np.int32)
            if len(b) != len(lab):
                where = f"sample {i}" if k == 0 else f"partner {k} of sample {i}"
                raise ValueError(f"{where} of the batch has {len(b)} boxes but {len(lab)} labels")
            box_arrays.append(b)
            label_arrays.append(lab)
            layer_ids.append(np.full(len(b), i * k_img + k, dtype=np.int64))
    hw = hw_all[:, 0].copy()
    counts = np.array([len(b) for b in box_arrays], dtype=np.int64)
    flat_boxes = np.concatenate(box_arrays) if box_arrays else np.zeros((0, 4))
    flat_labels = np.concatenate(label_arrays) if label_arrays else np.zeros(0, np.int32)
    rand = SampleRandom(keys)
    batch_index = np.zeros((n, 0), np.int64)
    if j:
        batch_index, needed = partner_block(recipe, rand, None)
        box_layer = np.concatenate(layer_ids) if layer_ids else np.zeros(0, np.int64)
        state = PlanState(rand=rand, source_hw=hw, boxes_src=flat_boxes, sample=box_layer // k_img,
                          layer_hw=hw_all.reshape(-1, 2), layer_owner=np.repeat(np.arange(n), k_img), box_layer=box_layer)
    else:
        needed = np.zeros((n, 0), dtype=bool)
        state = PlanState(rand=rand, source_hw=hw, boxes_src=flat_boxes,
                          sample=np.repeat(np.arange(n), counts))
    # image k of sample i is layer i * k_img + k: the sample's own (k = 0), then partner slot k - 1
    composer, blender = recipe.canvas_stage, recipe.blend_stage
    whole = [bool(recipe.batch_slots)] + [k in recipe.batch_slots for k in range(j)]  # decoded whole, shared
    if blender is not None:  # the partner's boxes wait for the blend
        blend_images = [1 + k for k in recipe.slots_of(blender)]
        state.alive[np.isin(state.box_layer % k_img, blend_images)] = False
    if composer is not None:
        canvas_images = [0] + [1 + k for k in recipe.slots_of(composer)]
        layers = np.arange(n)[:, None] * k_img + np.array(canvas_images)[None, :]
        composed = needed[:, list(recipe.slots_of(composer))].any(axis=1)  # Mosaic's p
        placed = composer.plan_canvas(state, hw_all[:, canvas_images], layers, composed)
        if recipe.segments:  # the canvas is drawn, then warped: no box of what it does not draw
            state.drop_undrawn()

    def plan_blend() -> dict[str, np.ndarray]:
        k = blend_images[0]
        return blender.plan_blend(state, needed[:, k - 1], hw_all[:, k], np.arange(n) * k_img + k, whole[k])

    segment_out: list[tuple[np.ndarray, np.ndarray]] = []
    mix = None
    start = state.to_canvas
    for s, segment in enumerate(recipe.segments):
        if blender is not None and s == recipe.blend_at:
            mix = plan_blend()
            state.drop_undrawn()  # the partner drawn on the canvas, then warped
        for t in segment:
            step, canvas = t.plan(state)
            state.apply(step, canvas, crops=t.crops)
        state.draw()  # the segment's canvas is drawn: it cuts what a step moved partly off it
        if s < len(recipe.segments) - 1:  # ... and a later warp moves what it draws
            state.drop_undrawn()
        segment_out.append((state.to_canvas @ np.linalg.inv(start), state.canvas_hw))
        start = state.to_canvas
    if blender is not None and mix is None:
        mix = plan_blend()

    values: dict[str, np.ndarray] = {}
    if composer is not None:  # the first warp reads the composed part of the canvas
        first = segment_out[0] if segment_out and recipe.blend_at > 0 else None
        values, origin = composer.canvas_values(placed, first, [whole[k] for k in canvas_images])
        if first is not None:
            segment_out[0] = (first[0] @ translation_matrix(origin[:, 0], origin[:, 1]), first[1])
    else:
        first = segment_out[0] if segment_out else None
        if whole[0]:
            roi = whole_image(hw)
        elif first is not None and recipe.segment_projective[0]:
            roi = region_roi(hw, first[0], first[1])
        else:
            roi = decode_roi(hw, first)
        if first is not None:  # the first warp reads the decoded ROI, not the whole image
            segment_out[0] = (first[0] @ translation_matrix(roi[:, 0], roi[:, 1]), first[1])
        values["roi"] = roi
    for s, ((m, canvas), projective) in enumerate(zip(segment_out, recipe.segment_projective)):
        values[f"warp{s}.matrix"] = m if projective else m[:, :2, :]
        values[f"warp{s}.size"] = canvas
    if mix is not None:
        values.update(mix)
    photometric = [_plan_photometric(t, state) for t in recipe.photometric]
    for k, (t, p) in enumerate(zip(recipe.photometric, photometric)):
        values.update((f"photometric{k}.{name}", value) for name, value in zip(t.param_names, p))
    values.update((f"slot{k}.batch_index", batch_index[:, k]) for k in recipe.batch_slots)
    params = recipe.plan_layout.pack(values, n)

    result = state.boxes()
    visibility = result.visibility
    for t, p in zip(recipe.photometric, photometric):  # pixels painted over (RandomErasing)
        hidden = t.hidden_regions(p, state.canvas_hw)
        if hidden is not None:
            visibility = visibility * (1.0 - hidden_share(result.boxes_xyxy, hidden[state.sample]))
    wh = result.boxes_xyxy[:, 2:] - result.boxes_xyxy[:, :2]
    keep = result.keep & (wh >= max(recipe.min_size, 1e-6)).all(axis=1)
    keep &= visibility >= recipe.min_visibility
    kept_counts = np.bincount(state.sample[keep], minlength=n)
    splits = np.cumsum(kept_counts)[:-1]
    boxes_out = np.split(result.boxes_xyxy[keep].astype(np.float32) + np.float32(0.0), splits)  # no -0.0
    labels_out = np.split(flat_labels[keep], splits)
    if geometry:
        kept_rows = np.flatnonzero(keep)
        where = state.point_geometry(kept_rows)
        bounds = np.concatenate([[0], np.cumsum(kept_counts)])
        geometries = [where.take(slice(int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:])]
        for g, hw_out in zip(geometries, state.canvas_hw.astype(np.int64).tolist()):
            g.out_hw = (hw_out[0], hw_out[1])  # the output size also without boxes (masks)
        return list(params), boxes_out, labels_out, geometries
    return list(params), boxes_out, labels_out


def _plan_photometric(t: object, state: PlanState) -> list[np.ndarray]:
    """A photometric transform's parameters, on the output canvas when it asks for it."""
    plan_on = getattr(t, "plan_on", None)
    return plan_on(state.rand, state.canvas_hw) if plan_on is not None else t.plan(state.rand)  # type: ignore[attr-defined]


def hidden_share(boxes_xyxy: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """Share ``[N]`` of each output box ``[N, 4]`` covered by its sample's painted-over regions
    ``[N, R, 4]`` (xyxy, output pixels; zero-size rows for none): the sum of the overlaps, at
    most 1 (overlapping regions count twice: a box is never kept for being hidden twice)."""
    b = boxes_xyxy[:, None, :]
    iw = np.clip(np.minimum(b[..., 2], regions[..., 2]) - np.maximum(b[..., 0], regions[..., 0]), 0, None)
    ih = np.clip(np.minimum(b[..., 3], regions[..., 3]) - np.maximum(b[..., 1], regions[..., 1]), 0, None)
    area = (boxes_xyxy[:, 2] - boxes_xyxy[:, 0]) * (boxes_xyxy[:, 3] - boxes_xyxy[:, 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(area > 0, (iw * ih).sum(axis=1) / area, 0.0)
    return np.clip(share, 0.0, 1.0)
