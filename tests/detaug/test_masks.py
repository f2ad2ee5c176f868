"""Instance masks (issue 41): per-object ``uint8 [N, H, W]`` masks moved by the same planned geometry
as their image and boxes, checked on the pixels.

Synthetic scenes: a black image with three objects, an ellipse, a triangle and a rotated
ellipse, each painted in its own primary colour (object 0 red, 1 green, 2 blue: orthogonal, so a
pixel's share of a colour is its projection on it) exactly where its mask is 1. After a recipe
runs (real DALI CPU pipelines), the pixels of each colour (share >= 1/2 of the colour's weight
in the output) must match the union of the output masks of that colour's objects (IoU >= 0.98
median over the objects, every one >= 0.9), each mask row aligned with its kept box (inside it).
DALI runs on the CPU; ``DETAUG_TEST_DEVICE=gpu`` runs the same checks on a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import detaug.transforms as T
from detaug import DatasetError
from detaug.errors import ImageError
from detaug.masks import CocoMasks, check_masks, masks_to_boxes, warp_mask
from detaug.epochs import EpochSpec
from detaug.planned_batch import batch_columns
from detaug.planning import BatchPlanner
from detaug.sources import Sample, SampleListSource
from tests.detaug.geometric import exif_rotated_png, geometric_recipes, keras_padded_field, plan_together_and_alone

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")  # DETAUG_TEST_DEVICE=gpu: the same checks on a GPU
COLOURS = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255]], np.float64)
HW = (144, 192)


def shape_mask(kind: str, hw: tuple[int, int], centre: tuple[float, float], size: tuple[float, float],
               angle: float = 0.0) -> np.ndarray:
    """uint8 ``[H, W]``: an ellipse (semi-axes ``size``, rotated by ``angle`` degrees) or a
    triangle (in the box of half-sizes ``size``) around ``centre``, at pixel centres."""
    ys, xs = np.mgrid[0:hw[0], 0:hw[1]] + 0.5
    x, y = xs - centre[0], ys - centre[1]
    c, s = np.cos(np.radians(angle)), np.sin(np.radians(angle))
    u, v = c * x + s * y, -s * x + c * y
    if kind == "ellipse":
        inside = (u / size[0]) ** 2 + (v / size[1]) ** 2 <= 1
    else:  # apex up, base down: |u| <= a (v + b) / (2 b)
        a, b = size
        inside = (v <= b) & (np.abs(u) <= a * (v + b) / (2 * b))
    return inside.astype(np.uint8)


def scene(seed: int, hw: tuple[int, int] = HW) -> Sample:
    """Three objects side by side (labels ``10 seed + 0 .. 2``, colour = label % 10), painted on
    black where their masks are; boxes are the masks' bounds."""
    rng = np.random.default_rng(seed)
    h, w = hw
    third = w / 3
    masks = np.stack([
        shape_mask("ellipse", hw, (third * 0.5 + rng.uniform(-4, 4), h * 0.45), (third * 0.36, h * 0.3)),
        shape_mask("triangle", hw, (third * 1.5, h * 0.5 + rng.uniform(-5, 5)), (third * 0.4, h * 0.32)),
        shape_mask("ellipse", hw, (third * 2.5, h * 0.55), (third * 0.42, h * 0.18), angle=rng.uniform(20, 70)),
    ])
    image = np.zeros((h, w, 3), np.uint8)
    for k, m in enumerate(masks):
        image[m == 1] = COLOURS[k]
    boxes = masks_to_boxes(masks)
    return Sample(image, boxes, 10 * seed + np.arange(3), image_id=seed + 1, fields={"masks": masks})


def colour_region(image: np.ndarray, k: int, weight: float = 1.0) -> np.ndarray:
    """bool ``[H, W]``: the pixels whose share of colour ``k`` is at least ``weight / 2``."""
    colour = COLOURS[k]
    share = image.astype(np.float64) @ colour / (colour @ colour)
    return share >= weight / 2


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def check_masks_on_pixels(out: dict, weight: float = 1.0) -> list[float]:
    """Each colour's pixels against the union of its objects' output masks; masks aligned with
    their boxes. Returns the IoUs of the colours that have a kept object."""
    image, boxes, labels, masks = np.asarray(out["image"]), out["boxes"], out["labels"], out["masks"]
    h, w = image.shape[:2]
    assert masks.dtype == np.uint8 and masks.shape == (len(boxes), h, w)
    assert set(np.unique(masks).tolist()) <= {0, 1}
    for box, m in zip(boxes, masks):  # each row inside its own box (a pixel of rounding)
        if m.any():
            mb = masks_to_boxes(m[None])[0]
            assert (mb[:2] >= box[:2] - 1.01).all() and (mb[2:] <= box[2:] + 1.01).all(), (mb, box)
    ious = []
    for k in range(3):
        rows = np.asarray(labels) % 10 == k
        if not rows.any():
            continue
        union = masks[rows].any(axis=0)
        if union.sum() < 30:  # a sliver left by a crop: its border is all there is
            continue
        ious.append(iou(union, colour_region(image, k, weight)))
    return ious


