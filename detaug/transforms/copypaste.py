"""``CopyPaste``: some of a partner's objects pasted in by their masks (Simple Copy-Paste), a
``"blend"`` stage of the mixing kind (the partners' rule is :mod:`detaug.transforms.mixing`'s)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from detaug.boxes import scale_matrix, translation_matrix
from detaug.decode_regions import aligned_roi, whole_image
from detaug.plan import PlanState
from detaug.plan_layout import PlanFieldSpec
from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, register
from detaug.transforms.mixing import _POOL, BlendTransform

__all__ = ["CopyPaste"]


@register
class CopyPaste(BlendTransform):
    """Paste some of a partner's objects, by their masks, onto the sample (Simple Copy-Paste,
    Ghiasi et al. 2021; MMDetection's ``CopyPaste``).

    With probability ``p`` a partner image (see :mod:`detaug.transforms.mixing`) is resized to the current
    canvas (stretched, as ``CutMix`` places it: the objects keep their place relative to the
    image) and a random subset of its objects is pasted: ``ceil(fraction * n)`` of its ``n``
    objects, at most ``max_objects`` (``None``: no limit), chosen uniformly without replacement
    (one draw per sample, in the recipe's order, seeds the choice). The pasted objects lie on
    top: each of the sample's objects loses the pixels of its mask under the pasted masks, its
    box becomes the bounds of what is left of its mask (within its box), and it is dropped where
    less than ``min_visibility`` of its mask's area is left (or nothing); the pasted objects'
    boxes, labels and masks are added. Objects are pasted by their masks, so the recipe's source
    must carry masks (:class:`~detaug.errors.RecipeError` otherwise).

    Pixels: the partner is warped to the canvas (bilinear) and taken where the sample's *paste
    mask* is 1: uint8 ``[H, W, 1]``, the union of the chosen objects' masks moved to the canvas
    (nearest), built on the host by the planner (:meth:`paste_image`) and fed to the pipeline as
    one more input (``PlannedBatch.pasted``), the same on the CPU and the GPU. Targets: updated
    on the host once the masks are moved to the output canvas (:meth:`paste_targets`), so the
    occlusion is decided on the output's pixels, by the pasted objects kept in the output (a
    pasted object dropped later, by a crop or ``min_size``, still covers the others' pixels in
    the image, not in their masks). Keypoints and rotated boxes of an occluded object are not
    changed. The canvas size before ``CopyPaste`` must be fixed by the recipe; a recipe blends
    once (``MixUp``, ``CutMix`` or ``CopyPaste``).
    """

    schema = (
        Param("p", "probability", 0.5, "probability of pasting a partner's objects onto a sample"),
        Param("fraction", "probability", 1.0, "share of the partner's objects pasted (rounded up)"),
        Param("max_objects", "int", None, "most objects pasted per sample (None: no limit)", low=0, optional=True),
        Param("min_visibility", "probability", 0.0, "a sample's object is dropped where less than this share of "
              "its mask's area is left uncovered by the pasted masks (and where nothing is)"),
        Param("fill", "number", 114, "grey level (0-255) the partner's warp reads beyond its image's edge",
              low=0, high=255),
        _POOL,
    )
    pastes_masks = True

    def draw_needed(self, rand: SampleRandom) -> np.ndarray:
        return (rand.random() < self.p)[:, None]

    def plan_fields(self) -> list[PlanFieldSpec]:
        return [("copypaste.roi", (4,), "float32", "decode region (x, y, w, h) of the partner"),
                ("copypaste.matrix", (2, 3), "float32", "forward map of the partner from its region to the canvas"),
                ("copypaste.size", (2,), "float32", "(h, w) of the canvas the partner is placed on"),
                ("copypaste.applied", (), "int32", "1 where the partner's objects are pasted, 0 elsewhere"),
                ("copypaste.choice", (), "float32", "the draw in [0, 1) that chooses the objects pasted")]

    def plan_blend(self, state: PlanState, apply: np.ndarray, partner_hw: np.ndarray, layers: np.ndarray,
                   whole: bool) -> dict[str, np.ndarray]:
        n, canvas = state.batch_size, state.canvas_hw
        # seeds the choice of objects (always drawn: one draw per sample), as the plan carries it
        u = state.rand.random().astype(np.float32).astype(np.float64)
        m = scale_matrix(canvas[:, 1] / partner_hw[:, 1], canvas[:, 0] / partner_hw[:, 0])
        rects = np.stack([np.zeros(n), np.zeros(n), canvas[:, 1], canvas[:, 0]], axis=1)
        state.place_layers(layers, m, rects, alive=apply)
        for i in np.flatnonzero(apply):
            rows = np.flatnonzero(state.box_layer == layers[i])
            state.alive[rows[~self.choose(u[i], len(rows))]] = False
        roi = whole_image(partner_hw) if whole else aligned_roi(partner_hw, m, rects)
        return {"copypaste.roi": roi, "copypaste.matrix": (m @ translation_matrix(roi[:, 0], roi[:, 1]))[:, :2, :],
                "copypaste.size": canvas, "copypaste.applied": np.asarray(apply, dtype=np.int32), "copypaste.choice": u}

    def paste_image(self, masks: Sequence[np.ndarray], partner_hw: Sequence[float], canvas_hw: Sequence[float],
                    choice: float, applied: bool) -> np.ndarray:
        """uint8 ``[H, W, 1]``: where the pixels of the partner's chosen objects land on the
        canvas ``(H, W)`` pasted on (1) or not (0), for one sample; ``masks``: the partner's
        objects' masks (uint8 ``[h, w]`` each, its image's frame), all of them, in order;
        ``choice``, ``applied``: the sample's plan fields. Each chosen mask is moved by the
        partner's stretch to the canvas (:func:`detaug.masks.warp_mask`, nearest): the same
        pixels as its moved mask there. ``[1, 1, 1]`` zeros where nothing is pasted."""
        from detaug.masks import warp_mask

        h, w = int(canvas_hw[0]), int(canvas_hw[1])
        if not applied or not len(masks):
            return np.zeros((1, 1, 1), dtype=np.uint8)
        m = scale_matrix(w / float(partner_hw[1]), h / float(partner_hw[0]))
        m = m[0] if m.ndim == 3 else m
        out = np.zeros((h, w), dtype=np.uint8)
        for k in np.flatnonzero(self.choose(choice, len(masks))):
            out |= warp_mask(masks[k], m, (h, w))
        return out[:, :, None]

    def choose(self, u: float, count: int) -> np.ndarray:
        """bool ``[count]``: which of a partner's ``count`` objects are pasted, for the sample's
        draw ``u`` in ``[0, 1)``: ``min(ceil(fraction * count), max_objects)`` of them, uniformly
        without replacement (NumPy's PCG64 seeded by ``u``: the same on every machine)."""
        k = min(math.ceil(self.fraction * count - 1e-9), count)
        if self.max_objects is not None:
            k = min(k, int(self.max_objects))
        out = np.zeros(count, dtype=bool)
        if k > 0:
            order = np.random.default_rng(int(u * 2.0 ** 53)).permutation(count)
            out[order[:k]] = True
        return out

    def paste_targets(self, boxes: np.ndarray, masks: np.ndarray,
                      pasted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One output sample's targets after the paste (:func:`detaug.masks.paste_over` with
        this transform's ``min_visibility``): ``(keep bool [N], boxes [N, 4], masks [N, H, W])``
        for its boxes ``[N, 4]`` xyxy and moved masks uint8 ``[N, H, W]``, ``pasted`` bool ``[N]``
        marking the pasted objects."""
        from detaug.masks import paste_over

        return paste_over(boxes, masks, pasted, self.min_visibility)

    def dali_blend(self, graph: Any, images: Any, own: Any, slots: Sequence[int]) -> Any:
        """The partner warped to the canvas, its pixels taken where the sample's paste mask
        (:meth:`paste_image`, the pipeline's ``graph.pasted`` input) is 1:
        ``images * (1 - a) + partner * a``; DALI's conditional runs it on the samples it applies to."""
        from nvidia.dali import fn, types

        mate = graph.partner(slots[0], own, "copypaste.roi")
        applied = graph.value("copypaste.applied")
        if applied > 0:
            partner_image = graph.warp(mate, "copypaste.matrix", "copypaste.size", self.fill)
            a = graph.pasted.gpu() if graph.on_gpu else graph.pasted
            a = fn.cast(a, dtype=types.UINT8)
            images = fn.cast(images * (1 - a) + partner_image * a, dtype=types.UINT8)
        return images
