"""Base classes of detaug transforms, the registry of recipe names, and their schema checks.

A transform is one class: its parameter schema (:class:`~detaug.transforms.schema.Param`), its
planner (vectorised NumPy over the batch), its pixel op (DALI) and its box rule. ``Compose``,
the batch planner and the pipeline ask transforms (``kind``, ``out_size``, ``plan``, ``dali``;
a mixing transform its ``stage`` and the methods of
:class:`~detaug.transforms.mixing.MixingTransform`) and never test their types (a test reads
their sources for a transform's name); adding one means its class, the ``@register`` line and its tests.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np

from detaug.boxes import translation_matrix
from detaug.errors import RecipeError
from detaug.plan import PlanState
from detaug.seeds import SampleRandom
from detaug.transforms.schema import REQUIRED, Param, ParamError, closest

__all__ = [
    "Transform",
    "GeometricTransform",
    "PhotometricTransform",
    "OutputTransform",
    "TRANSFORMS",
    "register",
    "Param",
]

#: Transform classes by name, for ``Compose.from_dict``.
TRANSFORMS: dict[str, type["Transform"]] = {}


def register(cls: type["Transform"]) -> type["Transform"]:
    """Class decorator: make ``cls`` available to recipes under its class name."""
    TRANSFORMS[cls.__name__] = cls
    return cls


def _plain(value: Any) -> Any:
    """Tuples and NumPy scalars to JSON/YAML-friendly lists and Python numbers (and nested
    transforms, of compositions, to their ``to_dict``)."""
    if isinstance(value, Transform):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class Transform:
    """A transform of images and their boxes, described by its ``schema``.

    Subclasses declare ``schema`` (a tuple of :class:`Param`, in argument order) instead of an
    ``__init__``: the constructor takes those arguments (positionally or by name), checks each
    against its ``Param`` and stores the normalised value as an attribute of the same name,
    then calls :meth:`setup` for the checks that involve several fields. Every problem is a
    :class:`~detaug.errors.RecipeError` naming the transform and the field.

    Attributes:
        kind: ``"warp"`` (moves pixels and boxes, fused into warps), ``"photometric"`` (pixel
            values only), ``"output"`` (the last stage: dtype and layout, e.g. ``Normalize``).
        recipe_class: the recipe a transform called alone runs in,
            :class:`~detaug.transforms.Compose`; set by :mod:`detaug.transforms.compose` (which
            sits above this module, tests/test_layers.py), always imported with the package.
    """

    schema: ClassVar[tuple[Param, ...]] = ()
    kind: ClassVar[str] = ""
    recipe_class: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        params = []
        for p in cls.schema:
            default = inspect.Parameter.empty if p.required else p.default
            params.append(inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
        cls.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # help(), IDEs

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        name = type(self).__name__
        fields = [p.name for p in self.schema]
        if len(args) > len(fields):
            raise RecipeError(f"takes {len(fields)} arguments ({', '.join(fields)}), got {len(args)}", transform=name)
        values = dict(zip(fields, args))
        for key, value in kwargs.items():
            if key not in fields:
                known = ", ".join(fields) if fields else "none"
                raise RecipeError(f"unknown field{closest(key, fields)}; known: {known}", transform=name, field=key)
            if key in values:
                raise RecipeError("given twice (by position and by name)", transform=name, field=key)
            values[key] = value
        for p in self.schema:
            if p.name not in values and p.required:
                raise RecipeError(f"required field missing ({p.expected()})", transform=name, field=p.name)
            value = values.get(p.name, p.default)
            try:
                setattr(self, p.name, p.normalize(value))
            except ParamError as err:
                raise RecipeError(err.message, transform=name, field=p.name) from None
        self.setup()

    def setup(self) -> None:
        """Checks across fields (raise with :meth:`error`) and derived attributes."""

    def error(self, field: str | None, problem: str) -> RecipeError:
        """A :class:`RecipeError` about ``field`` of this transform, to raise."""
        return RecipeError(problem, transform=type(self).__name__, field=field)

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        """Output ``(height, width)`` when every input canvas is ``in_size`` (``None``: sizes vary);
        ``None`` when the output size varies. The default: the size is not known."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """``{"name": class name, <field>: value, ...}`` (plain lists and numbers)."""
        out: dict[str, Any] = {"name": type(self).__name__}
        for p in self.schema:
            out[p.name] = _plain(getattr(self, p.name))
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "name")
        return f"{type(self).__name__}({args})"

    def __call__(self, image: Any = None, boxes: Any = None, labels: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Run this transform alone, eagerly, on one sample: ``Compose([self])(image=..., ...)``
        (see :meth:`detaug.transforms.Compose.__call__`)."""
        assert self.recipe_class is not None, "detaug.transforms.compose sets Transform.recipe_class"
        return self.recipe_class([self])(image, boxes, labels, **kwargs)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()  # type: ignore[union-attr]

    __hash__ = None  # type: ignore[assignment]