def run_eager(recipe: T.Compose, sample: Sample, seed: int) -> dict:
    return recipe(image=sample.image, boxes=sample.boxes, labels=sample.labels, masks=sample.fields["masks"],
                  seed=seed, image_id=sample.image_id, device=DEVICE)


GEOMETRIC = geometric_recipes(
    HW, flips="each", perspective=0.4, iou_crop_resize=(120, 160), crop_pad=(110, 150), center_crop=(100, 130),
    zoom_out_resize=((1.0, 2.0), (160, 208)), crop_then_zoom_out=((100, 130), (1.2, 1.8)), letterbox=192,
    shortest_size=([120, 160, 200], 300), mosaic=((192, 256), T.RandomAffine(degrees=10, scale=(0.8, 1.2))))


@pytest.mark.parametrize("name", list(GEOMETRIC))
def test_every_geometric_transform_moves_each_mask_onto_its_painted_shape(name):
    recipe = GEOMETRIC[name]
    ious = []
    for seed in range(3):
        ious += check_masks_on_pixels(run_eager(recipe, scene(seed), seed))
    assert len(ious) >= 4
    assert np.median(ious) >= 0.98, f"{name}: median IoU {np.median(ious):.4f} ({np.round(ious, 3).tolist()})"
    assert min(ious) >= 0.9, f"{name}: worst IoU {min(ious):.4f}"


def test_mixup_moves_the_partners_masks_with_its_own_map():
    """``MixUp`` (the eager call's image is its own partner, smaller at an offset): each colour's
    pixels (at a quarter of its weight: both layers are blended at about one half) are the union
    of the masks of that colour's objects, the sample's and the partner's."""
    recipe = T.Compose([T.Resize(HW), T.MixUp(p=1.0, scale=(0.5, 0.7), fill=0), T.RandomAffine(degrees=15)])
    ious = []
    for seed in range(3):
        sample = scene(seed)
        out = run_eager(recipe, sample, seed)
        assert len(out["labels"]) > len(sample.labels)  # the partner's objects too
        ious += check_masks_on_pixels(out, weight=0.5)
    assert np.median(ious) >= 0.98, np.round(ious, 3).tolist()


def test_a_removed_box_drops_its_mask_row_and_rows_follow_their_boxes():
    sample = scene(4)
    recipe = T.Compose([T.CenterCrop((144, 50))], min_visibility=0.5)  # only the middle object stays
    out = run_eager(recipe, sample, 0)
    assert out["labels"].tolist() == [41]
    assert out["masks"].shape == (1, 144, 50)
    np.testing.assert_array_equal(out["masks"][0], sample.fields["masks"][1][:, 71:121])


def test_a_sample_without_boxes_gives_an_empty_mask_stack_of_the_output_size():
    image = np.zeros((40, 60, 3), np.uint8)
    out = T.Compose([T.Resize((30, 20))])(image=image, boxes=np.zeros((0, 4)), masks=np.zeros((0, 40, 60), np.uint8),
                                           device=DEVICE)
    assert out["masks"].shape == (0, 30, 20) and out["masks"].dtype == np.uint8


def test_boxes_from_masks_are_the_moved_masks_bounds():
    recipe = T.Compose([T.RandomRotation(degrees=(30, 40))], boxes_from_masks=True)
    assert T.Compose.from_dict(recipe.to_dict()) == recipe and recipe.to_dict()["boxes_from_masks"] is True
    out = run_eager(recipe, scene(5), 0)
    np.testing.assert_array_equal(out["boxes"], masks_to_boxes(out["masks"]))
    loose = run_eager(T.Compose([T.RandomRotation(degrees=(30, 40))]), scene(5), 0)
    area = lambda b: (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])  # noqa: E731
    assert (area(out["boxes"]) < area(loose["boxes"])).all()  # tighter than the rotated box's bounds


