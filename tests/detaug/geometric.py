"""What the tests of the per-box fields (keypoints, instance masks, rotated boxes) share: the table
of geometric recipes each field is checked under on the pixels, and the checks that are the same
rule for every field (batches planned together as alone, Keras' padding with -1, an EXIF-rotated
image file).

One table: a geometric transform added to :func:`geometric_recipes` is checked for every field.
The sizes are each field's own (its scene's size, its crops), passed by its test module.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

import detaug.transforms as T
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug.sources import SampleListSource

Size = tuple[int, int]  # (h, w)
Range = tuple[float, float]


def geometric_recipes(hw: Size, *, flips: str = "", perspective: float, iou_crop_resize: Size, crop_pad: Size,
                      center_crop: Size, zoom_out_resize: tuple[Range, Size], crop_then_zoom_out: tuple[Size, Range],
                      rotate_then_zoom_out: bool = True, resize: Size | None = None, letterbox: int,
                      shortest_size: tuple[list[int], int] | None = None, mosaic: tuple[Size, T.Transform],
                      mosaic_affine: T.Transform | None = None) -> dict[str, T.Compose]:
    """``{name: recipe}`` of every geometric transform, alone or in the combinations that test it
    (a crop then a zoom-out, flips with an affine and a perspective, a mosaic then a warp), for a
    field's scenes of size ``hw``: ``flips`` ``""`` (none), ``"each"`` (``hflip`` and ``vflip``
    applied always) or ``"random"`` (``flips``: both at p = 0.5); ``perspective`` the distortion
    scale; ``iou_crop_resize``, ``crop_pad``, ``center_crop``, ``resize`` output sizes;
    ``zoom_out_resize`` ``(side_range, size)``; ``crop_then_zoom_out`` ``(crop size, side_range)``;
    ``letterbox`` the square's side; ``shortest_size`` ``(sizes, max_size)``; ``mosaic`` ``(size,
    the warp after it)``; ``mosaic_affine`` a second warp after a mosaic. A recipe given ``None``
    (``False``) is left out. Names in this order."""
    recipes: dict[str, list[T.Transform]] = {}
    if flips == "each":
        recipes["hflip"] = [T.RandomHorizontalFlip(p=1.0)]
        recipes["vflip"] = [T.RandomVerticalFlip(p=1.0)]
    elif flips == "random":
        recipes["flips"] = [T.RandomHorizontalFlip(), T.RandomVerticalFlip()]
    else:
        assert flips == "", f"flips {flips!r} is not '', 'each' or 'random'"
    recipes["affine"] = [T.RandomAffine(degrees=30, translate=(0.1, 0.1), scale=(0.8, 1.3), shear=8)]
    recipes["rotation"] = [T.RandomRotation(degrees=(-60, 60))]
    recipes["rotation_expand"] = [T.RandomRotation(degrees=(100, 170), expand=True)]
    recipes["perspective"] = [T.RandomPerspective(distortion_scale=perspective, p=1.0)]
    recipes["iou_crop_resize"] = [T.RandomIoUCrop(), T.Resize(iou_crop_resize)]
    recipes["resized_crop"] = [T.RandomResizedCrop(hw, scale=(0.3, 1.0))]
    recipes["crop_pad"] = [T.RandomCrop(crop_pad, padding=6)]
    recipes["center_crop"] = [T.CenterCrop(center_crop)]
    side_range, size = zoom_out_resize
    recipes["zoom_out_resize"] = [T.RandomZoomOut(side_range=side_range, p=1.0), T.Resize(size)]
    size, side_range = crop_then_zoom_out
    recipes["crop_then_zoom_out"] = [T.RandomCrop(size), T.RandomZoomOut(side_range=side_range, p=1.0)]
    if rotate_then_zoom_out:
        recipes["rotate_then_zoom_out"] = [T.RandomRotation(degrees=(25, 50)),
                                           T.RandomZoomOut(side_range=(1.3, 1.6), p=1.0)]
    if resize is not None:
        recipes["resize"] = [T.Resize(resize)]
    recipes["letterbox"] = [T.Pad(4), T.LetterBox((letterbox, letterbox), fill=0)]
    if shortest_size is not None:
        recipes["shortest_size"] = [T.RandomShortestSize(shortest_size[0], max_size=shortest_size[1])]
    recipes["flip_affine_perspective"] = [T.RandomHorizontalFlip(), T.RandomVerticalFlip(),
                                          T.RandomAffine(degrees=15, scale=(0.9, 1.1)),
                                          T.RandomPerspective(distortion_scale=0.3, p=0.5)]
    size, warp = mosaic
    recipes["mosaic"] = [T.Mosaic(size=size, fill=0), warp]
    if mosaic_affine is not None:
        recipes["mosaic_affine"] = [T.Mosaic(size=size, fill=0), mosaic_affine]
    return {name: T.Compose(transforms) for name, transforms in recipes.items()}


def plan_together_and_alone(source: SampleListSource, recipe: T.Compose, field: str, steps: int) -> list:
    """Asserts that ``plan_many`` (one ``plan_batch`` call for several batches, as the planning
    workers do) gives every batch's ``field`` exactly as ``plan`` does: the first ``steps``
    batches of 2 of epoch 1 (shuffled, seed 3). Returns the batches planned together."""
    planner = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=2, shuffle=True, seed=3))
    together = planner.plan_many(1, list(range(steps)))
    for step, got in enumerate(together):
        alone = planner.plan(1, step)
        for a, b in zip(got.fields, alone.fields):
            np.testing.assert_array_equal(a[field], b[field])
    return together


def keras_padded_field(source: SampleListSource, recipe: T.Compose, field: str, device: str) -> tuple:
    """Asserts that a Keras ``DetectionSequence`` (batches of 2, ``max_boxes=5``, seed 1) pads
    ``field``: each image's rows are the planner's, the rest of its 5 rows -1. Returns
    ``(targets[field]`` of the first batch, the sequence's ``field_specs[field])``."""
    from detaug.keras import DetectionSequence

    seq = DetectionSequence(source, recipe, 2, max_boxes=5, seed=1, device=device, num_threads=1,
                            images_on_device=False, plan_workers=0, fields=[field])
    try:
        _, targets = seq[0]
        n = (targets["labels"] >= 0).sum(axis=1)
        planned = seq.planner.plan(0, 0)
        for k in range(2):
            np.testing.assert_array_equal(targets[field][k, :n[k]], planned.fields[k][field])
            assert (targets[field][k, n[k]:] == -1).all()
    finally:
        seq.close()
    return targets[field], seq.field_specs[field]


def exif_rotated_png(path: Path, image: np.ndarray, orientation: int) -> Path:
    """Writes ``image`` (uint8 ``[H, W, 3]``, the stored pixels) to the PNG ``path`` with the EXIF
    ``orientation`` (1-8) the decoder applies; returns ``path``."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG", exif=exif.tobytes())
    path.write_bytes(buffer.getvalue())
    return path
