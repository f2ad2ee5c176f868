"""Mosaic and MixUp: boxes against object pixels after real DALI CPU pipelines (tiles cut by the
centre lines and the canvas border included), the blend ratio in the pixels, the partner rule
under the seed contract, and malformed recipes. DETAUG_TEST_DEVICE=gpu runs them on a GPU."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

import detaug.transforms as T
from detaug.boxes import rotation_matrix, translation_matrix
from detaug.errors import RecipeError
from detaug.pipeline import build_pipeline, feed, input_names
from detaug.plan import PlanState
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug.seeds import SampleRandom, sample_keys
from detaug.sources import Sample, SampleListSource
from detaug.synthetic import BACKGROUND, PALETTE
from detaug.transforms import Compose
from detaug.transforms.compose import Partners
from tests.detaug.consistency import check_boxes_match_pixels, iou, mask_box, object_masks, scene_samples

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")
FILL = 114


# -- helpers ---------------------------------------------------------------------------------------


def one_object_images(seed: int = 0, decoded: bool = False) -> tuple[list[Sample], list[tuple[np.ndarray, tuple]]]:
    """One image per palette colour (18), of varied size and aspect, each with one rectangle of that colour
    (so that an object is found again by colour in a mosaic of any 4 of them); many touch or
    nearly touch the image border. Labels are 1-based image positions."""
    rng = np.random.default_rng(seed)
    samples, objects = [], []
    for i, color in enumerate(PALETTE):
        h, w = int(rng.integers(60, 160)), int(rng.integers(60, 160))
        bw, bh = int(rng.integers(w // 4, w * 3 // 4)), int(rng.integers(h // 4, h * 3 // 4))
        x0 = int(rng.choice([0, w - bw, rng.integers(0, w - bw + 1)]))
        y0 = int(rng.choice([0, h - bh, rng.integers(0, h - bh + 1)]))
        image = np.full((h, w, 3), BACKGROUND, np.uint8)
        image[y0:y0 + bh, x0:x0 + bw] = color
        box = np.array([[x0, y0, x0 + bw, y0 + bh]], np.float32)
        if decoded:
            data = image
        else:
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="PNG")
            data = buffer.getvalue()
        samples.append(Sample(data, box, np.array([i + 1]), image_id=100 + i))
        objects.append((box[0], color))
    return samples, objects


def run(source, recipe: Compose, batch_size: int, *, seed: int = 0, epoch: int = 0, steps=None, shuffle=False):
    """``[(planned batch, [HWC uint8 images])]`` of the real pipeline (planned in this process)."""
    spec = EpochSpec(n=len(source), batch_size=batch_size, seed=seed, shuffle=shuffle)
    planner = BatchPlanner(source, recipe, spec)
    pipe = build_pipeline(source, recipe, batch_size=batch_size, device=DEVICE, num_threads=2, layout="HWC",
                          prefetch_queue_depth=1)
    pipe.build()
    out = []
    for step in range(len(spec)) if steps is None else steps:
        planned = planner.plan(epoch, step)
        feed(pipe, planned.data, planned.params, planned.partners)
        images = pipe.outputs()[0]
        images = images.as_cpu() if hasattr(images, "as_cpu") else images
        out.append((planned, [np.array(images[i]) for i in range(len(planned.positions))]))
    return out


def assert_same_as_without(results, plain) -> None:
    """Asserts that a mixing transform applied to no sample (``p=0``) reads no partner and leaves
    every image and box as the recipe without it gives them (``results`` and ``plain``:
    :func:`run`'s, the same batches)."""
    for (pa, ia), (pb, ib) in zip(results, plain):
        assert (pa.partner_positions == -1).all()  # no partner read
        for a, b in zip(ia, ib):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(pa.boxes, pb.boxes):
            np.testing.assert_array_equal(a, b)


def dropped_by_min_visibility(loose, strict) -> int:
    """How many boxes ``min_visibility`` dropped: ``loose`` and ``strict`` are :func:`run`'s
    batches of one recipe without and with it. Asserts that it only drops: each kept box is one of
    the loose boxes of its label (an image shown twice has its label twice), unchanged."""
    dropped = 0
    for (pl, _), (ps, _) in zip(loose, strict):
        for bl, ll, bs, ls in zip(pl.boxes, pl.labels, ps.boxes, ps.labels):
            assert set(ls.tolist()) <= set(ll.tolist())
            dropped += len(ll) - len(ls)
            for label, box in zip(ls, bs):
                assert any(np.array_equal(box, b) for b in bl[ll == label]), f"box {box} of label {label} changed"
    return dropped


def plans_by_id(source, recipe: Compose, seed: int, batch_size: int, shuffle: bool, steps=None,
                epoch: int = 0) -> dict[int, tuple]:
    """``{image_id: (partner positions, params, boxes)}`` of every sample planned in ``steps``
    (default: every step, in order) of ``epoch``, batches of ``batch_size``."""
    planner = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=batch_size, seed=seed, shuffle=shuffle))
    out = {}
    for step in steps if steps is not None else range(len(planner.spec)):
        planned = planner.plan(epoch, step)
        for k, image_id in enumerate(planned.image_ids):
            out[int(image_id)] = (planned.partner_positions[k], planned.params[k], planned.boxes[k])
    return out