def test_loader_batches_carry_masks_aligned_with_the_boxes_of_every_tile():
    samples = [scene(s) for s in range(4)]
    source = SampleListSource(samples)
    recipe = T.Compose([T.Mosaic(size=(192, 256), fill=0), T.RandomHorizontalFlip()])
    planner = BatchPlanner(source, recipe, EpochSpec(n=4, batch_size=2, seed=3))
    planned = planner.plan(0, 0)
    counts, boxes, labels, fields = batch_columns(planned)
    assert fields["masks"].shape == (sum(counts), 384, 512)  # the mosaic canvas: twice size
    for b, m in zip(boxes, fields["masks"]):
        if m.any():
            mb = masks_to_boxes(m[None])[0]
            assert (mb[:2] >= b[:2] - 1.01).all() and (mb[2:] <= b[2:] + 1.01).all()


# -- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("masks, words", [
    (np.zeros((2, 144, 192), np.uint8), "2 rows, expected one per box (3)"),
    (np.zeros((3, 100, 192), np.uint8), "not the image's size (144, 192)"),
    (np.full((3, 144, 192), 255, np.uint8), "mask values [255] are not 0 or 1"),
    (np.zeros((3, 144), np.uint8), "not [N, H, W]"),
])
def test_bad_masks_are_named_errors(masks, words):
    s = scene(0)
    with pytest.raises(DatasetError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        SampleListSource([Sample(s.image, s.boxes, s.labels, image_id=1, fields={"masks": masks})])


def test_masks_of_an_encoded_image_of_another_size_skip_it_by_name(tmp_path):
    from PIL import Image

    s = scene(0)
    path = tmp_path / "a.png"
    Image.fromarray(s.image[:100]).save(path)
    source = SampleListSource([Sample(str(path), s.boxes[:1] * 0 + [0, 0, 10, 10], s.labels[:1], image_id=7,
                                      fields={"masks": s.fields["masks"][:1]})])
    planner = BatchPlanner(source, T.Compose([T.RandomHorizontalFlip()]), EpochSpec(n=1, batch_size=1), on_error="raise")
    with pytest.raises(ImageError, match=r"a\.png.*masks: masks of size \(h, w\) \(144, 192\) are not the image's size"):
        planner.plan(0, 0)


def test_check_masks_takes_bools_and_gives_uint8():
    arr, why = check_masks(np.ones((1, 2, 3), bool), 1, (2, 3))
    assert why == "" and arr.dtype == np.uint8 and arr.sum() == 6


def test_coco_masks_decode_polygons_and_rle_like_pycocotools():
    from pycocotools import mask as coco_mask

    poly = [[10.0, 10.0, 50.0, 12.0, 30.0, 40.0]]
    rle = coco_mask.encode(np.asfortranarray(shape_mask("ellipse", (60, 80), (40, 30), (20, 10))))
    compressed = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
    masks, why = CocoMasks([poly, compressed]).decode((60, 80))
    assert why == ""
    np.testing.assert_array_equal(masks[0], coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects(poly, 60, 80))))
    np.testing.assert_array_equal(masks[1], shape_mask("ellipse", (60, 80), (40, 30), (20, 10)))
    assert "RLE of size [60, 80]" in CocoMasks([compressed]).decode((61, 80))[1]
    assert "not a flat list" in CocoMasks([[[1, 2, 3]]]).decode((60, 80))[1]


def test_warp_mask_by_identity_and_by_a_flip():
    m = shape_mask("triangle", (30, 40), (20, 15), (10, 8))
    np.testing.assert_array_equal(warp_mask(m, np.eye(3), (30, 40)), m)
    flip = np.array([[-1, 0, 40], [0, 1, 0], [0, 0, 1]], np.float64)
    np.testing.assert_array_equal(warp_mask(m, flip, (30, 40)), m[:, ::-1])


# -- COCO, the loaders' targets ----------------------------------------------------------------------

def coco_scene(tmp_path, seeds=(0, 1, 2)) -> tuple[str, str, list[Sample]]:
    """The scenes as PNG files and a COCO file: the ellipses as compressed RLE, the triangle as a
    polygon of its exact vertices (its mask: what pycocotools rasterises, painted as is)."""
    import json

    from PIL import Image
    from pycocotools import mask as coco_mask

    images, annotations, samples = [], [], []
    for seed in seeds:
        s = scene(seed)
        h, w = HW
        third = w / 3
        cx, cy = third * 1.5, h * 0.5 + np.random.default_rng(seed).uniform(-4, 4)
        a, b = third * 0.4, h * 0.32
        poly = [cx, cy - b, cx + a, cy + b, cx - a, cy + b]
        masks = s.fields["masks"].copy()
        masks[1] = coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects([poly], h, w)))
        image = np.zeros((h, w, 3), np.uint8)
        for k, m in enumerate(masks):
            image[m == 1] = COLOURS[k]
        Image.fromarray(image).save(tmp_path / f"{seed}.png")
        images.append({"id": seed + 1, "file_name": f"{seed}.png", "height": h, "width": w})
        for k, m in enumerate(masks):
            x0, y0, x1, y1 = masks_to_boxes(m[None])[0].tolist()
            if k == 1:
                seg = [poly]
            else:
                rle = coco_mask.encode(np.asfortranarray(m))
                seg = {"size": [h, w], "counts": rle["counts"].decode("ascii")}
            annotations.append({"id": 10 * seed + k + 1, "image_id": seed + 1, "category_id": 10 * seed + k,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "iscrowd": 0, "segmentation": seg})
        samples.append(Sample(image, masks_to_boxes(masks), s.labels, image_id=seed + 1, fields={"masks": masks}))
    categories = [{"id": 10 * s + k, "name": f"c{10 * s + k}"} for s in seeds for k in range(3)]
    path = tmp_path / "coco.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return str(path), str(tmp_path), samples


