"""Affine warps about the image centre: ``RandomAffine`` and ``RandomRotation``.

Angles are in degrees, as torchvision: ``RandomRotation`` turns counter-clockwise on screen for
positive angles (``F.rotate``), ``RandomAffine`` clockwise (``F.affine``, whose matrix is
``_get_inverse_affine_matrix``'s). The boxes are exact (see :mod:`detaug.plan`): a rotated box
cut by the border gets the bounding box of its visible part, not of its clamped corners.
"""

from __future__ import annotations

import numpy as np

from detaug.boxes import rotation_matrix, scale_matrix, shear_matrix, translation_matrix
from detaug.plan import PlanState
from detaug.seeds import SampleRandom
from detaug.transforms.base import GeometricTransform, Param, about_center, register, where_applied
from detaug.transforms.params import FILL
from detaug.transforms.schema import REQUIRED

__all__ = ["RandomAffine", "RandomRotation"]

CENTER = Param("center", "numbers", None, "rotation centre (x, y) in pixels; the canvas centre when null", optional=True)


@register
class RandomAffine(GeometricTransform):
    """Random rotation, translation, scale and shear about the image centre; canvas size kept
    (torchvision ``RandomAffine``: positive angles turn clockwise on screen, unlike ``RandomRotation``).

    Args:
        degrees: rotation range; ``d`` means ``(-d, d)``; positive angles turn clockwise on screen.
        translate: maximal absolute fractions ``(a, b)``: ``tx ~ U(-a W, a W)``, ``ty ~ U(-b H, b H)``,
            continuous (torchvision rounds them to whole pixels).
        scale: ``(min, max)`` scale factor range.
        shear: ``s`` or ``(min, max)``: x-shear in degrees; ``(xmin, xmax, ymin, ymax)`` adds a y-shear.
            A positive x-shear moves points above the centre to the right (``x -= tan(sx) (y - cy)``),
            a positive y-shear moves points left of the centre down (``y -= tan(sy) (x - cx)``).
        fill: grey level (0-255) painted where the output shows no input pixel.
        center: rotation centre ``(x, y)`` in pixels; the canvas centre when ``None``.
        p: probability of applying the transform to a sample.

    The forward matrix is torchvision's (``_get_inverse_affine_matrix(..., inverted=False)``):
    ``T(c + t) R(a) S(s) Sh_y(sy) Sh_x(sx) T(-c)`` with ``R(a) = [[cos a, -sin a], [sin a, cos a]]``
    (clockwise on screen, y down), ``Sh_x = [[1, -tan sx], [0, 1]]``, ``Sh_y = [[1, 0], [-tan sy, 1]]``.
    """

    schema = (
        Param("degrees", "range", 0, "rotation angle range in degrees; positive turns clockwise (torchvision's affine)",
              center=0.0),
        Param("translate", "numbers", None, "maximal shift as fractions (a, b) of width and height (continuous pixels)",
              low=0, high=1, optional=True),
        Param("scale", "range", None, "scale factor range", low=1e-6, optional=True),
        Param("shear", "numbers", None, "x-shear range in degrees, or (xmin, xmax, ymin, ymax); a number s means (-s, s)",
              lengths=(1, 2, 4), optional=True),
        FILL,
        CENTER,
        Param("p", "probability", 1.0, "probability of applying the transform to a sample"),
    )
    crops = True
    reveals = True

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - see Transform
        shear = kwargs.get("shear", args[3] if len(args) > 3 else None)
        if isinstance(shear, (int, float)) and not isinstance(shear, bool):  # torchvision's shear=s
            if "shear" in kwargs:
                kwargs["shear"] = [shear]
            else:
                args = (*args[:3], [shear], *args[4:])
        super().__init__(*args, **kwargs)

    def setup(self) -> None:
        if self.shear is not None:
            s = self.shear
            if len(s) == 1:
                if s[0] < 0:
                    raise self.error("shear", f"a single number means (-s, s) and must be >= 0, got {s[0]:g}")
                s = (-s[0], s[0])
            if s[0] > s[1] or (len(s) == 4 and s[2] > s[3]):
                raise self.error("shear", f"range reversed: expected min <= max, got {list(self.shear)!r}")
            self.shear = tuple(s) + ((0.0, 0.0) if len(s) == 2 else ())
        if self.center is not None and len(self.center) != 2:
            raise self.error("center", f"expected an (x, y) pair, got {list(self.center)!r}")

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

    def _linear(self, rand: SampleRandom) -> np.ndarray:
        # torchvision's R(a) is rotation_matrix(-a) (counter-clockwise there), its Sh_y(sy) Sh_x(sx)
        # is shear_matrix(-sx, -sy)
        m = rotation_matrix(-rand.uniform(*self.degrees))
        if self.shear is not None:
            m = m @ shear_matrix(-rand.uniform(*self.shear[:2]), -rand.uniform(*self.shear[2:]))
        if self.scale is not None:
            s = rand.uniform(*self.scale)
            m = m @ scale_matrix(s, s)
        return m

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        n, rand = state.batch_size, state.rand
        h, w = state.canvas_hw[:, 0], state.canvas_hw[:, 1]
        apply = rand.random() < self.p
        m = self._linear(rand)
        if self.translate is not None:
            tx = rand.uniform(-1, 1) * self.translate[0] * w
            ty = rand.uniform(-1, 1) * self.translate[1] * h
            m = translation_matrix(tx, ty) @ m
        c = np.stack([w / 2, h / 2], -1) if self.center is None else np.tile(self.center, (n, 1))
        return where_applied(apply, about_center(c, m)), state.canvas_hw