def assert_plans_follow_the_seed(source, recipe: Compose, seed: int, single_steps=None) -> dict[int, tuple]:
    """The seed contract: asserts that a sample's partners, parameters and boxes are the same in
    batches of 4 in order, of 3 shuffled, of 1 (planned in ``single_steps``' order; default in
    order) and of the whole dataset shuffled, and that its partners change with the epoch.
    Returns the plans of batches of 4 (:func:`plans_by_id`)."""
    reference = plans_by_id(source, recipe, seed, 4, False)
    for other in (plans_by_id(source, recipe, seed, 3, True), plans_by_id(source, recipe, seed, 1, False, single_steps),
                  plans_by_id(source, recipe, seed, len(source), True)):
        assert other.keys() == reference.keys()
        for image_id, (positions, params, boxes) in other.items():
            np.testing.assert_array_equal(positions, reference[image_id][0])
            np.testing.assert_array_equal(params, reference[image_id][1])
            np.testing.assert_array_equal(boxes, reference[image_id][2])
    later = plans_by_id(source, recipe, seed, 4, False, epoch=1)
    assert any(not np.array_equal(later[k][0], reference[k][0]) for k in reference)
    return reference


def apart(masks: list[np.ndarray]) -> list[np.ndarray]:
    """Each colour's mask without the lines drawn between two other colours: where two objects
    meet, bilinear blending draws a thin line of in-between colours, which can read as a third
    palette colour (the mean of red and yellow is orange). The pixels within 2 pixels of two
    other colours are set aside, then those of them within 2 pixels of the box of what is left
    are taken back (an object's rim where it touches two others)."""
    def grown(m: np.ndarray) -> np.ndarray:
        p = np.pad(m, 2)
        return np.logical_or.reduce([p[2 + dy:2 + dy + m.shape[0], 2 + dx:2 + dx + m.shape[1]]
                                     for dy in range(-2, 3) for dx in range(-2, 3)])

    near = np.stack([grown(m) for m in masks]).astype(np.int32)
    total = near.sum(axis=0)
    out = []
    for k, m in enumerate(masks):
        body = mask_box(m & (total - near[k] < 2))
        region = np.zeros_like(m)
        if body is not None:
            x0, y0, x1, y1 = (int(v) for v in body)
            region[max(y0 - 2, 0):y1 + 2, max(x0 - 2, 0):x1 + 2] = True
        out.append(m & region)
    return out


def shown_objects(results, objects, j: int):
    """Per rendered sample of ``results`` (``(planned, images)`` pairs), ``(i, image, tiles,
    shown)``: ``tiles`` the dataset positions of its own image and of its first ``j`` partner
    slots (slots without a partner left out), ``shown`` ``(p, mask, box)`` for each image in it
    once: that image's object's visible pixels (bool ``[H, W]``; one object per image) and its
    output box (xyxy; ``None``: none), labelled by position + 1."""
    for planned, images in results:
        for i, image in enumerate(images):
            tiles = [int(planned.positions[i])] + [p for p in planned.partner_positions[i, :j].tolist() if p >= 0]
            shown = sorted(set(tiles))
            masks = apart(object_masks(image, [objects[p][1] for p in shown]))
            by_label = {int(lab): box for lab, box in zip(planned.labels[i], planned.boxes[i])}
            yield i, image, tiles, [(p, mask, by_label.get(p + 1)) for p, mask in zip(shown, masks)]


def shown_boxes(results, objects, j: int, border_slivers: bool = False) -> tuple[list[tuple], list[str]]:
    """``(p, box, tight, matches)`` of every output box with its object's visible pixels
    (``tight``, xyxy; ``matches``: :func:`_matches`), and problems (an object with visible pixels
    but no box, a box without pixels), for samples made of their own image and the first ``j``
    partner slots (one object per image, labelled by position + 1; an image shown twice is
    skipped: its colour is in two places). ``border_slivers``: a box under 6 pixels thick on the
    output canvas border matches where the visible pixels lie inside it (after a perspective, the
    slanted tip of an object cut by the border covers less than half of its pixels along the cut:
    the exact box holds more than the half-coverage mask)."""
    records, problems = [], []
    for i, image, tiles, shown in shown_objects(results, objects, j):
        for p, mask, box in shown:
            if tiles.count(p) > 1:
                continue
            tight = mask_box(mask)
            if box is None:
                if tight is not None and (tight[2:] - tight[:2]).min() > 3:
                    problems.append(f"sample {i}: object of image {p} visible at {tight} but no box")
                continue
            if tight is None:
                problems.append(f"sample {i}: box {box} of image {p} but no visible pixels")
                continue
            match = _matches(box, tight)
            if border_slivers and not match:
                on_border = box[1] <= 0 or box[0] <= 0 or box[3] >= image.shape[0] or box[2] >= image.shape[1]
                inside = (tight[:2] >= box[:2] - 1.5).all() and (tight[2:] <= box[2:] + 1.5).all()
                match = bool(on_border and min(box[2:] - box[:2]) < 6 and inside)
            records.append((p, box, tight, match))
    return records, problems


def shown_ious(results, objects, j: int, border_slivers: bool = False) -> tuple[list[tuple[float, bool]], list[str]]:
    """``(IoU, matches)`` of every output box with its object's visible pixels, and the problems
    (:func:`shown_boxes`)."""
    records, problems = shown_boxes(results, objects, j, border_slivers)
    return [(iou(box, tight), match) for _, box, tight, match in records], problems