def test_affine_sampling_is_the_projective_sampling_of_an_affine_map():
    """warp_mask's affine path (detaug.masks._sample_affine) gives the very pixels its projective
    path gives for the same map: random affine maps (rotation, scale, shear, shift, flips), with
    and without clip rectangles and half-planes, points near and past the mask's edges."""
    from detaug.masks import _is_affine, _sample_affine, _sample_projective

    rng = np.random.default_rng(0)
    shape = (37, 53)
    u, v = np.arange(-4, 70) + 0.5, np.arange(-3, 50) + 0.5
    for trial in range(60):
        angle, scale = rng.uniform(-np.pi, np.pi), rng.uniform(0.5, 2.0) * rng.choice([-1.0, 1.0])
        c, s_ = np.cos(angle) * scale, np.sin(angle) * scale
        m = np.array([[c, -s_ + rng.uniform(-0.3, 0.3), rng.uniform(-20, 40)],
                      [s_, c * rng.choice([-1.0, 1.0]), rng.uniform(-20, 40)], [0.0, 0.0, 1.0]])
        if trial % 10 == 0:
            m[:2, :2] = np.round(m[:2, :2])  # axis-aligned: points land on pixel edges exactly
            m[:2, 2] = np.round(m[:2, 2] * 2) / 2
            if abs(np.linalg.det(m)) < 0.5:
                m[:2, :2] = np.eye(2)
        inv = np.linalg.inv(m)
        if not _is_affine(m, inv):
            continue
        rect = None if trial % 3 == 0 else np.array([3.0, 2.5, 40.0, 30.0])
        planes = None if trial % 2 == 0 else np.array([[1.0, 1.0, 60.0], [-1.0, 0.5, 5.0], [0.0, 1.0, np.inf]])
        fast, general = (f(inv, m, u, v, shape, rect, planes) for f in (_sample_affine, _sample_projective))
        for a, b in zip(fast, general):
            np.testing.assert_array_equal(a, b)
    assert _is_affine(np.eye(3), np.eye(3)) and not _is_affine(np.array([[1, 0, 0], [0, 1, 0], [1e-3, 0, 1.0]]),
                                                               np.eye(3))


def test_coco_polygons_and_rle_become_masks_that_move_with_their_shapes(tmp_path):
    from detaug.sources import CocoSource

    path, root, samples = coco_scene(tmp_path)
    assert "masks" not in CocoSource(path, root).field_specs  # detection users get no masks unless they ask
    source = CocoSource(path, root, masks=True)
    assert source.field_specs["masks"].dtype == np.uint8
    recipe = T.Compose([T.RandomAffine(degrees=25, scale=(0.8, 1.2)), T.Resize((120, 160))])
    planner = BatchPlanner(source, recipe, EpochSpec(n=3, batch_size=3, seed=2))
    planned = planner.plan(0, 0)
    eager = [recipe(image=s.image, boxes=s.boxes, labels=s.labels, masks=s.fields["masks"], seed=2, image_id=s.image_id,
                    device=DEVICE) for s in samples]
    for k, fields in enumerate(planned.fields):  # the same masks as the eager call on the decoded pixels
        i = int(planned.image_ids[k]) - 1
        np.testing.assert_array_equal(fields["masks"], eager[i]["masks"])
        assert np.median(check_masks_on_pixels(eager[i])) >= 0.98