def where_applied(apply: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``step`` ``[B, 3, 3]`` where ``apply`` (``[B]`` bool) is set, the identity elsewhere."""
    return np.where(apply[:, None, None], step, np.eye(3))


def about_center(center: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``T(c) @ m @ T(-c)`` for per-sample centres ``[B, 2]`` (x, y)."""
    return translation_matrix(center[:, 0], center[:, 1]) @ m @ translation_matrix(-center[:, 0], -center[:, 1])


def on_device_of(node: Any, images: Any) -> Any:
    """``node`` (a CPU DataNode of per-sample parameters) on the device of ``images``, for
    arithmetic expressions that mix both."""
    return node.gpu() if getattr(images, "device", "cpu") == "gpu" else node


class GeometricTransform(Transform):
    """A transform that moves pixels: one affine matrix per sample, applied to image and boxes.

    Class attributes describe how it combines with its neighbours when detaug fuses consecutive
    geometric transforms into one ``warp_affine``:

    * ``crops``: the output canvas may miss parts of the input canvas (crops, rotations);
    * ``reveals``: the output canvas may show points outside the input canvas, painted with
      ``fill`` (zoom-out, padding, rotations).

    A transform that ``reveals`` after one that ``crops`` starts a new warp, so that the area the
    crop removed is painted with ``fill`` exactly as when the two run one after the other.
    """

    kind: ClassVar[str] = "warp"
    #: the step may be projective (a full 3x3): its warp segment uses a perspective warp
    projective: ClassVar[bool] = False
    crops: ClassVar[bool] = False
    reveals: ClassVar[bool] = False
    fill: float = 0

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        """Sample this transform's parameters for a batch, drawing from ``state.rand`` only.

        Every call must consume the same number of draws for every sample, whatever the
        others' data (see :mod:`detaug.seeds`): draw for all rows and select, or reserve a
        fixed block of positions.

        Returns ``(step [B, 3, 3] float64, canvas_hw [B, 2])``: the forward matrix from the
        current canvas to the new one, and the new canvas' ``(height, width)`` in pixels.
        """
        raise NotImplementedError


class PhotometricTransform(Transform):
    """A transform of pixel values only (boxes unchanged); runs after all geometric transforms."""

    kind: ClassVar[str] = "photometric"

    #: Names of the per-sample float32 parameters ``plan`` returns, in order.
    param_names: ClassVar[tuple[str, ...]] = ()

    #: One value per name in ``param_names`` with which :meth:`dali` leaves every pixel as it
    #: is (``ColorJitter``: ``(1, 1, 1, 0)``): what a composition (``OneOf``, ``RandomApply``, ...)
    #: plans for the samples that do not pick this transform. ``None``: the transform cannot be
    #: skipped per sample (``Grayscale(num_output_channels=1)`` changes the channel count).
    neutral: ClassVar[tuple[float, ...] | None] = ()

    def plan(self, rand: SampleRandom) -> list[np.ndarray]:
        """Per-sample parameters: one float32 ``[B]`` array per name in ``param_names``, drawn
        from ``rand`` (``B = rand.batch_size``) the same way for every sample."""
        return []

    def plan_on(self, rand: SampleRandom, canvas_hw: np.ndarray | None) -> list[np.ndarray]:
        """:meth:`plan` for output canvases ``canvas_hw`` (float64 ``[B, 2]`` (height, width)):
        what ``Compose`` calls. Transforms whose parameters depend on the image size
        (``RandomErasing``'s rectangle) override this one; the default ignores the size."""
        return self.plan(rand)

    def dali(self, images: Any, params: list[Any]) -> Any:
        """Add this transform's DALI operators to the graph; ``params`` are DataNodes."""
        raise NotImplementedError

    def dali_float(self, images: Any, params: list[Any]) -> Any | None:
        """:meth:`dali` ending in float32 HWC values in [0, 255] (clamped, not rounded to
        uint8), for an output stage that takes them (:attr:`OutputTransform.takes_float`); the
        CPU pipeline asks the last photometric transform for it, as DALI's CPU conversion to
        uint8 can cost more than the op. ``None`` (the default): the transform has no such
        form, and :meth:`dali` runs."""
        return None

    def hidden_regions(self, params: list[np.ndarray], canvas_hw: np.ndarray) -> np.ndarray | None:
        """Regions this transform paints over, as float64 ``[B, R, 4]`` xyxy rectangles in
        output pixels (zero-size rows where none), from the parameters ``plan`` drew; ``None``
        when it hides nothing (the default). A box's visibility is reduced by the share of it
        they cover, so ``min_visibility`` drops boxes mostly hidden (``RandomErasing``)."""
        return None


class OutputTransform(Transform):
    """The last stage of a recipe: the output dtype and layout (``Normalize``)."""

    kind: ClassVar[str] = "output"

    #: Whether :meth:`dali_output` also takes float32 HWC images in [0, 255]
    #: (:meth:`PhotometricTransform.dali_float`).
    takes_float: ClassVar[bool] = False
    #: Whether it normalises with per-channel ``mean`` and ``std`` attributes (on the 0-1
    #: scale), which a preview undoes (``Compose.normalize``).
    normalizes: ClassVar[bool] = False

    def dali_output(self, images: Any, layout: str) -> Any:
        """Add the output stage to the DALI graph: ``images`` HWC uint8 (or float32 in [0, 255]
        where :attr:`takes_float`) -> ``layout``."""
        raise NotImplementedError