def mosaic_ious(results, objects) -> tuple[list[tuple[float, bool]], list[str], int]:
    """:func:`shown_ious` of a 2x2 mosaic, and how many boxes are cut (smaller than their whole
    object scaled into the mosaic)."""
    records, problems = shown_boxes(results, objects, 3)
    cut = sum(bool((box[2:] - box[:2]).min() < 0.9 * (objects[p][0][2:] - objects[p][0][:2]).min() * 96 / 160)
              for p, box, _, _ in records)
    return [(iou(box, tight), match) for _, box, tight, match in records], problems, cut


def _matches(box: np.ndarray, tight: np.ndarray, tolerance: float = 1.5) -> bool:
    """A box matches its object's visible pixels (``tight``, xyxy) with IoU >= 0.85, or, as in
    :func:`tests.detaug.consistency.check_boxes_match_pixels`, with every edge within
    ``tolerance`` pixels, or, for a sliver thinner than ``2 * tolerance`` (which cannot reach that
    IoU on a pixel grid), with the visible pixels inside the box."""
    if iou(box, tight) >= 0.85 or np.abs(box - tight).max() <= tolerance:
        return True
    sliver = min(box[2] - box[0], box[3] - box[1]) < 2 * tolerance
    return bool(sliver and (tight[:2] >= box[:2] - tolerance).all() and (tight[2:] <= box[2:] + tolerance).all())


def assert_iou_targets(ious: list[tuple[float, bool]]) -> None:
    """The pixel-box targets on ``(IoU, matches)`` per box (:func:`_matches`): 98% match, median
    IoU >= 0.95."""
    a = np.array([i for i, _ in ious])
    match = np.array([m for _, m in ious], dtype=bool)
    assert len(a) >= 20, f"too few boxes checked ({len(a)})"
    assert np.mean(match) >= 0.98, f"boxes matching their pixels: only {np.mean(match):.3f}; IoUs {np.sort(a[~match])}"
    assert np.median(a) >= 0.95, f"median IoU {np.median(a):.3f}"


# -- Mosaic ----------------------------------------------------------------------------------------

MOSAIC_RECIPES = {
    "mosaic_alone": [T.Mosaic((96, 96), fill=FILL)],
    "mosaic_affine_resize": [
        T.Mosaic((96, 96), fill=FILL),
        T.RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(1.0, 3.0), shear=5, fill=FILL),
        T.Resize((96, 96)),
    ],
    "mosaic_zoom_out_rotate": [  # boxes cut by the mosaic canvas border, then rotated into view
        T.Mosaic((96, 96), center=(0.2, 1.8), fill=FILL),
        # counter-clockwise 20-40 degrees (RandomAffine's positive angles turn clockwise, as torchvision's)
        T.RandomAffine(degrees=(-40, -20), scale=(0.6, 0.8), fill=FILL),
    ],
    "mosaic_perspective_flip": [
        T.Mosaic((96, 96), center=(0.3, 1.7), fill=FILL),
        T.RandomPerspective(distortion_scale=0.5, p=1.0, fill=FILL),
        T.RandomAffine(translate=(0.1, 0.1), scale=(1.5, 2.5), fill=FILL),
        T.Resize((96, 96)),
        T.RandomHorizontalFlip(),
    ],
}


def with_pool(transforms: list, pool: str) -> list:
    """``transforms`` with every mixing transform's ``pool`` set to ``pool``."""
    def fields(t):
        return {k: v for k, v in t.to_dict().items() if k != "name"}

    return [type(t)(**{**fields(t), "pool": pool}) if t.kind == "mixing" else t for t in transforms]


@pytest.mark.parametrize("pool", ["dataset", "batch"])
@pytest.mark.parametrize("name", sorted(MOSAIC_RECIPES))
def test_mosaic_boxes_match_object_pixels(name, pool):
    samples, objects = one_object_images()
    recipe = Compose(with_pool(MOSAIC_RECIPES[name], pool), min_size=1.0)
    results = run(SampleListSource(samples), recipe, 6)
    ious, problems, cut = mosaic_ious(results, objects)
    assert not problems, "\n".join(problems)
    assert_iou_targets(ious)
    if name == "mosaic_alone":  # the tile borders and the canvas border do cut boxes
        assert cut >= 3, f"only {cut} boxes cut: the test does not exercise clipping"
        sizes = {tuple(img.shape) for _, imgs in results for img in imgs}
        assert sizes == {(192, 192, 3)}


def test_mosaic_tiles_and_fill_where_no_image():
    """Mosaic alone: the canvas is (2h, 2w); each quadrant shows its image scaled to fit (h, w)
    with a corner at the centre, and ``fill`` elsewhere; the sample's own image is top-left."""
    samples, objects = one_object_images(seed=3)
    recipe = Compose([T.Mosaic((50, 60), fill=30)])
    (planned, images), = run(SampleListSource(samples), recipe, 4, steps=[0])
    for i, image in enumerate(images):
        assert image.shape == (100, 120, 3)
        # the four quadrant sizes add up to the whole canvas: the centre splits it
        sizes = np.array([planned.plan(f"mosaic.tile{k}.size")[i] for k in range(4)])
        xc, yc = sizes[0][1], sizes[0][0]
        assert 30 <= xc <= 90 and 25 <= yc <= 75  # center=(0.5, 1.5) of (w, h)
        assert (sizes[1] == [yc, 120 - xc]).all() and (sizes[2] == [100 - yc, xc]).all()
        # the sample's own image ends at the centre (its bottom-right corner); left of it, fill
        own = samples[int(planned.positions[i])].image
        h0, w0 = Image.open(io.BytesIO(own)).size[::-1]
        r = min(50 / h0, 60 / w0)
        tw, th = min(np.ceil(w0 * r), 60), min(np.ceil(h0 * r), 50)
        if xc - tw >= 2 and yc >= 4:
            assert (image[: int(yc) - 2, : int(xc - tw) - 1] == 30).all()
        if yc - th >= 2 and xc >= 4:
            assert (image[: int(yc - th) - 1, : int(xc) - 2] == 30).all()