def test_coco_masks_are_named_errors_also_for_the_cache(tmp_path):
    import json

    from detaug.sources import CocoSource

    path, root, _ = coco_scene(tmp_path, seeds=(0,))
    doc = json.loads(open(path).read())
    doc["annotations"][1]["segmentation"] = [[1, 2, 3]]
    del doc["annotations"][2]["segmentation"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match=r"(?s)annotation_id 2.*not a flat list.*annotation_id 3.*no segmentation"):
        CocoSource(bad, root, masks=True)
    CocoSource(bad, root)  # without masks the segmentations are not read
    with pytest.raises(DatasetError, match=r"(?s)annotation_id 2.*not a flat list.*annotation_id 3.*no segmentation"):
        CocoSource(bad, root, masks=True, cache=tmp_path / "cache")  # the cache reads them as load_coco does
    CocoSource(bad, root, cache=tmp_path / "cache")


def test_torch_targets_carry_masks_on_the_images_device():
    import torch

    from detaug.torch import DetectionLoader

    source = SampleListSource([scene(s) for s in range(4)])
    recipe = T.Compose([T.RandomHorizontalFlip(), T.RandomAffine(degrees=20), T.Resize((96, 128))])
    loader = DetectionLoader(source, recipe, 2, device=DEVICE, seed=1, num_threads=1)
    ious = []
    for images, targets in loader:
        for image, t in zip(images, targets):
            assert t["masks"].dtype == torch.uint8 and t["masks"].device == image.device
            assert t["masks"].shape == (len(t["boxes"]), 96, 128)
            ious += check_masks_on_pixels({"image": image.permute(1, 2, 0).cpu().numpy(), "boxes": t["boxes"].cpu().numpy(),
                                           "labels": t["labels"].cpu().numpy(), "masks": t["masks"].cpu().numpy()})
    loader.close()
    assert len(ious) >= 8 and np.median(ious) >= 0.98


def test_masks_of_a_batch_of_several_sizes_are_padded_and_each_target_gets_its_images():
    """Without a fixed output size the batch's masks are joined padded at the bottom and right
    (as torchvision pads a batch of images); the PyTorch loader's per-image targets are cut back
    to their image's size."""
    import torch

    from detaug.torch import DetectionLoader

    samples = [scene(0), scene(1, hw=(120, 150))]
    source = SampleListSource(samples)
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0)])
    planner = BatchPlanner(source, recipe, EpochSpec(n=2, batch_size=2))
    planned = planner.plan(0, 0)
    _, _, _, fields = batch_columns(planned)
    assert fields["masks"].shape == (6, *HW)
    np.testing.assert_array_equal(fields["masks"][:3], planned.fields[0]["masks"])
    np.testing.assert_array_equal(fields["masks"][3:, :120, :150], planned.fields[1]["masks"])
    assert not fields["masks"][3:, 120:].any() and not fields["masks"][3:, :, 150:].any()
    loader = DetectionLoader(source, recipe, 2, device=DEVICE, num_threads=1)
    images, targets = next(iter(loader))
    loader.close()
    for image, t, s in zip(images, targets, samples):
        assert t["masks"].shape == (3, *image.shape[-2:]) and t["masks"].dtype == torch.uint8
        np.testing.assert_array_equal(t["masks"].cpu().numpy(), s.fields["masks"][:, :, ::-1])


def test_keras_targets_pad_masks_with_minus_one():
    from detaug.keras.targets import keras_field_spec, pad_targets
    from detaug.labels import LabelMap
    from detaug.field_selection import field_outputs

    source = SampleListSource([scene(s) for s in range(4)])
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))])
    planner = BatchPlanner(source, recipe, EpochSpec(n=4, batch_size=2, seed=1), fields=["masks"])
    planned = planner.plan(0, 0)
    specs = field_outputs(source, planner.fields)
    assert keras_field_spec("masks", specs["masks"], recipe.output_size()) == (np.dtype(np.int8), (48, 64))
    labels = np.concatenate([s.labels for s in source.samples])
    targets = pad_targets(batch_columns(planned), 5, "xyxy", (48, 64), LabelMap({}, labels), specs)
    assert targets["masks"].shape == (2, 5, 48, 64) and targets["masks"].dtype == np.int8
    for k in range(2):
        n = len(planned.labels[k])
        np.testing.assert_array_equal(targets["masks"][k, :n], planned.fields[k]["masks"])
        assert (targets["masks"][k, n:] == -1).all()


def _same_loader_batches(a, b, recipe) -> None:
    from detaug.torch import DetectionLoader

    loaders = [DetectionLoader(s, recipe, 2, device=DEVICE, num_threads=1, fields=["masks"], seed=4) for s in (a, b)]
    try:
        for (images_a, targets_a), (images_b, targets_b) in zip(*loaders):
            for x, y in zip(images_a, images_b):
                np.testing.assert_array_equal(x.cpu().numpy(), y.cpu().numpy())
            for ta, tb in zip(targets_a, targets_b):
                for key in ("boxes", "labels", "masks"):
                    np.testing.assert_array_equal(ta[key].cpu().numpy(), tb[key].cpu().numpy())
                assert ta["masks"].shape[0] == len(ta["boxes"])
    finally:
        for loader in loaders:
            loader.close()