@register
class RandomRotation(GeometricTransform):
    """Rotate by an angle drawn from ``degrees`` (``d`` means ``(-d, d)``) about ``center``.

    With ``expand=False`` the canvas keeps its size and corners are cut. With ``expand=True``
    the canvas grows to hold the whole rotated image and no box is cut. Its size is
    torchvision's rule: with ``lo``, ``hi`` the extremes of the rotated canvas corners (pixel
    ``i`` spans ``[i, i + 1)``, in the input's frame), ``ceil(hi) - floor(lo)`` per axis after
    truncating both to 1e-4; exact quarter turns give ``(H, W)`` or ``(W, H)`` (torchvision's
    ``rot90``). The rotated image is centred on the canvas. With a ``center`` other than the
    canvas centre, detaug's canvas still holds the whole rotated image (torchvision's assumes a
    rotation about the centre and may cut it).
    """

    schema = (
        Param("degrees", "range", REQUIRED, "rotation angle range in degrees; positive turns counter-clockwise",
              center=0.0),
        Param("expand", "bool", False, "grow the canvas to hold the whole rotated image"),
        CENTER,
        FILL,
        Param("p", "probability", 1.0, "probability of applying the transform to a sample"),
    )
    reveals = True

    def setup(self) -> None:
        if self.center is not None and len(self.center) != 2:
            raise self.error("center", f"expected an (x, y) pair, got {list(self.center)!r}")
        self.crops = not self.expand  # type: ignore[misc]

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return None if self.expand else in_size

    def plan(self, state: PlanState) -> tuple[np.ndarray, np.ndarray]:
        n, rand = state.batch_size, state.rand
        h, w = state.canvas_hw[:, 0], state.canvas_hw[:, 1]
        apply = rand.random() < self.p
        angle = np.where(apply, rand.uniform(*self.degrees), 0.0)
        c = np.stack([w / 2, h / 2], -1) if self.center is None else np.tile(self.center, (n, 1))
        rotation = rotation_matrix(angle)
        quarter = np.mod(angle, 90.0) == 0  # exact quarter turns: cos and sin exactly 0 or +-1
        rotation[quarter] = np.round(rotation[quarter])
        step = about_center(c, rotation)
        if not self.expand:
            return step, state.canvas_hw
        corners = np.stack([np.zeros(n), np.zeros(n), w, np.zeros(n), w, h, np.zeros(n), h], -1).reshape(n, 4, 2)
        moved = (step[:, None, :2, :2] @ corners[..., None])[..., 0] + step[:, None, :2, 2]
        lo, hi = moved.min(axis=1), moved.max(axis=1)  # (x, y) in the input's frame
        size = expanded_size(lo, hi)  # (width, height)
        if self.center is None:  # torchvision's quarter turns are rot90: (W, H) or (H, W), also when odd
            half_turn = (np.mod(angle, 180.0) == 0)[:, None]
            turned = np.where(half_turn, np.stack([w, h], -1), np.stack([h, w], -1))
            size[quarter] = turned[quarter]
        step = translation_matrix(-lo[:, 0] + (size[:, 0] - (hi - lo)[:, 0]) / 2,
                                  -lo[:, 1] + (size[:, 1] - (hi - lo)[:, 1]) / 2) @ step
        return step, np.stack([size[:, 1], size[:, 0]], -1)


def expanded_size(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """torchvision's canvas for ``rotate(expand=True)``: ``ceil(hi) - floor(lo)`` per axis after
    truncating both (towards zero) to 1e-4, for extremes ``lo``, ``hi`` ``[B, 2]`` of the
    rotated corners; float64 ``[B, 2]`` in the same axis order."""
    return np.ceil(np.trunc(hi * 1e4) / 1e4) - np.floor(np.trunc(lo * 1e4) / 1e4)