def test_mosaic_decoded_arrays_same_boxes_as_encoded():
    """Decoded arrays and encoded PNGs of the same images: identical plans and boxes, and the
    same pixels (lossless images)."""
    recipe = Compose(MOSAIC_RECIPES["mosaic_affine_resize"])
    encoded = run(SampleListSource(one_object_images(5)[0]), recipe, 4, steps=[0, 1])
    decoded = run(SampleListSource(one_object_images(5, decoded=True)[0]), recipe, 4, steps=[0, 1])
    for (pa, ia), (pb, ib) in zip(encoded, decoded):
        np.testing.assert_array_equal(pa.params, pb.params)
        np.testing.assert_array_equal(pa.partner_positions, pb.partner_positions)
        for a, b in zip(pa.boxes, pb.boxes):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(ia, ib):
            assert np.abs(a.astype(int) - b).max() <= 1


def test_min_visibility_applies_after_composition():
    """A box cut to a sliver by its tile's quadrant is dropped by min_visibility, kept without."""
    samples, objects = one_object_images()
    source = SampleListSource(samples)
    recipe = [T.Mosaic((96, 96), fill=FILL)]
    loose = run(source, Compose(recipe, min_visibility=0.0), 6)
    strict = run(source, Compose(recipe, min_visibility=0.6), 6)
    assert dropped_by_min_visibility(loose, strict) > 0


# -- MixUp -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["dataset", "batch"])
def test_mixup_keeps_both_boxes_and_blends_with_the_drawn_ratio(pool):
    """out = r * sample + (1 - r) * partner: the sample's canvas is rendered without MixUp, the
    partner's recovered from the output with the planned ratio; each set of boxes matches its
    own objects' pixels, and the recovered background is the grey it should be."""
    samples, scenes = scene_samples(8, seed=4, size=(120, 90))
    source = SampleListSource(samples)
    mixed = Compose([T.Resize((72, 96)), T.MixUp(p=1.0, alpha=4.0, scale=(0.7, 1.3), fill=FILL, pool=pool)])
    plain = Compose([T.Resize((72, 96))])
    ratio_at = mixed.plan_layout.field("mixup.ratio").start
    problems, ratios, checked = [], [], 0
    for (pm, im), (pp, ip) in zip(run(source, mixed, 4), run(source, plain, 4)):
        for i in range(len(im)):
            r = float(pm.params[i][ratio_at])
            ratios.append(r)
            own = scenes[int(pm.positions[i])]
            partner = scenes[int(pm.partner_positions[i, -1])]
            n_own = len(pp.boxes[i])
            np.testing.assert_array_equal(pm.boxes[i][:n_own], pp.boxes[i])  # the sample's boxes, unchanged
            assert len(pm.boxes[i]) > n_own  # ... and the partner's, added
            problems += check_boxes_match_pixels(ip[i], pp.boxes[i], pp.labels[i], own, min_iou=0.85)
            if r > 0.8:
                continue  # too little of the partner to recover it
            recovered = (im[i].astype(np.float64) - r * ip[i]) / (1.0 - r)
            recovered = np.clip(np.round(recovered), 0, 255).astype(np.uint8)
            found = check_boxes_match_pixels(recovered, pm.boxes[i][n_own:], pm.labels[i][n_own:], partner, min_iou=0.85)
            problems += [f"partner of sample {i} (r={r:.2f}): {p}" for p in found]
            background = (np.abs(ip[i].astype(int) - FILL).max(axis=-1) == 0)
            assert np.median(np.abs(recovered[background].astype(int) - FILL)) <= 2
            checked += 1
    assert not problems, "\n".join(problems)
    assert checked >= 4
    assert 0 < min(ratios) and max(ratios) < 1 and np.std(ratios) > 0.02


def test_mixup_not_applied_leaves_the_sample_as_it_is():
    samples, _ = scene_samples(6, seed=1)
    source = SampleListSource(samples)
    mixed = run(source, Compose([T.Resize((64, 64)), T.MixUp(p=0.0)]), 3)
    assert_same_as_without(mixed, run(source, Compose([T.Resize((64, 64))]), 3))


@pytest.mark.parametrize("pool", ["dataset", "batch"])
def test_mixup_blends_only_the_samples_it_applies_to(pool):
    """In a batch where MixUp applies to some samples (the pipeline blends those only, in a DALI
    conditional), the others are exactly the recipe without MixUp."""
    samples, _ = scene_samples(12, seed=4, size=(120, 90))
    source = SampleListSource(samples)
    mixed = Compose([T.Resize((72, 96)), T.MixUp(p=0.5, alpha=4.0, fill=FILL, pool=pool)])
    at = mixed.plan_layout.field("mixup.ratio").start
    applied = []
    for (pm, im), (_, ip) in zip(run(source, mixed, 12, seed=1), run(source, Compose([T.Resize((72, 96))]), 12, seed=1)):
        for i in range(len(im)):
            blended = bool(pm.params[i][at] < 1.0)
            applied.append(blended)
            assert np.array_equal(im[i], ip[i]) != blended
    assert 0 < sum(applied) < len(applied)