def test_masks_go_through_shards_and_their_rebuilt_manifest(tmp_path):
    """Dense masks of a sample list are written as compressed RLE (the same pixels), COCO
    segmentations as they are; a shard source gives the source's masks and loader batches."""
    import shutil

    from PIL import Image

    from detaug.shards import ShardSource, write_shards
    from detaug.sources import CocoSource

    samples = []
    for seed in range(3):
        s = scene(seed)
        Image.fromarray(s.image).save(tmp_path / f"{seed}.png")
        samples.append(Sample(str(tmp_path / f"{seed}.png"), s.boxes, s.labels, image_id=seed + 1, size=HW,
                              fields=s.fields))
    listed = SampleListSource(samples, categories={int(k): f"c{k}" for s in samples for k in s.labels})
    write_shards(listed, tmp_path / "shards", progress=False)
    shards = ShardSource(tmp_path / "shards")
    assert shards.field_specs["masks"].dtype == np.uint8
    for sample, written in zip(samples, shards.samples):
        assert isinstance(written.fields["masks"], CocoMasks)
        np.testing.assert_array_equal(written.fields["masks"].decode(HW)[0], sample.fields["masks"])
    recipe = T.Compose([T.RandomAffine(degrees=20, scale=(0.8, 1.1)), T.RandomHorizontalFlip(), T.Resize((72, 96))])
    _same_loader_batches(listed, shards, recipe)
    shutil.rmtree(tmp_path / "shards" / "manifest")  # rebuilt from the samples' JSONs
    rebuilt = ShardSource(tmp_path / "shards")
    assert [s.fields["masks"] for s in rebuilt.samples] == [s.fields["masks"] for s in shards.samples]

    coco_dir = tmp_path / "coco"
    coco_dir.mkdir()
    path, root, _ = coco_scene(coco_dir)
    coco = CocoSource(path, root, masks=True)
    write_shards(coco, tmp_path / "coco-shards", progress=False)
    from_coco = ShardSource(tmp_path / "coco-shards")
    assert [s.fields["masks"] for s in from_coco.samples] == [s.fields["masks"] for s in coco.samples]
    _same_loader_batches(coco, from_coco, recipe)


def test_a_sample_whose_masks_cannot_be_written_is_named_and_skipped(tmp_path):
    from detaug.shards import ShardSource, write_shards
    from detaug.sources import CocoSource

    path, root, _ = coco_scene(tmp_path)
    coco = CocoSource(path, root, masks=True)
    coco.samples[1].fields["masks"] = CocoMasks([[[1, 2, 3]]] * len(coco.samples[1].boxes))  # spoilt after the checks
    summary = write_shards(coco, tmp_path / "shards", progress=False)
    assert summary.samples == 2 and len(summary.skipped) == 1
    skipped = summary.skipped[0]
    assert skipped["image_id"] == 2 and skipped["file"].endswith("1.png") and "box 0: polygon" in skipped["reason"]
    with pytest.warns(Warning, match="1 image"):
        assert [s.image_id for s in ShardSource(tmp_path / "shards").samples] == [1, 3]


def test_bad_masks_in_shards_are_named(tmp_path):
    import json
    import shutil

    from PIL import Image

    from detaug.shards import ShardSource, write_shards

    s = scene(0)
    Image.fromarray(s.image).save(tmp_path / "a.png")
    write_shards(SampleListSource([Sample(str(tmp_path / "a.png"), s.boxes, s.labels, image_id=1, fields=s.fields)],
                                  categories={int(k): f"c{k}" for k in s.labels}), tmp_path / "shards", progress=False)
    manifest = tmp_path / "shards" / "manifest"
    kind = np.load(manifest / "seg_kind.npy")
    np.save(manifest / "seg_kind.npy", np.full_like(kind, 7))  # an edited manifest: its checks name it
    with pytest.raises(DatasetError, match=r"manifest: its masks do not pass the checks \(a seg_kind other"):
        ShardSource(tmp_path / "shards")
    shutil.rmtree(manifest)
    dataset = json.loads((tmp_path / "shards" / "dataset.json").read_text())
    assert dataset["masks"] is True and "masks" not in [f[0] for f in dataset["fields"]]
    import tarfile

    with tarfile.open(tmp_path / "shards" / "shard-000000.tar") as tar:
        record = json.loads(tar.extractfile("000000000.json").read())
    assert len(record["masks"]) == len(s.boxes) and isinstance(record["masks"][0]["counts"], str)


