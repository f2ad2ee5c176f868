"""``Compose``: an ordered recipe of transforms, its box filters, and its (de)serialisation.

The recipe checks its rules and fuses its warps into segments; the batch planner that runs it
on the host is :mod:`detaug.batch_plan`, the reading of recipe files
:mod:`detaug.transforms.recipe_file`, a recipe built from its dict form (every problem located)
:mod:`detaug.transforms.recipe_dict`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from detaug.batch_plan import partner_block
from detaug.batch_plan import plan_batch as _plan_batch
from detaug.errors import RecipeError
from detaug.keypoints import check_flip_pairs
from detaug.plan import Partners
from detaug.plan_layout import PlanFieldSpec, PlanLayout
from detaug.seeds import SampleRandom, as_keys
from detaug.transforms.base import OutputTransform, Transform
from detaug.transforms.recipe_dict import RECIPE_SCHEMA, recipe_from_dict, recipe_lines
from detaug.transforms.schedule import RecipeSchedule
from detaug.transforms.schema import ParamError

__all__ = ["Compose", "Partners"]


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
        schedule: values that change with the epoch, ``{transform: {field: {"epochs": [...],
            "values": [...], "mode": "linear"|"step"}}}`` or ``{transform: {"off_from_epoch": N}}``
            (:mod:`detaug.transforms.schedule`, docs/schedules.md); each batch is planned with
            :meth:`at_epoch` of its epoch.
        boxes_from_masks: each kept box becomes the bounds of its moved mask where the source
            has ``masks`` (tighter than the transformed box; :mod:`detaug.masks`).

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
                 keypoint_flip_pairs: Sequence[Sequence[int]] = (),
                 schedule: Mapping[Any, Any] | None = None, boxes_from_masks: bool = False) -> None:
        self.transforms = list(transforms)
        self.boxes_from_masks = bool(boxes_from_masks)  # boxes from their moved masks (detaug.masks)
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
        #: the mixing transforms (:mod:`detaug.transforms.mixing`), in recipe order, and per
        #: one its partner slots (``Mosaic``'s tiles 1-3, then ``MixUp``'s partner)
        self.mixing = [t for t in self.transforms if t.kind == "mixing"]
        self.mixing_slots: list[tuple[int, ...]] = []
        for t in self.mixing:
            first = sum(len(slots) for slots in self.mixing_slots)
            self.mixing_slots.append(tuple(range(first, first + t.partners)))
        blend_after = self._check_mixing(self.transforms)
        #: the mixing transform that composes the first canvas (``stage == "canvas"``: ``Mosaic``)
        #: and the one that blends a partner in (``stage == "blend"``: ``MixUp``), or ``None``
        self.canvas_stage = next((t for t in self.mixing if t.stage == "canvas"), None)
        self.blend_stage = next((t for t in self.mixing if t.stage == "blend"), None)
        before, fills_before = self._segments(self.geometric[:blend_after])
        after, fills_after = self._segments(self.geometric[blend_after:])
        self.segments, self.segment_fills = before + after, fills_before + fills_after
        #: the segment before which the blend stage blends (``len(segments)``: after the last
        #: one; 0 without a blend stage)
        self.blend_at = len(before)
        #: per segment: it holds a projective step (DALI's perspective warp, a 3x3 matrix)
        self.segment_projective = [any(getattr(t, "projective", False) for t in seg) for seg in self.segments]
        #: the fields of each sample's plan, by name (:mod:`detaug.plan_layout`)
        self.plan_layout = self._plan_layout()
        #: the epoch schedule (:mod:`detaug.transforms.schedule`; false when there is none)
        self.schedule = RecipeSchedule(schedule, self.transforms)
        self._epochs: dict[int, Compose] = {}
        for epoch in self.schedule.points():  # every epoch's recipe plans into this one's pipeline
            at = self.at_epoch(epoch)
            if (at.plan_layout != self.plan_layout or at.segment_fills != self.segment_fills
                    or [len(s) for s in at.segments] != [len(s) for s in self.segments]):
                raise RecipeError(f"at epoch {epoch} the recipe would need another DALI pipeline (its plan "
                                  "or warp segments differ): schedule only values the planner draws from",
                                  field="schedule")

    def at_epoch(self, epoch: int) -> "Compose":
        """The recipe of ``epoch``: the same transforms with the schedule's values of that
        epoch, and no schedule (``self`` when the recipe has none). Cached per epoch."""
        if not self.schedule:
            return self
        epoch = int(epoch)
        recipe = self._epochs.get(epoch)
        if recipe is None:
            if len(self._epochs) >= 8:
                self._epochs.clear()
            recipe = self._epochs[epoch] = Compose(
                self.schedule.transforms_at(self.transforms, epoch), min_size=self.min_size,
                min_visibility=self.min_visibility, keypoint_flip_pairs=self.keypoint_flip_pairs,
                boxes_from_masks=self.boxes_from_masks)
        return recipe

    def for_keys(self, keys: np.ndarray | list[np.ndarray]) -> "Compose":
        """The recipe that plans a batch of ``keys`` (int64 ``[B, 3]``): :meth:`at_epoch` of
        their epoch (a scheduled recipe plans batches of one epoch), ``self`` without a schedule."""
        if not self.schedule:
            return self
        epochs = np.unique(as_keys(keys)[:, 1])
        if len(epochs) > 1:
            raise ValueError(f"a recipe with a schedule plans batches of one epoch, got epochs {epochs.tolist()}")
        return self.at_epoch(int(epochs[0]) if len(epochs) else 0)

    @staticmethod
    def _check_mixing(transforms: list[Transform]) -> int:
        """The number of geometric transforms before the blend stage (0 without one), or a
        :class:`RecipeError` for a mixing transform where it cannot be planned (its
        :meth:`~detaug.transforms.mixing.MixingTransform.misplaced`)."""
        blend_after, size, fixed = 0, None, False
        for i, t in enumerate(transforms):
            name = type(t).__name__
            if t.kind == "mixing":
                if getattr(t, "stage", None) not in ("canvas", "blend"):
                    raise RecipeError("is a mixing transform this Compose cannot plan (it is neither a canvas nor "
                                      "a blend stage)", transform=name, index=i)
                problem = t.misplaced(i, transforms[:i], fixed)  # type: ignore[attr-defined]
                if problem is not None:
                    raise RecipeError(problem, transform=name, index=i)
                if t.stage == "blend":  # type: ignore[attr-defined]
                    blend_after = sum(1 for u in transforms[:i] if u.kind == "warp")
            if t.kind in ("warp", "mixing"):
                size = t.out_size(size)
                fixed = size is not None
        return blend_after

    @property
    def normalize(self) -> OutputTransform | None:
        """The recipe's output stage where it normalises (``Normalize``: its ``mean`` and
        ``std``, :attr:`~detaug.transforms.base.OutputTransform.normalizes`), else ``None``."""
        return self.output if self.output is not None and self.output.normalizes else None

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
        return sum(t.partners for t in self.mixing)

    @property
    def slot_pools(self) -> tuple[str, ...]:
        """Per partner slot (``Mosaic``'s tiles 1-3, then ``MixUp``'s partner), where its image
        comes from: ``"dataset"`` or ``"batch"`` (the transform's ``pool``; see
        :mod:`detaug.transforms.mixing`)."""
        return tuple(t.pool for t in self.mixing for _ in range(t.partners))

    def slots_of(self, t: Transform) -> tuple[int, ...]:
        """The partner slots of the recipe's mixing transform ``t`` (:attr:`mixing_slots`)."""
        return next(slots for u, slots in zip(self.mixing, self.mixing_slots) if u is t)

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
        """Length ``P`` of each sample's parameter vector (:attr:`plan_layout`'s size)."""
        return self.plan_layout.size

    def _plan_layout(self) -> PlanLayout:
        """The fields a sample's plan holds, in vector order (:mod:`detaug.plan_layout`): the
        decode region of the sample's image (without a canvas stage, which decodes it itself);
        the canvas stage's fields; per warp segment its matrix and output size; the blend
        stage's fields; each photometric transform's parameters; the batch positions of the
        partner slots of :attr:`batch_slots`."""
        specs: list[PlanFieldSpec] = []
        if self.canvas_stage is None:
            specs.append(("roi", (4,), "float32", "decode region (x, y, w, h) of the sample's image, source pixels"))
        else:
            specs += self.canvas_stage.plan_fields()
        for s, projective in enumerate(self.segment_projective):
            specs += [(f"warp{s}.matrix", (3, 3) if projective else (2, 3), "float32",
                       f"forward map of warp segment {s}, DALI pixel space ({'projective' if projective else 'affine'})"),
                      (f"warp{s}.size", (2,), "float32", f"(h, w) of warp segment {s}'s output canvas")]
        if self.blend_stage is not None:
            specs += self.blend_stage.plan_fields()
        for k, t in enumerate(self.photometric):
            specs += [(f"photometric{k}.{name}", (), "float32", f"{type(t).__name__}'s {name}") for name in t.param_names]
        specs += [(f"slot{k}.batch_index", (), "int32", f"batch position of partner slot {k}'s image (pool='batch')")
                  for k in self.batch_slots]
        return PlanLayout(specs)

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
        positions, needed = partner_block(self.for_keys(keys), SampleRandom(keys), int(dataset_size))
        return positions, needed

    #: Plan one batch (called by :mod:`detaug.planning`, before DALI):
    #: :func:`detaug.batch_plan.plan_batch` with this recipe as ``recipe`` (its docstring gives the
    #: arguments and the results).
    plan_batch = _plan_batch

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
        if self.schedule:  # likewise
            out["schedule"] = self.schedule.to_dict()
        if self.boxes_from_masks:  # only when set, likewise
            out["boxes_from_masks"] = True
        return out

    @classmethod
    def from_dict(cls, recipe: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                  lines: Mapping[tuple, int] | None = None, file: str | None = None) -> "Compose":
        """Build a ``Compose`` from :meth:`to_dict`'s format (also accepts a bare list of transforms).

        Every problem is a :class:`~detaug.errors.RecipeError` naming the entry, the transform,
        the field and (with ``lines`` from :func:`~detaug.transforms.recipe_dict.recipe_lines`) the
        line: an unknown transform or field (with the closest known name), a value of the wrong
        type, a reversed range.
        """
        return recipe_from_dict(cls, recipe, lines=lines, file=file)

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
        schedule = f", schedule={self.schedule.to_dict()!r}" if self.schedule else ""
        pairs += ", boxes_from_masks=True" if self.boxes_from_masks else ""
        return (f"Compose([\n{inner}\n], min_size={self.min_size}, min_visibility={self.min_visibility}{pairs}"
                f"{schedule})")


Transform.recipe_class = Compose  # a transform called alone runs as Compose([transform])