# -- every box holds what is drawn of its object: mixing, then warps ------------------------------------

#: 4 colour groups of 4 palette colours; a mosaic's tile ``k`` is an image of group ``k``, so that
#: every object of a mosaic has its own colour (a MixUp partner, checked on its own canvas, is of any group)
GROUPS = [PALETTE[4 * g:4 * g + 4] for g in range(4)]
#: the fills are the images' grey background: an object's share of a pixel is read against it
WARP_FILL = MOSAIC_FILL = FILL

DRAWN_RECIPES = {
    "mosaic_affine_resize": [  # issue 38's recipe, at a smaller size
        T.Mosaic((64, 64), fill=MOSAIC_FILL),
        T.RandomAffine(degrees=15, scale=(0.8, 1.2), shear=5, fill=WARP_FILL),
        T.Resize((64, 64)),
    ],
    "mosaic_rotation": [T.Mosaic((64, 64), fill=MOSAIC_FILL), T.RandomRotation(30, fill=WARP_FILL)],
    "mosaic_perspective": [
        T.Mosaic((64, 64), fill=MOSAIC_FILL),
        T.RandomPerspective(distortion_scale=0.6, p=1.0, fill=WARP_FILL),
        T.RandomAffine(degrees=10, fill=WARP_FILL),
    ],
    "mosaic_crop_rotation": [  # cut by the crop's canvas, drawn, then rotated (a second warp)
        T.Mosaic((64, 64), fill=MOSAIC_FILL),
        T.RandomResizedCrop((96, 96), scale=(0.2, 0.6)),
        T.RandomRotation(25, fill=WARP_FILL),
    ],
    "mixup_affine": [  # the partner cut by the canvas (scale > 1), then sheared and rotated
        T.Resize((96, 96)),
        T.MixUp(p=1.0, alpha=4.0, scale=(1.2, 2.0), fill=MOSAIC_FILL),
        T.RandomAffine(degrees=30, shear=8, fill=WARP_FILL),
    ],
    "mosaic_mixup_rotation": [
        T.Mosaic((64, 64), fill=MOSAIC_FILL),
        T.MixUp(p=1.0, alpha=4.0, scale=(1.0, 1.6), fill=MOSAIC_FILL),
        T.RandomRotation(30, fill=WARP_FILL),
    ],
}