def test_batches_planned_together_move_masks_as_alone():
    """``plan_many`` (one ``plan_batch`` call for several batches, as the planning workers do)
    gives every batch's masks exactly as ``plan`` does."""
    source = SampleListSource([scene(s) for s in range(6)])
    recipe = T.Compose([T.Mosaic(size=(64, 96), fill=0), T.RandomHorizontalFlip(), T.RandomAffine(degrees=20)])
    together = plan_together_and_alone(source, recipe, "masks", steps=3)
    assert sum(int(f["masks"].any(axis=(1, 2)).sum()) for g in together for f in g.fields) > 6


@pytest.mark.parametrize("orientation", [6, 2, 5])
def test_masks_of_an_exif_rotated_image_follow_its_pixels(tmp_path, orientation):
    """Masks given on the stored pixels (no declared size: the stored frame) are moved to the
    displayed frame the decoder delivers, as their boxes."""
    from detaug.torch import DetectionLoader

    sample = scene(8)
    path = exif_rotated_png(tmp_path / "rotated.png", sample.image, orientation)
    displayed = HW[::-1] if orientation in (5, 6, 7, 8) else HW
    stored = Sample(str(path), sample.boxes, sample.labels, image_id=3, fields=sample.fields)
    loader = DetectionLoader(SampleListSource([stored]), T.Compose([T.Resize(displayed)]), 1, device=DEVICE, num_threads=1)
    images, targets = next(iter(loader))
    loader.close()
    t = targets[0]
    assert t["masks"].shape == (3, *displayed)
    ious = check_masks_on_pixels({"image": images[0].permute(1, 2, 0).cpu().numpy(), "boxes": t["boxes"].cpu().numpy(),
                                  "labels": t["labels"].cpu().numpy(), "masks": t["masks"].cpu().numpy()})
    assert len(ious) == 3 and min(ious) == 1.0  # whole-pixel moves: exact


@pytest.mark.parametrize("form", ["padded", "concat"])
def test_torch_batched_target_forms_carry_masks(form):
    import torch

    from detaug.torch import DetectionLoader

    source = SampleListSource([scene(s) for s in range(4)])
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))])
    loader = DetectionLoader(source, recipe, 2, device=DEVICE, seed=1, num_threads=1, targets=form, shuffle=False)
    images, targets = next(iter(loader))
    loader.close()
    planned = loader.planner.plan(0, 0)  # the loader's first batch, planned again
    counts = targets["num_boxes"].tolist()
    if form == "padded":  # int8 [B, M, H, W], rows past an image's boxes -1
        assert targets["masks"].dtype == torch.int8 and targets["masks"].shape == (2, max(counts), 48, 64)
        for k, n in enumerate(counts):
            assert set(targets["masks"][k, :n].unique().tolist()) <= {0, 1}
            assert (targets["masks"][k, n:] == -1).all()
    else:  # uint8 [N, H, W] in image order
        assert targets["masks"].dtype == torch.uint8 and targets["masks"].shape == (sum(counts), 48, 64)
    expected = np.concatenate([f["masks"] for f in planned.fields])
    got = targets["masks"].cpu().numpy()
    got = np.concatenate([got[k, :n] for k, n in enumerate(counts)]) if form == "padded" else got
    np.testing.assert_array_equal(got, expected)


def test_keras_sequence_pads_masks_with_minus_one():
    pytest.importorskip("keras", reason="Keras 3 is not installed")
    source = SampleListSource([scene(s) for s in range(4)])
    padded, spec = keras_padded_field(source, T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))]), "masks", DEVICE)
    assert spec == (np.dtype(np.int8), (48, 64))
    assert padded.shape == (2, 5, 48, 64) and padded.dtype == np.int8


def test_planning_workers_give_the_masks_of_the_main_process(tmp_path):
    import torch

    from detaug.sources import CocoSource
    from detaug.torch import DetectionLoader

    path, root, _ = coco_scene(tmp_path)
    source = CocoSource(path, root, masks=True)
    recipe = T.Compose([T.RandomRotation(degrees=20), T.Resize((72, 96))])
    got = []
    for workers in (0, 1):
        loader = DetectionLoader(source, recipe, 3, device=DEVICE, seed=5, num_threads=1, num_workers=workers)
        _, targets = next(iter(loader))
        loader.close()
        got.append(torch.cat([t["masks"].cpu() for t in targets]))
    assert got[0].shape[0] >= 6 and torch.equal(got[0], got[1])


