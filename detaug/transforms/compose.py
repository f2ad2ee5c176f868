"""``Compose``: an ordered recipe of transforms, its box filters, and its (de)serialisation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from detaug.errors import RecipeError
from detaug.plan import PlanState
from detaug.seeds import SampleRandom, as_keys
from detaug.transforms.affine import RandomAffine
from detaug.transforms.base import TRANSFORMS, Transform
from detaug.transforms.color import ColorJitter
from detaug.transforms.crop import RandomIoUCrop
from detaug.transforms.flip import RandomHorizontalFlip
from detaug.transforms.normalize import Normalize
from detaug.transforms.resize import Resize
from detaug.transforms.schema import Param, ParamError, closest

#: The recipe's own fields (besides ``transforms``).
RECIPE_SCHEMA = (
    Param("min_size", "number", 1.0, "boxes narrower or lower than this many output pixels are removed", low=0),
    Param("min_visibility", "probability", 0.0, "boxes with less than this share of their area visible are removed"),
)

__all__ = ["Compose", "default_detection_recipe"]


class Compose:
    """An ordered list of transforms applied to images and their boxes together.

    Args:
        transforms: geometric transforms (moving pixels and boxes) and photometric ones
            (pixels only). ``Normalize``, if present, must come last.
        min_size: boxes narrower or lower than this many output pixels are removed.
        min_visibility: boxes with less than this fraction of their (source) area left inside
            the output image are removed.

    Processing order, per batch (see :mod:`detaug.plan` for the box steps):

    1. the random parameters of every transform are drawn, in list order, from each sample's own
       random stream, keyed by ``(seed, epoch, image_id)`` (:mod:`detaug.seeds`): a sample's
       plan does not depend on its batch-mates or on the batch size;
    2. consecutive geometric transforms are fused into one affine warp per *segment*; a new
       segment starts where a transform that may reveal area outside its input (zoom-out,
       rotation, padding) follows one that cropped, or where the fill value changes;
    3. the image is decoded (only the region the first warp reads) and warped per segment;
    4. photometric transforms run on the output canvas, in list order; ``Normalize`` last;
    5. boxes are computed exactly, then filtered (dropped by a transform, empty,
       ``min_size``, ``min_visibility``) together with their labels.
    """

    def __init__(self, transforms: Sequence[Transform], min_size: float = 1.0, min_visibility: float = 0.0) -> None:
        self.transforms = list(transforms)
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
        self.segments, self.segment_fills = self._segments(self.geometric)

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
    def num_params(self) -> int:
        """Length of each sample's parameter vector (see :meth:`plan_batch`)."""
        return 4 + 8 * len(self.segments) + sum(len(t.param_names) for t in self.photometric)

    def param_slices(self) -> dict[str, Any]:
        """Where each parameter sits in a sample's parameter vector: ``{"roi": slice,
        "warps": [(matrix slice, size slice), ...], "photometric": [slice, ...]}``."""
        warps = [(slice(4 + 8 * s, 10 + 8 * s), slice(10 + 8 * s, 12 + 8 * s)) for s in range(len(self.segments))]
        start, photometric = 4 + 8 * len(self.segments), []
        for t in self.photometric:
            photometric.append(slice(start, start + len(t.param_names)))
            start += len(t.param_names)
        return {"roi": slice(0, 4), "warps": warps, "photometric": photometric}

    def plan_batch(
        self,
        shapes: list[np.ndarray],
        boxes: list[np.ndarray],
        labels: list[np.ndarray],
        keys: np.ndarray | list[np.ndarray],
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Plan one batch (called by :mod:`detaug.planning`, before DALI).

        Args:
            shapes: per sample, the decoded image shape ``(H, W, C)`` (int).
            boxes: per sample, float32 ``[N, 4]`` absolute xyxy boxes on the source image.
            labels: per sample, int ``[N]`` (or ``[N, 1]``) category ids.
            keys: int64 ``[B, 3]`` sample keys ``(seed, epoch, image_id)`` from
                :func:`detaug.seeds.sample_keys` (or a list of ``B`` such rows). Sample ``k``'s
                outputs are a pure function of ``keys[k]``, ``shapes[k]``, ``boxes[k]`` and
                ``labels[k]``: planning it alone or in any batch gives the same arrays.

        Returns:
            Three per-sample lists: the parameter vectors (float32 ``[num_params]``: decode ROI
            ``(x, y, w, h)``; per warp segment the forward matrix ``[2, 3]`` row-major and the
            output size ``(h, w)``; per photometric transform its parameters; see
            :meth:`param_slices`), the output boxes (float32 ``[M, 4]`` xyxy) and labels
            (int32 ``[M]``).
        """
        n = len(shapes)
        keys = as_keys(keys, batch_size=n)
        hw = np.array([np.asarray(s).ravel()[:2] for s in shapes], dtype=np.float64).reshape(n, 2)
        box_arrays = [np.asarray(b, dtype=np.float64).reshape(-1, 4) for b in boxes]
        label_arrays = [np.asarray(lab).reshape(-1).astype(np.int32) for lab in labels]
        counts = np.array([len(b) for b in box_arrays], dtype=np.int64)
        for i, (b, lab) in enumerate(zip(box_arrays, label_arrays)):
            if len(b) != len(lab):
                raise ValueError(f"sample {i} of the batch has {len(b)} boxes but {len(lab)} labels")
        state = PlanState(
            rand=SampleRandom(keys),
            source_hw=hw,
            boxes_src=np.concatenate(box_arrays) if n else np.zeros((0, 4)),
            sample=np.repeat(np.arange(n), counts),
        )
        flat_labels = np.concatenate(label_arrays) if n else np.zeros(0, np.int32)

        segment_out: list[tuple[np.ndarray, np.ndarray]] = []
        start = state.to_canvas
        for segment in self.segments:
            for t in segment:
                step, canvas = t.plan(state)
                state.apply(step, canvas, crops=t.crops)
            segment_out.append((state.to_canvas @ np.linalg.inv(start), state.canvas_hw))
            start = state.to_canvas
        roi = self._decode_roi(hw, segment_out[0] if segment_out else None)
        if segment_out:  # the first warp reads the decoded ROI, not the whole image
            m, canvas = segment_out[0]
            shift = np.broadcast_to(np.eye(3), (n, 3, 3)).copy()
            shift[:, 0, 2], shift[:, 1, 2] = roi[:, 0], roi[:, 1]
            segment_out[0] = (m @ shift, canvas)
        columns = [roi]
        for m, canvas in segment_out:
            columns += [m[:, :2, :].reshape(n, 6), canvas]
        photometric = [t.plan(state.rand) for t in self.photometric]
        columns += [np.stack(p, axis=1) for p in photometric if len(p)]
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
        return list(params), boxes_out, labels_out

    @staticmethod
    def _decode_roi(hw: np.ndarray, first: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """``[B, 4]`` (x, y, w, h) whole-pixel region of the source the first warp reads."""
        n = len(hw)
        full = np.stack([np.zeros(n), np.zeros(n), hw[:, 1], hw[:, 0]], -1)
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
        for t in self.geometric:
            size = t.out_size(size)
        return None if size is None else (int(size[0]), int(size[1]))

    # -- serialisation ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A plain dict recipe: ``{"transforms": [{"name": ..., **args}, ...], "min_size", "min_visibility"}``."""
        return {
            "transforms": [t.to_dict() for t in self.transforms],
            "min_size": self.min_size,
            "min_visibility": self.min_visibility,
        }

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
        known = ["transforms"] + [p.name for p in RECIPE_SCHEMA]
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
                where = here + (err.field,) if err.field in spec else here
                raise err.located(index=i, line=_line(lines, where), file=file) from None
        try:
            return cls(transforms, **{p.name: recipe.get(p.name, p.default) for p in RECIPE_SCHEMA})
        except RecipeError as err:
            where = (err.field,) if err.field else ("transforms", err.index) if err.index is not None else ()
            raise err.located(line=_line(lines, where), file=file) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str, *, file: str | None = None) -> "Compose":
        return cls.from_dict(json.loads(text), lines=recipe_lines(text), file=file)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, *, file: str | None = None) -> "Compose":
        import yaml

        return cls.from_dict(yaml.safe_load(text), lines=recipe_lines(text), file=file)

    def save(self, path: str | Path) -> None:
        """Write the recipe as YAML (``.yaml``/``.yml``) or JSON (any other suffix)."""
        path = Path(path)
        text = self.to_yaml() if path.suffix.lower() in (".yaml", ".yml") else self.to_json()
        path.write_text(text, encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Compose":
        """Read a recipe written by :meth:`save` (YAML or JSON, by suffix)."""
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() in (".yaml", ".yml"):
            return cls.from_yaml(text, file=str(path))
        return cls.from_json(text, file=str(path))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compose) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        inner = ",\n".join(f"    {t!r}" for t in self.transforms)
        return f"Compose([\n{inner}\n], min_size={self.min_size}, min_visibility={self.min_visibility})"


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
            out[("transforms", i)] = entry.start_mark.line + 1
            if isinstance(entry, yaml.MappingNode):
                for key, _ in entry.value:
                    out[("transforms", i, key.value)] = key.start_mark.line + 1
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
