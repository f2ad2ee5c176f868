"""``Compose``: an ordered recipe of transforms, its box filters, and its (de)serialisation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from detaug.boxes import boxes_to_polygons, canvas_halfplanes, clip_polygons, polygon_bounds, translation_matrix
from detaug.errors import RecipeError
from detaug.keypoints import check_flip_pairs
from detaug.plan import Partners, PlanState
from detaug.seeds import SampleRandom, as_keys
from detaug.transforms.affine import RandomAffine
from detaug.transforms.base import TRANSFORMS, Transform
from detaug.transforms.color import ColorJitter
from detaug.transforms.composition import entry_lines, field_path
from detaug.transforms.crop import RandomIoUCrop
from detaug.transforms.flip import RandomHorizontalFlip
from detaug.transforms.mixing import MixingTransform, MixUp, Mosaic
from detaug.transforms.normalize import Normalize
from detaug.transforms.resize import Resize
from detaug.transforms.schema import Param, ParamError, closest

#: The recipe's own fields (besides ``transforms``).
RECIPE_SCHEMA = (
    Param("min_size", "number", 1.0, "boxes narrower or lower than this many output pixels are removed", low=0),
    Param("min_visibility", "probability", 0.0, "boxes with less than this share of their area visible are removed"),
)

__all__ = ["Compose", "Partners", "default_detection_recipe"]

#: Floats per ``Mosaic`` tile and for the ``MixUp`` partner in a parameter vector: decode ROI
#: ``(x, y, w, h)``, forward matrix ``[2, 3]``, output ``(h, w)`` (and the blend ratio).
TILE_PARAMS, MIXUP_PARAMS = 12, 13


class Compose:
    """An ordered list of transforms applied to images and their boxes together.

    Args:
        transforms: geometric transforms (moving pixels and boxes), mixing ones (``Mosaic``
            first, ``MixUp`` after a fixed canvas size; see :mod:`detaug.transforms.mixing`) and
            photometric ones (pixels only). ``Normalize``, if present, must come last.
        min_size: boxes narrower or lower than this many output pixels are removed.
        min_visibility: boxes with less than this fraction of their (source) area left inside
            the output image are removed.
        keypoint_flip_pairs: pairs ``(i, j)`` of keypoint indices that trade places where a
            sample is mirrored (a horizontal or a vertical flip, an odd number of them: the left
            eye becomes the right one), as COCO keypoints' ``flip_pairs``; each index in at most
            one pair. Empty: points keep their index. See :mod:`detaug.keypoints`.

    Processing order, per batch (see :mod:`detaug.plan` for the box steps):

    1. the random parameters of every transform are drawn, in list order, from each sample's own
       random stream, keyed by ``(seed, epoch, image_id)`` (:mod:`detaug.seeds`): a sample's
       plan does not depend on its batch-mates or on the batch size; a recipe with mixing
       transforms first draws the sample's partner images there (:meth:`partner_draws`);
    2. consecutive geometric transforms are fused into one warp per *segment* (affine, or
       projective when the segment holds a ``RandomPerspective``); a new segment starts where a
       transform that may reveal area outside its input (zoom-out, rotation, padding) follows one
       that cropped, where the fill value changes, and at ``MixUp``;
    3. the image is decoded (only the region the first warp reads), or, with ``Mosaic``, each tile
       decoded (only what it shows) and composed on the part of the mosaic canvas that the
       first warp reads; then warped per segment; ``MixUp`` blends its partner in between the
       segments where it stands;
    4. photometric transforms run on the output canvas, in list order; ``Normalize`` last;
    5. boxes are computed exactly (every image's boxes, each clipped by its tile and by every
       canvas), then filtered (dropped by a transform, empty, ``min_size``, ``min_visibility``)
       together with their labels; a box of which a drawn canvas that a later warp moves (the
       mosaic, the ``MixUp`` partner's canvas, a segment's output) draws nothing (a sliver
       thinner than half a pixel along a cut) is dropped there, before the warp can turn its
       outline into a box over nothing (:meth:`detaug.plan.PlanState.drop_undrawn`).
    """

    def __init__(self, transforms: Sequence[Transform], min_size: float = 1.0, min_visibility: float = 0.0,
                 keypoint_flip_pairs: Sequence[Sequence[int]] = ()) -> None:
        self.transforms = list(transforms)
        #: ``((i, j), ...)``: keypoints that trade places where a sample is mirrored
        self.keypoint_flip_pairs = check_flip_pairs(keypoint_flip_pairs)
        for i, t in enumerate(self.transforms):
            if not isinstance(t, Transform):
                raise TypeError(f"transforms[{i}] is {t!r}, not a detaug transform")
            if t.kind == "output" and i != len(self.transforms) - 1:
                raise RecipeError("must be the last transform of a recipe", transform=type(t).__name__, index=i)
        for p, value in zip(RECIPE_SCHEMA, (min_size, min_visibility)):
            try:
                setattr(self, p.name, p.normalize(value))
            except ParamError as err:
                raise RecipeError(err.message, field=p.name) from None
        self.geometric = [t for t in self.transforms if t.kind == "warp"]
        self.photometric = [t for t in self.transforms if t.kind == "photometric"]
        #: the output stage (``Normalize``), or ``None``: uint8 images
        self.output = next((t for t in self.transforms if t.kind == "output"), None)
        self.mosaic, self.mixup, mixup_at = self._check_mixing(self.transforms)
        before, fills_before = self._segments(self.geometric[:mixup_at])
        after, fills_after = self._segments(self.geometric[mixup_at:])
        self.segments, self.segment_fills = before + after, fills_before + fills_after
        #: the segment before which ``MixUp`` blends (``len(segments)``: after the last one)
        self.blend_at = len(before)
        #: per segment: it holds a projective step (DALI's perspective warp, a 3x3 matrix)
        self.segment_projective = [any(getattr(t, "projective", False) for t in seg) for seg in self.segments]

    @staticmethod
    def _check_mixing(transforms: list[Transform]) -> tuple[Mosaic | None, MixUp | None, int]:
        """``(mosaic, mixup, number of geometric transforms before MixUp)``, or a
        :class:`RecipeError` for a mixing transform where it cannot be planned."""
        mosaic = mixup = None
        mixup_at, size, fixed = 0, None, False
        for i, t in enumerate(transforms):
            name = type(t).__name__
            if t.kind == "mixing":
                if isinstance(t, Mosaic):
                    if i != 0:
                        raise RecipeError("must be the first transform of a recipe (its tiles are whole source images, "
                                          "as in YOLO)", transform=name, index=i)
                    mosaic = t
                elif isinstance(t, MixUp):
                    if mixup is not None:
                        raise RecipeError("a recipe may blend only once (one MixUp)", transform=name, index=i)
                    if not fixed:
                        raise RecipeError("needs a fixed canvas size before it: put Mosaic, Resize((h, w)), LetterBox "
                                          "or another transform with a fixed output size earlier", transform=name, index=i)
                    mixup, mixup_at = t, sum(1 for u in transforms[:i] if u.kind == "warp")
                else:
                    raise RecipeError("is a mixing transform this Compose cannot plan (only Mosaic and MixUp)",
                                      transform=name, index=i)
            if t.kind in ("warp", "mixing"):
                size = t.out_size(size)
                fixed = size is not None
        return mosaic, mixup, mixup_at

    @property
    def normalize(self) -> Normalize | None:
        """The recipe's ``Normalize``, if it ends with one."""
        return self.output if isinstance(self.output, Normalize) else None

    @staticmethod
    def _segments(geometric: list[Transform]) -> tuple[list[list[Transform]], list[float]]:
        segments: list[list[Transform]] = []
        fills: list[float] = []
        cropped, fill = False, None
        for t in geometric:
            new = not segments or (t.reveals and (cropped or (fill is not None and t.fill != fill)))
            if new:
                segments.append([])
                fills.append(0.0)
                cropped, fill = False, None
            segments[-1].append(t)
            if t.reveals and fill is None:
                fill = t.fill
                fills[-1] = t.fill
            cropped = cropped or t.crops
        return segments, fills

    # -- planning --------------------------------------------------------------------------------

    @property
    def num_partners(self) -> int:
        """Partner images per sample (``Mosaic``: 3, ``MixUp``: 1), besides its own."""
        return sum(t.partners for t in (self.mosaic, self.mixup) if t is not None)

    @property
    def slot_pools(self) -> tuple[str, ...]:
        """Per partner slot (``Mosaic``'s tiles 1-3, then ``MixUp``'s partner), where its image
        comes from: ``"dataset"`` or ``"batch"`` (the transform's ``pool``; see
        :mod:`detaug.transforms.mixing`)."""
        return tuple(t.pool for t in (self.mosaic, self.mixup) if t is not None for _ in range(t.partners))

    @property
    def batch_slots(self) -> tuple[int, ...]:
        """The partner slots whose images are other samples of the batch (``pool="batch"``): the
        pipeline takes them from the batch's decoded images instead of decoding them."""
        return tuple(k for k, pool in enumerate(self.slot_pools) if pool == "batch")

    @property
    def num_images(self) -> int:
        """Images per sample fed to the pipeline: its own and :attr:`num_partners`."""
        return 1 + self.num_partners

    @property
    def num_params(self) -> int:
        """Length of each sample's parameter vector (see :meth:`plan_batch`)."""
        def stops(part: Any) -> list[int]:
            if isinstance(part, slice):
                return [part.stop]
            if isinstance(part, dict):
                part = list(part.values())
            return [stop for item in (part or ()) for stop in stops(item)]

        return max(stops(list(self.param_slices().values())))

    def param_slices(self) -> dict[str, Any]:
        """Where each parameter sits in a sample's parameter vector: ``{"roi": slice,
        "tiles": [(roi, matrix, size), ...] (Mosaic's 4 tiles; empty without), "warps": [(matrix
        slice, size slice), ...], "mixup": (roi, matrix, size, ratio) or None, "photometric":
        [slice, ...], "batch_index": {slot: slice}}`` (``batch_index``: for each partner slot of
        :attr:`batch_slots`, the batch position of its image, last in the vector). A warp's matrix is ``[2, 3]`` (6 floats), or ``[3, 3]`` (9 floats) for a
        projective segment (:attr:`segment_projective`); tile and partner matrices are ``[2, 3]``.
        Recipes without mixing or projective transforms keep the layout ``roi, warps, photometric``."""
        start = 4

        def take(k: int) -> slice:
            nonlocal start
            start += k
            return slice(start - k, start)

        tiles = [(take(4), take(6), take(2)) for _ in range(4 if self.mosaic is not None else 0)]
        warps = [(take(9 if projective else 6), take(2)) for projective in self.segment_projective]
        mixup = (take(4), take(6), take(2), take(1)) if self.mixup is not None else None
        photometric = [take(len(t.param_names)) for t in self.photometric]
        batch_index = {k: take(1) for k in self.batch_slots}
        return {"roi": slice(0, 4), "tiles": tiles, "warps": warps, "mixup": mixup, "photometric": photometric,
                "batch_index": batch_index}

    def _partner_block(self, rand: SampleRandom, dataset_size: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The partner draws at the start of each sample's stream: ``(positions [B, J], needed
        [B, J] bool)``: a dataset position per slot (``-1`` when ``dataset_size`` is None), or
        for :attr:`batch_slots` a batch position (uniform over the ``B`` samples of ``rand``);
        the counter ends at ``J + 1`` with ``MixUp``, ``J`` without."""
        j, n = self.num_partners, rand.batch_size
        highs = np.array([n if pool == "batch" else (dataset_size or 1) for pool in self.slot_pools], np.int64)
        positions = rand.integers(highs, j) if j else np.zeros((n, 0), np.int64)
        if dataset_size is None:
            dataset = np.array([pool == "dataset" for pool in self.slot_pools], dtype=bool)
            positions[:, dataset] = -1
        needed = np.ones((n, j), dtype=bool)
        if self.mixup is not None:
            needed[:, -1] = self.mixup.draw_apply(rand)
        return positions, needed

    def partner_draws(self, keys: np.ndarray | list[np.ndarray], dataset_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The partners of a batch (see :mod:`detaug.transforms.mixing` for the rule).

        Args:
            keys: int64 ``[B, 3]`` sample keys, the batch's in its order.
            dataset_size: ``len(source)``: partners are uniform over its positions.

        Returns:
            ``(positions int64 [B, J], needed bool [B, J])`` for the :attr:`num_partners` slots
            (``Mosaic``'s tiles 1-3, then ``MixUp``'s partner): dataset positions, or for
            :attr:`batch_slots` positions in the batch (``0 .. B - 1``); a dataset slot that is
            not needed (``MixUp`` not applied to the sample) takes no image (:meth:`plan_batch`
            gets a 1x1 placeholder there).
        """
        if dataset_size < 1:
            raise ValueError(f"a recipe with mixing transforms needs a dataset with images, got {dataset_size}")
        keys = as_keys(keys)
        positions, needed = self._partner_block(SampleRandom(keys), int(dataset_size))
        return positions, needed

    def plan_batch(
        self,
        shapes: list[np.ndarray],
        boxes: list[np.ndarray],
        labels: list[np.ndarray],
        keys: np.ndarray | list[np.ndarray],
        partners: Partners | None = None,
        *,
        geometry: bool = False,
    ) -> tuple[list[np.ndarray], ...]:
        """Plan one batch (called by :mod:`detaug.planning`, before DALI).

        Args:
            shapes: per sample, the decoded image shape ``(H, W, C)`` (int).
            boxes: per sample, float32 ``[N, 4]`` absolute xyxy boxes on the source image.
            labels: per sample, int ``[N]`` (or ``[N, 1]``) category ids.
            keys: int64 ``[B, 3]`` sample keys ``(seed, epoch, image_id)`` from
                :func:`detaug.seeds.sample_keys` (or a list of ``B`` such rows). Sample ``k``'s
                outputs are a pure function of ``keys[k]``, ``shapes[k]``, ``boxes[k]`` and
                ``labels[k]`` (and its partners'): planning it alone or in any batch gives the
                same arrays, except for the partner slots of :attr:`batch_slots`, which are
                positions in this batch.
            partners: the partner images (required when :attr:`num_partners` > 0), in the slots
                of :meth:`partner_draws`.

        Returns:
            Three per-sample lists: the parameter vectors (float32 ``[num_params]``: decode ROI
            ``(x, y, w, h)``; per Mosaic tile its ROI, matrix ``[2, 3]`` and size; per warp
            segment the forward matrix (``[2, 3]`` row-major, ``[3, 3]`` when projective) and the
            output size ``(h, w)``; MixUp's partner ROI, matrix, size and blend ratio; per
            photometric transform its parameters; see :meth:`param_slices`), the output boxes
            (float32 ``[M, 4]`` xyxy: the sample's boxes first, then each partner's) and labels
            (int32 ``[M]``); with ``geometry``, a fourth list: per sample the
            :class:`~detaug.plan.PointGeometry` of its kept boxes, in the same order (what moves
            their points: keypoints, :mod:`detaug.keypoints`).
        """
        n = len(shapes)
        keys = as_keys(keys, batch_size=n)
        j = self.num_partners
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
            batch_index, needed = self._partner_block(rand, None)
            box_layer = np.concatenate(layer_ids) if layer_ids else np.zeros(0, np.int64)
            state = PlanState(rand=rand, source_hw=hw, boxes_src=flat_boxes, sample=box_layer // k_img,
                              layer_hw=hw_all.reshape(-1, 2), layer_owner=np.repeat(np.arange(n), k_img), box_layer=box_layer)
        else:
            needed = np.zeros((n, 0), dtype=bool)
            state = PlanState(rand=rand, source_hw=hw, boxes_src=flat_boxes,
                              sample=np.repeat(np.arange(n), counts))
        if self.mixup is not None:  # the partner's boxes wait for the blend
            state.alive[state.box_layer % k_img == k_img - 1] = False
        centre = None
        if self.mosaic is not None:
            tile_layers = (np.arange(n)[:, None] * k_img + np.arange(4)[None, :]).ravel()
            maps, rects, canvas, centre = self.mosaic.plan_tiles(rand, hw_all[:, :4])
            state.start_canvas(canvas)
            state.place_layers(tile_layers, maps.reshape(-1, 3, 3), rects.reshape(-1, 4))
            tile_maps, tile_rects, mosaic_hw = maps, rects, canvas
            if self.segments:  # the mosaic canvas is drawn, then warped: no box of what it does not draw
                state.drop_undrawn()

        segment_out: list[tuple[np.ndarray, np.ndarray]] = []
        mix = None
        start = state.to_canvas
        for s, segment in enumerate(self.segments):
            if self.mixup is not None and s == self.blend_at:
                mix = self._plan_mixup(state, needed[:, -1], hw_all[:, -1], k_img)
                state.drop_undrawn()  # the partner drawn on the canvas, then warped
            for t in segment:
                step, canvas = t.plan(state)
                state.apply(step, canvas, crops=t.crops)
            state.draw()  # the segment's canvas is drawn: it cuts what a step moved partly off it
            if s < len(self.segments) - 1:  # ... and a later warp moves what it draws
                state.drop_undrawn()
            segment_out.append((state.to_canvas @ np.linalg.inv(start), state.canvas_hw))
            start = state.to_canvas
        if self.mixup is not None and mix is None:
            mix = self._plan_mixup(state, needed[:, -1], hw_all[:, -1], k_img)

        columns = []
        whole = bool(self.batch_slots)  # the batch's images are decoded whole, to be shared
        if self.mosaic is not None:
            first = segment_out[0] if segment_out and self.blend_at > 0 else None
            window = _mosaic_window(mosaic_hw, centre, first)
            if first is not None:
                segment_out[0] = (first[0] @ translation_matrix(window[:, 0], window[:, 1]), first[1])
            columns.append(np.zeros((n, 4)))  # the sample's own image is tile 0
            for k in range(4):
                columns += _tile_columns(hw_all[:, k], tile_maps[:, k], tile_rects[:, k], window,
                                         whole=whole if k == 0 else k - 1 in self.batch_slots)
        else:
            first = segment_out[0] if segment_out else None
            if whole:
                roi = _whole_image(hw)
            elif first is not None and self.segment_projective[0]:
                roi = _region_roi(hw, first[0], first[1])
            else:
                roi = self._decode_roi(hw, first)
            if first is not None:  # the first warp reads the decoded ROI, not the whole image
                segment_out[0] = (first[0] @ translation_matrix(roi[:, 0], roi[:, 1]), first[1])
            columns.append(roi)
        for (m, canvas), projective in zip(segment_out, self.segment_projective):
            columns += [m.reshape(n, 9) if projective else m[:, :2, :].reshape(n, 6), canvas]
        if mix is not None:
            columns += mix
        photometric = [_plan_photometric(t, state) for t in self.photometric]
        columns += [np.stack(p, axis=1) for p in photometric if len(p)]
        columns += [batch_index[:, k:k + 1] for k in self.batch_slots]
        params = np.concatenate(columns, axis=1).astype(np.float32)

        result = state.boxes()
        visibility = result.visibility
        for t, p in zip(self.photometric, photometric):  # pixels painted over (RandomErasing)
            hidden = t.hidden_regions(p, state.canvas_hw)
            if hidden is not None:
                visibility = visibility * (1.0 - hidden_share(result.boxes_xyxy, hidden[state.sample]))
        wh = result.boxes_xyxy[:, 2:] - result.boxes_xyxy[:, :2]
        keep = result.keep & (wh >= max(self.min_size, 1e-6)).all(axis=1)
        keep &= visibility >= self.min_visibility
        kept_counts = np.bincount(state.sample[keep], minlength=n)
        splits = np.cumsum(kept_counts)[:-1]
        boxes_out = np.split(result.boxes_xyxy[keep].astype(np.float32) + np.float32(0.0), splits)  # no -0.0
        labels_out = np.split(flat_labels[keep], splits)
        if geometry:
            kept_rows = np.flatnonzero(keep)
            where = state.point_geometry(kept_rows)
            bounds = np.concatenate([[0], np.cumsum(kept_counts)])
            geometries = [where.take(slice(int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:])]
            return list(params), boxes_out, labels_out, geometries
        return list(params), boxes_out, labels_out

    def _plan_mixup(self, state: PlanState, apply: np.ndarray, partner_hw: np.ndarray, k_img: int) -> list[np.ndarray]:
        """Place ``MixUp``'s partner on the current canvas; its parameter columns."""
        n = state.batch_size
        canvas = state.canvas_hw
        m, ratio = self.mixup.plan_partner(state.rand, apply, canvas, partner_hw)  # type: ignore[union-attr]
        layers = np.arange(n) * k_img + k_img - 1
        rects = np.stack([np.zeros(n), np.zeros(n), canvas[:, 1], canvas[:, 0]], axis=1)
        state.place_layers(layers, m, rects, alive=apply)
        whole = self.mixup.pool == "batch"  # type: ignore[union-attr]
        roi = _whole_image(partner_hw) if whole else _aligned_roi(partner_hw, m, rects)
        return [roi, (m @ translation_matrix(roi[:, 0], roi[:, 1]))[:, :2, :].reshape(n, 6), canvas, ratio[:, None]]

    @staticmethod
    def _decode_roi(hw: np.ndarray, first: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """``[B, 4]`` (x, y, w, h) whole-pixel region of the source the first warp reads."""
        n = len(hw)
        full = _whole_image(hw)
        if first is None:
            return full
        m, canvas = first
        inv = np.linalg.inv(m)
        h, w = canvas[:, 0], canvas[:, 1]
        corners = np.stack([np.zeros(n), np.zeros(n), w, np.zeros(n), w, h, np.zeros(n), h], -1).reshape(n, 4, 2)
        src = (inv[:, None, :2, :2] @ corners[..., None])[..., 0] + inv[:, None, :2, 2]
        lo = np.clip(np.floor(src.min(axis=1)) - 1, 0, hw[:, ::-1])  # one pixel for bilinear taps
        hi = np.clip(np.ceil(src.max(axis=1)) + 1, 0, hw[:, ::-1])
        empty = (hi <= lo).any(axis=1)
        lo[empty], hi[empty] = 0, np.minimum(hw[empty, ::-1], 1)
        return np.concatenate([lo, hi - lo], axis=1)

    def output_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of every output image when the recipe fixes it, else ``None``."""
        size: tuple[int, int] | None = None  # the source sizes vary
        for t in self.transforms:
            if t.kind in ("warp", "mixing"):
                size = t.out_size(size)
        return None if size is None else (int(size[0]), int(size[1]))

    # -- serialisation ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A plain dict recipe: ``{"transforms": [{"name": ..., **args}, ...], "min_size", "min_visibility"}``
        (and ``"keypoint_flip_pairs": [[i, j], ...]`` where the recipe has any)."""
        out = {
            "transforms": [t.to_dict() for t in self.transforms],
            "min_size": self.min_size,
            "min_visibility": self.min_visibility,
        }
        if self.keypoint_flip_pairs:  # only when set: recipes without keypoints read as before
            out["keypoint_flip_pairs"] = [list(pair) for pair in self.keypoint_flip_pairs]
        return out

    @classmethod
    def from_dict(cls, recipe: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                  lines: Mapping[tuple, int] | None = None, file: str | None = None) -> "Compose":
        """Build a ``Compose`` from :meth:`to_dict`'s format (also accepts a bare list of transforms).

        Every problem is a :class:`~detaug.errors.RecipeError` naming the entry, the transform,
        the field and (with ``lines`` from :func:`recipe_lines`) the line: an unknown transform
        or field (with the closest known name), a value of the wrong type, a reversed range.
        """
        lines = lines or {}

        def fail(problem: str, *, where: tuple, transform: str | None = None, field: str | None = None,
                 index: int | None = None) -> RecipeError:
            return RecipeError(problem, transform=transform, field=field, index=index, line=_line(lines, where), file=file)

        if isinstance(recipe, (list, tuple)):
            recipe = {"transforms": recipe}
        if not isinstance(recipe, Mapping):
            raise fail(f"a recipe is a mapping with a 'transforms' list, got {type(recipe).__name__}", where=())
        known = ["transforms"] + [p.name for p in RECIPE_SCHEMA] + ["keypoint_flip_pairs"]
        for key in recipe:
            if key not in known:
                raise fail(f"unknown recipe key{closest(key, known)}; known: {', '.join(known)}", where=(key,), field=str(key))
        specs = recipe.get("transforms", [])
        if not isinstance(specs, (list, tuple)):
            raise fail(f"'transforms' must be a list of transforms, got {type(specs).__name__}", where=("transforms",))
        transforms = []
        for i, spec in enumerate(specs):
            here = ("transforms", i)
            if not isinstance(spec, Mapping):
                raise fail(f"an entry is a mapping with a 'name', got {spec!r}", where=here, index=i)
            spec = dict(spec)
            name = spec.pop("name", None)
            if name is None:
                raise fail("entry has no 'name'", where=here, index=i)
            if name not in TRANSFORMS:
                raise fail(f"unknown transform {name!r}{closest(name, TRANSFORMS)}", where=here + ("name",), index=i)
            try:
                transforms.append(TRANSFORMS[name](**spec))
            except RecipeError as err:
                path = field_path(err.field)
                where = here + path if path and path[0] in spec else here
                raise err.located(index=i, line=_line(lines, where), file=file) from None
        try:
            return cls(transforms, **{p.name: recipe.get(p.name, p.default) for p in RECIPE_SCHEMA},
                       keypoint_flip_pairs=recipe.get("keypoint_flip_pairs", ()))
        except RecipeError as err:
            where = (err.field,) if err.field else ("transforms", err.index) if err.index is not None else ()
            raise err.located(line=_line(lines, where), file=file) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str, *, file: str | None = None) -> "Compose":
        """Build from JSON text (:mod:`detaug.transforms.recipe_file`'s limits; every problem a
        :class:`~detaug.errors.RecipeError`)."""
        from detaug.transforms.recipe_file import load_recipe_data

        return cls.from_dict(load_recipe_data(text, kind="json", file=file), lines=recipe_lines(text), file=file)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, *, file: str | None = None) -> "Compose":
        """Build from YAML text: plain YAML only, size and alias expansion bounded
        (:mod:`detaug.transforms.recipe_file`); every problem a :class:`~detaug.errors.RecipeError`
        naming ``file`` and the line."""
        from detaug.transforms.recipe_file import load_recipe_data

        return cls.from_dict(load_recipe_data(text, kind="yaml", file=file), lines=recipe_lines(text), file=file)

    def save(self, path: str | Path) -> None:
        """Write the recipe as YAML (``.yaml``/``.yml``) or JSON (any other suffix)."""
        path = Path(path)
        text = self.to_yaml() if path.suffix.lower() in (".yaml", ".yml") else self.to_json()
        path.write_text(text, encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Compose":
        """Read a recipe written by :meth:`save` (YAML or JSON, by suffix;
        :func:`detaug.transforms.recipe_file.read_recipe_file`: every problem of the content is
        a :class:`~detaug.errors.RecipeError` naming the file and the line, ``OSError`` passes)."""
        from detaug.transforms.recipe_file import read_recipe_file

        data, text = read_recipe_file(path)
        return cls.from_dict(data, lines=recipe_lines(text), file=str(path))

    def __call__(self, image: Any = None, boxes: Any = None, labels: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Run the recipe eagerly on one sample (albumentations / torchvision style):
        ``recipe(image=img, boxes=b, labels=l, seed=0, epoch=0, image_id=0, box_format="xyxy",
        **per_box_fields)`` -> ``{"image", "boxes", "labels", **fields}``. The same
        ``(seed, epoch, image_id)`` gives exactly the loaders' sample (see :func:`detaug.eager.apply`)."""
        from detaug.eager import apply

        if image is None:
            raise TypeError("a recipe is called on one sample: recipe(image=..., boxes=..., labels=...)")
        return apply(self, image, boxes, labels, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compose) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        inner = ",\n".join(f"    {t!r}" for t in self.transforms)
        pairs = f", keypoint_flip_pairs={[list(p) for p in self.keypoint_flip_pairs]}" if self.keypoint_flip_pairs else ""
        return f"Compose([\n{inner}\n], min_size={self.min_size}, min_visibility={self.min_visibility}{pairs})"


Transform.recipe_class = Compose  # a transform called alone runs as Compose([transform])


def _plan_photometric(t: Transform, state: PlanState) -> list[np.ndarray]:
    """A photometric transform's parameters, on the output canvas when it asks for it."""
    plan_on = getattr(t, "plan_on", None)
    return plan_on(state.rand, state.canvas_hw) if plan_on is not None else t.plan(state.rand)


def _whole_pixels(lo: np.ndarray, hi: np.ndarray, hw: np.ndarray) -> np.ndarray:
    """``[B, 4]`` (x, y, w, h): the float region ``lo``-``hi`` ``[B, 2]`` (x, y) grown to whole
    pixels plus one for bilinear taps, clipped to images ``hw`` ``[B, 2]``; a region that misses
    its image becomes its first pixel."""
    size = hw[:, ::-1]
    lo = np.clip(np.floor(lo) - 1, 0, size)
    hi = np.clip(np.ceil(hi) + 1, 0, size)
    empty = (hi <= lo).any(axis=1)
    lo[empty], hi[empty] = 0, np.minimum(size[empty], 1)
    return np.concatenate([lo, hi - lo], axis=1)


def _read_bounds(in_hw: np.ndarray, m: np.ndarray, out_hw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The part of inputs ``[0, W] x [0, H]`` (``in_hw`` ``[B, 2]``) that maps (``m`` ``[B, 3, 3]``,
    affine or projective) into the canvases ``out_hw``: the input rectangle clipped by the
    canvas' half-planes. Returns ``(lo [B, 2], hi [B, 2], empty [B])`` of its bounding box."""
    n = len(in_hw)
    poly, count = boxes_to_polygons(np.stack([np.zeros(n), np.zeros(n), in_hw[:, 1], in_hw[:, 0]], 1))
    planes = canvas_halfplanes(m, out_hw)
    for k in range(4):
        poly, count = clip_polygons(poly, count, planes[:, k])
    bounds = polygon_bounds(poly, count)
    return bounds[:, :2], bounds[:, 2:], count == 0


def _region_roi(hw: np.ndarray, m: np.ndarray, canvas: np.ndarray) -> np.ndarray:
    """``[B, 4]`` decode ROI for a first warp ``m`` that may be projective (its canvas corners
    may have no preimage in front of the horizon, so the corners' preimages cannot bound it)."""
    lo, hi, empty = _read_bounds(hw, m, canvas)
    lo[empty], hi[empty] = 0, 0
    return _whole_pixels(lo, hi, hw)


def _aligned_roi(hw: np.ndarray, m: np.ndarray, rects: np.ndarray) -> np.ndarray:
    """``[B, 4]`` decode ROI of images ``hw`` placed by axis-aligned maps ``m`` ``[B, 3, 3]`` of
    which only canvas rectangles ``rects`` ``[B, 4]`` (xyxy) are shown."""
    sx, sy, tx, ty = m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2]
    xa, xb = (rects[:, 0] - tx) / sx, (rects[:, 2] - tx) / sx
    ya, yb = (rects[:, 1] - ty) / sy, (rects[:, 3] - ty) / sy
    lo = np.stack([np.minimum(xa, xb), np.minimum(ya, yb)], 1)
    hi = np.stack([np.maximum(xa, xb), np.maximum(ya, yb)], 1)
    return _whole_pixels(lo, hi, hw)


def _mosaic_window(canvas_hw: np.ndarray, centre: np.ndarray, first: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """``[B, 4]`` xyxy whole-pixel part of the mosaic canvases that is composed: what the first
    warp reads (the whole canvas when none follows), grown to hold one pixel of every quadrant
    around the centre ``[B, 2]`` (so that no tile is empty)."""
    n = len(canvas_hw)
    size = canvas_hw[:, ::-1]
    if first is None:
        lo, hi = np.zeros((n, 2)), size.copy()
    else:
        lo, hi, empty = _read_bounds(canvas_hw, first[0], first[1])
        lo = np.clip(np.floor(lo) - 1, 0, size)
        hi = np.clip(np.ceil(hi) + 1, 0, size)
        lo[empty], hi[empty] = centre[empty], centre[empty]
    lo = np.minimum(lo, centre - 1)
    hi = np.maximum(hi, centre + 1)
    return np.concatenate([lo, hi], axis=1)


def _whole_image(hw: np.ndarray) -> np.ndarray:
    """``[B, 4]`` (x, y, w, h): the whole of images ``hw`` ``[B, 2]`` as a decode region."""
    n = len(hw)
    return np.stack([np.zeros(n), np.zeros(n), hw[:, 1], hw[:, 0]], -1)


def _tile_columns(hw: np.ndarray, m: np.ndarray, quadrant: np.ndarray, window: np.ndarray,
                  whole: bool = False) -> list[np.ndarray]:
    """Parameter columns of one Mosaic tile: the decode ROI ``[B, 4]`` of its image (``hw``; the
    whole image when ``whole``: a batch's image shared by ``pool="batch"``), the matrix ``[B, 6]``
    from that ROI to its quadrant's part of the window, and that part's size ``[B, 2]`` (h, w; at
    least one pixel each)."""
    n = len(hw)
    rect = np.concatenate([np.maximum(quadrant[:, :2], window[:, :2]), np.minimum(quadrant[:, 2:], window[:, 2:])], 1)
    roi = _whole_image(hw) if whole else _aligned_roi(hw, m, rect)
    local = translation_matrix(-rect[:, 0], -rect[:, 1]) @ m @ translation_matrix(roi[:, 0], roi[:, 1])
    size = np.stack([rect[:, 3] - rect[:, 1], rect[:, 2] - rect[:, 0]], 1)
    return [roi, local[:, :2, :].reshape(n, 6), size]


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


def recipe_lines(text: str) -> dict[tuple, int]:
    """1-based line of each part of a YAML or JSON recipe text: keys ``(key,)`` for the recipe's
    own keys, ``("transforms", i)`` for an entry, ``("transforms", i, field)`` for a field of it.
    Empty when the text does not parse (its syntax error is reported elsewhere)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[tuple, int] = {}
    entries = None
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            out[(key.value,)] = key.start_mark.line + 1
            if key.value == "transforms":
                entries = value
    elif isinstance(root, yaml.SequenceNode):
        entries = root
    if isinstance(entries, yaml.SequenceNode):
        for i, entry in enumerate(entries.value):
            entry_lines(entry, ("transforms", i), out)
    return out


def _line(lines: Mapping[tuple, int], where: tuple) -> int | None:
    """The line of ``where`` or of its nearest enclosing part."""
    while where:
        if where in lines:
            return lines[where]
        where = where[:-1]
    return None


def default_detection_recipe(size: int | tuple[int, int] = 512, fill: float = 114) -> Compose:
    """The default detection recipe: IoU crop, flip, affine, resize, colour jitter, normalize."""
    return Compose(
        [
            RandomIoUCrop(),
            RandomHorizontalFlip(p=0.5),
            RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5, fill=fill),
            Resize(size if not isinstance(size, int) else (size, size)),
            ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2, hue=0.05),
            Normalize(),
        ],
        min_size=1.0,
        min_visibility=0.0,
    )