def test_packed_masks_give_the_masks_back_exactly():
    """pack_masks / PackedMasks.unpack: rows cut to their pixels' rectangle, eight pixels a byte,
    back bit for bit (empty, full, single-pixel and odd-sized rows); other arrays left as they are."""
    from detaug.masks import PackedMasks, pack_masks

    rng = np.random.default_rng(0)
    masks = (rng.random((6, 37, 53)) < 0.3).astype(np.uint8)
    masks[1] = 0
    masks[2] = 1
    masks[3] = 0
    masks[3, 36, 52] = 1
    masks[4, :, :20] = 0
    packed = pack_masks(masks)
    assert isinstance(packed, PackedMasks) and packed.bits.nbytes < masks.nbytes / 7
    assert packed.rects[1].tolist() == [0, 0, 0, 0] and packed.rects[3].tolist() == [36, 37, 52, 53]
    np.testing.assert_array_equal(packed.unpack(), masks)
    empty = np.zeros((0, 8, 8), np.uint8)
    assert pack_masks(empty).unpack().shape == (0, 8, 8)
    for other in (masks * 2, masks.astype(np.int8), masks[0]):
        assert pack_masks(other) is other


@pytest.mark.parametrize("hws", [[HW, HW], [HW, (120, 150)]])
def test_a_plan_travels_with_its_masks_packed(hws):
    """detaug.plan_ahead.pack: a plan's masks leave the worker as PackedMasks (joined over the
    batch, or per sample where sizes differ), pickled at a fraction of their bytes, and unpack
    to the planner's masks."""
    import pickle

    from detaug.masks import PackedMasks
    from detaug.plan_ahead import pack

    source = SampleListSource([scene(k, hw=hw) for k, hw in enumerate(hws)])
    planner = BatchPlanner(source, T.Compose([T.RandomAffine(degrees=10)]), EpochSpec(n=2, batch_size=2))
    expected = [f["masks"].copy() for f in planner.plan(0, 0).fields]
    packed = pack(planner.plan(0, 0))
    travelling = [packed.joined["masks"]] if packed.joined is not None else [f["masks"] for f in packed.planned.fields]
    assert all(isinstance(m, PackedMasks) for m in travelling)
    assert len(pickle.dumps(travelling)) < sum(m.nbytes for m in expected) / 4
    back = pickle.loads(pickle.dumps(packed)).unpack()
    assert len(back.fields) == len(expected)
    for f, m in zip(back.fields, expected):
        np.testing.assert_array_equal(f["masks"], m)


@pytest.mark.parametrize("sizes", ["one", "several"])
def test_masks_from_planning_workers_equal_the_in_process_ones(tmp_path, sizes):
    """Masks travel from the planning workers packed (detaug.plan_ahead.pack): joined when every
    sample has the same output size, per sample when sizes differ; the batches equal the
    in-process planner's."""
    import torch

    from detaug.sources import CocoSource
    from detaug.torch import DetectionLoader

    steps = [T.RandomAffine(degrees=15, scale=(0.7, 1.2)), T.RandomHorizontalFlip()]
    if sizes == "one":
        path, root, _ = coco_scene(tmp_path)
        source, recipe = CocoSource(path, root, masks=True), T.Compose(steps + [T.Resize((72, 96))])
    else:
        source = SampleListSource([scene(0), scene(1, hw=(120, 150)), scene(2), scene(3, hw=(100, 140))])
        recipe = T.Compose(steps)
    got = []
    for workers in (0, 2):
        loader = DetectionLoader(source, recipe, 2, device=DEVICE, seed=3, num_threads=1, num_workers=workers)
        got.append([torch.cat([t["masks"].cpu().reshape(-1) for t in targets]) for _, targets in loader])
        loader.close()
    assert sum(int(m.sum()) for m in got[0]) > 0
    assert len(got[0]) == len(got[1]) and all(torch.equal(a, b) for a, b in zip(*got))


def test_boxes_from_masks_without_masks_is_a_named_recipe_error():
    from detaug.errors import RecipeError

    s = scene(0)
    recipe = T.Compose([T.RandomHorizontalFlip()], boxes_from_masks=True)
    with pytest.raises(RecipeError, match="boxes_from_masks=True, but no masks are carried"):
        recipe(image=s.image, boxes=s.boxes, labels=s.labels, device=DEVICE)
    with pytest.raises(RecipeError, match="boxes_from_masks must be true or false, got 'yes'"):
        T.Compose.from_dict({"transforms": [], "boxes_from_masks": "yes"})
    with pytest.raises(RecipeError, match="fields= leaves them out"):
        BatchPlanner(SampleListSource([s]), recipe, EpochSpec(n=1, batch_size=1), fields=["area"])