def group_images(seed: int, per_group: int = 5) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per colour group of :data:`GROUPS`, ``per_group`` decoded images ``(uint8 [H, W, 3], boxes
    float32 [4, 4] xyxy)`` of varied size on the grey background, each with one rectangle of each
    colour of its group (box ``k`` has colour ``k``; sides up to half the image's), most touching
    the image border, 2 pixels apart: a mosaic's canvas border and a cropping partner cut them
    anywhere, slivers included."""
    rng = np.random.default_rng(seed)
    out = []
    for colours in GROUPS:
        images = []
        while len(images) < per_group:
            h, w = int(rng.integers(48, 140)), int(rng.integers(48, 140))
            image = np.full((h, w, 3), BACKGROUND, np.uint8)
            boxes: list[list[int]] = []
            for _ in range(200):
                bw, bh = int(rng.integers(8, w // 2)), int(rng.integers(8, h // 2))
                x0 = int(rng.choice([0, w - bw, rng.integers(0, w - bw + 1)]))
                y0 = int(rng.choice([0, h - bh, rng.integers(0, h - bh + 1)]))
                box = [x0, y0, x0 + bw, y0 + bh]
                if all(box[0] >= b[2] + 2 or b[0] >= box[2] + 2 or box[1] >= b[3] + 2 or b[1] >= box[3] + 2 for b in boxes):
                    boxes.append(box)
                if len(boxes) == len(colours):
                    break
            if len(boxes) < len(colours):
                continue
            for (x0, y0, x1, y1), colour in zip(boxes, colours):
                image[y0:y1, x0:x1] = colour
            images.append((image, np.array(boxes, np.float32)))
        out.append(images)
    return out


def colour_share(pixels: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    """Share ``[...]`` of ``colour`` in each pixel ``[..., 3]`` read as a blend of it and the grey
    background: 1 on the colour, 0 at the grey's distance from it or farther."""
    c = np.asarray(colour, np.float64)
    return 1.0 - np.linalg.norm(pixels.astype(np.float64) - c, axis=-1) / np.linalg.norm(c - np.asarray(BACKGROUND))


def drawn_problems(recipe: Compose, trials: int, batch: int = 8) -> tuple[list[str], int]:
    """Problems of ``trials`` batches of ``recipe`` (a Mosaic and/or a MixUp(p=1), then warps)
    rendered by the real pipeline: a box with no pixel showing a third of its object's colour
    (a sliver drawn at half a pixel's colour can be thinned by a later bilinear warp; one of which
    nothing is drawn shows less than half anywhere), or an object drawn (half its colour, on 4
    pixels or more, spanning 2 or more in x and y) without a box. Each image's boxes are read on
    the canvas that shows only its layer: the mosaic (or the sample) with the blend ratio set to
    1, the MixUp partner with it set to 0 (the same plan, the same boxes). Returns the problems
    and how many boxes were checked."""
    images = group_images(5)
    j = recipe.num_partners
    mosaic = recipe.canvas_stage is not None
    source = SampleListSource([Sample(images[0][0][0], images[0][0][1], np.arange(4), image_id=1)])  # decoded arrays
    pipe = build_pipeline(source, recipe, batch_size=batch, device=DEVICE, num_threads=2, layout="HWC",
                          prefetch_queue_depth=1)
    pipe.build()
    ratio_at = recipe.plan_layout.field("mixup.ratio").start if "mixup.ratio" in recipe.plan_layout else None
    problems, checked = [], 0
    for trial in range(trials):
        rng = np.random.default_rng(trial)
        # slot k of sample i: (group, image); tiles from groups 0-3, a MixUp partner from any group
        picks = [[(k if mosaic and k < 4 else int(rng.integers(4)), int(rng.integers(len(images[0]))))
                  for k in range(1 + j)] for _ in range(batch)]
        chosen = [[images[g][n] for g, n in row] for row in picks]
        slot = [[row[k] for row in chosen] for k in range(1 + j)]
        shapes = [[np.array(im.shape) for im, _ in column] for column in slot]
        boxes = [[b for _, b in column] for column in slot]
        labels = [[100 * k + np.arange(4) for _ in column] for k, column in enumerate(slot)]  # slot, colour
        keys = sample_keys(trial, 0, np.arange(batch) + 1)
        params, out_boxes, out_labels = recipe.plan_batch(shapes[0], boxes[0], labels[0], keys,
                                                          Partners(shapes[1:], boxes[1:], labels[1:]))
        params = np.stack(params)
        views = {"own": params}
        if ratio_at is not None:
            views = {"own": params.copy(), "partner": params.copy()}
            views["own"][:, ratio_at], views["partner"][:, ratio_at] = 1.0, 0.0
        for view, vparams in views.items():
            feed(pipe, [im for im, _ in slot[0]], vparams, [[im for im, _ in column] for column in slot[1:]])
            out = pipe.outputs()[0]
            out = out.as_cpu() if hasattr(out, "as_cpu") else out
            slots = [j] if view == "partner" else [k for k in range(1 + j) if ratio_at is None or k != j]
            for i in range(batch):
                image = np.array(out[i])
                shown = [(k, c) for k in slots for c in range(4)]
                colours = [GROUPS[picks[i][k][0]][c] for k, c in shown]
                clear = apart(object_masks(image, colours))
                by_label = dict(zip(out_labels[i].tolist(), out_boxes[i]))
                for (k, c), strong in zip(shown, clear):
                    box = by_label.get(100 * k + c)
                    where = f"trial {trial}, sample {i}, {view} view, slot {k}, colour {c}"
                    problems += drawn_box_problems(image, strong, box, GROUPS[picks[i][k][0]][c], where)
                    checked += int(box is not None)
    return problems, checked


def drawn_box_problems(image: np.ndarray, mask: np.ndarray, box: np.ndarray | None, colour: tuple[int, int, int],
                       where: str) -> list[str]:
    """The problem (``[]``: none) of one object of ``colour`` on ``image`` (``[H, W, 3]``): its
    ``box`` (xyxy) with no pixel showing a third of the colour, or, without a box (``None``), the
    object drawn (``mask``: bool ``[H, W]``, its pixels at half its colour) on 4 pixels or more
    spanning 2 or more in x and y. ``where`` starts the message."""
    if box is None:
        tight = mask_box(mask)
        if tight is not None and mask.sum() >= 4 and (tight[2:] - tight[:2]).min() >= 2:
            return [f"{where}: object drawn at {tight.tolist()} ({mask.sum()} pixels) but no box"]
        return []
    x0, y0 = (int(np.floor(v)) for v in box[:2])
    x1, y1 = (int(np.ceil(v)) for v in box[2:])
    share = colour_share(image[y0:y1, x0:x1], colour).max(initial=0.0)
    if share < 1 / 3:
        return [f"{where}: box {np.round(box, 2).tolist()} holds no pixel of its object (at most {share:.2f} of its colour)"]
    return []


def test_a_layer_drops_what_its_canvas_does_not_draw_before_a_warp():
    """A tile whose quadrant starts at row 40, placed half a pixel above it: of boxes ending 0.4
    and 0.7 pixels into the quadrant, the first covers no pixel centre (row 40's is at 40.5) and
    is dropped before a rotation moves it; the second covers it and is kept, rotated exactly,
    a box many pixels across (the first would have been one too, over nothing)."""
    boxes = np.array([[10.0, 0.0, 50.0, 0.9], [10.0, 0.0, 50.0, 1.2]])
    hw = np.array([[100.0, 100.0]])
    state = PlanState(rand=SampleRandom(sample_keys(0, 0, [1])), source_hw=hw, boxes_src=boxes,
                      sample=np.zeros(2, np.int64), layer_hw=hw, layer_owner=np.zeros(1, np.int64),
                      box_layer=np.zeros(2, np.int64))
    state.start_canvas(hw)
    state.place_layers(np.array([0]), translation_matrix(0.0, 39.5), np.array([[0.0, 40.0, 100.0, 100.0]]))
    np.testing.assert_allclose(state.boxes().boxes_xyxy, [[10, 40, 50, 40.4], [10, 40, 50, 40.7]], atol=1e-12)
    state.drop_undrawn()
    turn = translation_matrix(50, 50) @ rotation_matrix(20.0) @ translation_matrix(-50, -50)
    state.apply(turn, hw)
    after = state.boxes()
    assert after.keep.tolist() == [False, True]
    outline = (np.array([[10, 40, 1], [50, 40, 1], [50, 40.7, 1], [10, 40.7, 1]]) @ turn[0].T)[:, :2]
    np.testing.assert_allclose(after.boxes_xyxy[1], [*outline.min(axis=0), *outline.max(axis=0)], atol=1e-9)
    assert (after.boxes_xyxy[1, 2:] - after.boxes_xyxy[1, :2]).min() > 5


@pytest.mark.parametrize("name", sorted(DRAWN_RECIPES))
def test_every_box_holds_what_is_drawn_of_its_object(name):
    """Mosaic and MixUp, then rotations, shears, perspective and crops, over many seeds: every
    output box holds pixels of its object, and every object drawn has its box. A box is cut to
    what its tile (or the partner's canvas) draws before the later warps move it: a sliver
    thinner than half a pixel along the canvas border is not drawn, and its outline, rotated,
    would be a box over nothing (issue 38: a 5.7 x 35 px box on the fill)."""
    problems, checked = drawn_problems(Compose(DRAWN_RECIPES[name], min_size=1.0), trials=16)
    assert checked >= 300, f"too few boxes checked ({checked})"
    assert not problems, f"{len(problems)} of {checked} boxes:\n" + "\n".join(problems[:20])


# -- the partner rule and the seed contract ----------------------------------------------------------


def test_partners_and_plans_do_not_depend_on_batch_or_order():
    """A sample's partners, parameters and boxes are the same in any batch, batch size, epoch
    order and random access order; they change with the epoch."""
    samples, _ = one_object_images()
    reference = assert_plans_follow_the_seed(SampleListSource(samples), T.yolo_recipe(64), 7,
                                             single_steps=np.random.default_rng(1).permutation(len(samples)))
    drawn = np.concatenate([v[0][:3] for v in reference.values()])
    assert len(set(drawn.tolist())) >= 6  # uniform over the dataset, not the batch


def test_batch_pool_takes_partners_from_the_batch_decoded_once():
    """pool="batch": every partner is a batch-mate (its dataset position is in the batch, its
    batch position in the plan), drawn by the sample's key over the batch, nothing is fed for
    those slots, and the draws are those of the dataset rule scaled to the batch."""
    samples, _ = one_object_images()
    source = SampleListSource(samples)
    recipe = T.yolo_recipe(64, mixup=0.5, pool="batch")
    assert recipe.batch_slots == (0, 1, 2, 3)
    assert input_names(recipe) == ["data", "params"]
    planner = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=5, seed=3, shuffle=True))
    for step in range(len(planner.spec)):
        planned = planner.plan(1, step)
        b = len(planned.positions)
        assert planned.partners == [None] * 4
        index = np.stack([planned.plan(f"slot{k}.batch_index") for k in range(4)], 1).astype(np.int64)
        assert ((index >= 0) & (index < b)).all()
        shown = planned.partner_positions >= 0
        np.testing.assert_array_equal(planned.partner_positions[shown], planned.positions[index][shown])
        assert shown[:, :3].all() and not shown[:, 3].all()  # Mosaic always, MixUp where applied
        drawn, _ = recipe.partner_draws(sample_keys(3, 1, planned.image_ids), len(source))
        np.testing.assert_array_equal(drawn, index)
        dataset_rule = T.yolo_recipe(64, mixup=0.5).partner_draws(sample_keys(3, 1, planned.image_ids), 2**32)[0]
        np.testing.assert_array_equal(index, dataset_rule * b >> 32)  # one stream, scaled to the batch
    again = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=5, seed=3, shuffle=True)).plan(1, 2)
    np.testing.assert_array_equal(again.params, planner.plan(1, 2).params)  # a pure function of the batch


def test_batch_pool_images_equal_the_dataset_pool_fed_the_same_partners():
    """The pixels of pool="batch" (each image decoded once, tiles taken from the batch) equal
    those of the dataset rule when it is handed the same partners: a recipe whose partners are
    drawn over a one-image-per-sample batch of the same images."""
    samples, _ = one_object_images(seed=2, decoded=True)
    source = SampleListSource(samples)
    batch = Compose([T.Mosaic((48, 48), fill=FILL, pool="batch"), T.Resize((40, 40))])
    (planned, images), = run(source, batch, 6, steps=[0])
    plain = Compose([T.Mosaic((48, 48), fill=FILL), T.Resize((40, 40))])
    for i in range(6):
        tiles = [int(planned.positions[i])] + planned.partner_positions[i, :3].tolist()
        made = [samples[p] for p in tiles]
        one = SampleListSource([made[0]])
        # the dataset rule with these partners: plan by hand, feeding the same tiles
        shapes = [np.array(s.image.shape) for s in made]
        keys = sample_keys(0, 0, [made[0].image_id])
        params, boxes, _ = plain.plan_batch([shapes[0]], [made[0].boxes], [made[0].labels], keys,
                                            Partners([[sh] for sh in shapes[1:]], [[s.boxes] for s in made[1:]],
                                                     [[s.labels] for s in made[1:]]))
        np.testing.assert_allclose(boxes[0], planned.boxes[i], atol=1e-4)
        pipe = build_pipeline(one, plain, batch_size=1, device=DEVICE, num_threads=1, layout="HWC",
                              prefetch_queue_depth=1)
        pipe.build()
        feed(pipe, [made[0].image], np.stack(params), [[s.image] for s in made[1:]])
        out = pipe.outputs()[0]
        out = np.array((out.as_cpu() if hasattr(out, "as_cpu") else out)[0])
        assert np.abs(out.astype(int) - images[i]).max() <= 1


def test_bad_partner_is_replaced_by_the_next_position_and_counted():
    samples, _ = one_object_images()
    samples[4] = Sample(b"this is not an image", np.zeros((0, 4), np.float32), np.zeros(0, np.int64), image_id=104)
    source = SampleListSource(samples)
    recipe = Compose([T.Mosaic((32, 32))])
    planner = BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=12, seed=0))
    planned = planner.plan(0, 0)
    drawn, _ = recipe.partner_draws(sample_keys(0, 0, planned.image_ids), len(source))
    assert 4 not in planned.partner_positions
    hits = int((drawn == 4).sum())
    assert hits > 0, "pick a seed whose partners include the bad image"
    assert np.array_equal(planned.partner_positions[drawn == 4], np.full(hits, 5))
    assert sum(s["image_id"] == 104 for s in planned.skipped) >= hits
    with pytest.raises(Exception, match="not an image|cannot"):
        BatchPlanner(source, recipe, EpochSpec(n=len(source), batch_size=12, seed=0), on_error="raise").plan(0, 0)


# -- recipes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe, match", [
    ([T.RandomHorizontalFlip(), T.Mosaic((64, 64))], "Mosaic.*first transform"),
    ([T.MixUp()], "MixUp.*fixed canvas size"),
    ([T.RandomIoUCrop(), T.MixUp()], "MixUp.*fixed canvas size"),
    ([T.Resize((64, 64)), T.MixUp(), T.MixUp()], "only once"),
    ([T.Mosaic((64, 64)), T.Mosaic((64, 64))], "first transform"),
])
def test_malformed_mixing_recipes(recipe, match):
    with pytest.raises(RecipeError, match=match):
        Compose(recipe)


def test_a_mixing_transform_without_a_stage_cannot_be_planned():
    from detaug.transforms.mixing import MixingTransform

    class Stitch(MixingTransform):  # not registered: a recipe file never names it
        partners = 1

    with pytest.raises(RecipeError, match=r"Stitch.*neither a canvas nor a blend stage"):
        Compose([T.Resize((32, 32)), Stitch()])


def test_mixing_transforms_own_their_partner_slots_and_plan_fields():
    recipe = T.yolo_recipe(64, mixup=0.5)
    mosaic, mixup = recipe.mixing
    assert (recipe.canvas_stage, recipe.blend_stage) == (mosaic, mixup)
    assert recipe.slots_of(mosaic) == (0, 1, 2) and recipe.slots_of(mixup) == (3,)
    names = recipe.plan_layout.names
    assert "roi" not in names  # the canvas stage decodes the sample's image itself (tile 0)
    assert names[:3] == ["mosaic.tile0.roi", "mosaic.tile0.matrix", "mosaic.tile0.size"]
    assert [n for n in names if n.startswith("mixup.")] == ["mixup.roi", "mixup.matrix", "mixup.size", "mixup.ratio"]


@pytest.mark.parametrize("spec, match", [
    ({"name": "Mosaic"}, "Mosaic.size: required"),
    ({"name": "Mosaic", "size": "640"}, "Mosaic.size"),
    ({"name": "Mosaic", "size": 64, "center": [1.5, 0.5]}, "Mosaic.center"),
    ({"name": "Mosaic", "size": 64, "center": [0.5, 3]}, "Mosaic.center"),
    ({"name": "MixUp", "alpha": -1}, "MixUp.alpha"),
    ({"name": "MixUp", "p": 2}, "MixUp.p"),
    ({"name": "MixUp", "scale": [2, 1]}, "MixUp.scale"),
    ({"name": "MixUp", "ratio": 0.5}, "MixUp.ratio: unknown field"),
])
def test_malformed_fields(spec, match):
    with pytest.raises(RecipeError, match=match):
        Compose.from_dict({"transforms": [spec]})


def test_yaml_recipe_error_names_the_line():
    text = "transforms:\n  - name: RandomHorizontalFlip\n  - name: Mosaic\n    size: 64\n"
    with pytest.raises(RecipeError, match="line 3.*Mosaic.*first"):
        Compose.from_yaml(text)


def test_yolo_recipe_round_trips_and_fixes_the_size():
    recipe = T.yolo_recipe(320)
    assert recipe.output_size() == (320, 320)
    assert Compose.from_yaml(recipe.to_yaml()) == recipe
    assert recipe.num_partners == 4 and len(recipe.segments) == 1  # one fused warp after the mosaic
    assert recipe.segment_projective == [True]
    assert not any(T.default_detection_recipe().segment_projective)  # the default keeps warp_affine


def test_plan_batch_without_partners_is_an_error():
    recipe = Compose([T.Mosaic((32, 32))])
    with pytest.raises(ValueError, match="partners"):
        recipe.plan_batch([np.array([10, 10, 3])], [np.zeros((0, 4))], [np.zeros(0)], np.array([[0, 0, 1]]))
