"""Eager calls (issue 18): one sample through a recipe gives what the loader gives it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import detaug.transforms as T
from detaug import DataWarning
from detaug.eager import apply
from detaug.formats.box_formats import from_xyxy, to_xyxy
from detaug.sources import Sample, SampleListSource
from detaug.torch import DetectionLoader
from tests.detaug.conftest import cyclic_garbage


def scenes(n: int = 6, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        h, w = int(rng.integers(60, 120)), int(rng.integers(60, 120))
        image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
        boxes = np.array([[x0, y0, x0 + w / 3, y0 + h / 3], [1, 1, w - 1, h - 1]], np.float32)
        samples.append(Sample(image, boxes, np.array([1, 2]), image_id=10 + i))
    return samples


def test_eager_call_equals_the_loaders_sample():
    samples = scenes()
    recipe = T.default_detection_recipe(size=64)
    loader = DetectionLoader(SampleListSource(samples), recipe, batch_size=4, device="cpu", seed=3, shuffle=True,
                             num_threads=1)
    loader.set_epoch(2)
    by_id = {s.image_id: s for s in samples}
    seen = 0
    for images, targets in loader:
        for image, target in zip(images, targets):
            s = by_id[int(target["image_id"])]
            out = apply(recipe, s.image, s.boxes, s.labels, seed=3, epoch=2, image_id=s.image_id)
            np.testing.assert_array_equal(out["image"].transpose(2, 0, 1), image.numpy())
            np.testing.assert_array_equal(out["boxes"], target["boxes"].cpu().numpy())
            np.testing.assert_array_equal(out["labels"], target["labels"].cpu().numpy())
            seen += 1
    loader.close()
    assert seen == len(samples)


def test_fields_follow_their_boxes_and_area_is_recomputed():
    image = np.zeros((100, 200, 3), np.uint8)
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0), T.Resize((50, 100))])
    boxes = [[10, 20, 50, 60], [190, 0, 200, 5], [300, 300, 310, 310]]  # the last lies outside: dropped
    with pytest.warns(DataWarning, match="1 box outside the image dropped"):
        out = apply(recipe, image, boxes, [3, 4, 5], iscrowd=[0, 1, 0], track_id=np.array([7, 8, 9]), area=[1, 2, 3])
    np.testing.assert_allclose(out["boxes"], [[75, 10, 95, 30], [0, 0, 5, 2.5]])
    assert out["labels"].tolist() == [3, 4] and out["iscrowd"].tolist() == [0, 1] and out["track_id"].tolist() == [7, 8]
    np.testing.assert_allclose(out["area"], [400, 12.5])
    with pytest.raises(ValueError, match="field 'iscrowd' has 1 rows, expected one per box"):  # noqa: PT012
        apply(recipe, image, boxes, [3, 4, 5], iscrowd=[0])


@pytest.mark.parametrize("box_format", ["xyxy", "xywh", "cxcywh", "yolo"])
def test_boxes_come_back_in_the_format_given(box_format):
    image = np.zeros((100, 200, 3), np.uint8)
    xyxy = np.array([[10, 20, 50, 60]], np.float64)
    given = from_xyxy(xyxy, box_format, (100, 200))
    np.testing.assert_allclose(to_xyxy(given, box_format, (100, 200)), xyxy, atol=1e-4)
    out = apply(T.Compose([T.Resize((50, 100))]), image, given, [1], box_format=box_format)
    np.testing.assert_allclose(to_xyxy(out["boxes"], box_format, (50, 100)), xyxy / 2, atol=1e-4)


def test_input_types_give_their_own_type_back():
    from PIL import Image

    array = np.random.default_rng(1).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0)])
    out_np = apply(recipe, array)["image"]
    np.testing.assert_array_equal(out_np, array[:, ::-1])
    out_pil = apply(recipe, Image.fromarray(array))["image"]
    assert isinstance(out_pil, Image.Image) and np.array_equal(np.asarray(out_pil), out_np)
    out_t = apply(recipe, torch.from_numpy(array).permute(2, 0, 1))["image"]
    assert isinstance(out_t, torch.Tensor) and out_t.shape == (3, 40, 60)
    assert np.array_equal(out_t.permute(1, 2, 0).numpy(), out_np)


def test_boxes_labels_and_fields_come_back_in_the_type_given():
    image = np.zeros((100, 200, 3), np.uint8)
    recipe = T.Compose([T.RandomHorizontalFlip(p=1.0), T.Resize((50, 100))])
    out = apply(recipe, image, torch.tensor([[10.0, 20, 50, 60]]), torch.tensor([3]), iscrowd=torch.tensor([1]),
                track_id=[7])
    assert isinstance(out["boxes"], torch.Tensor) and out["boxes"].dtype == torch.float32
    assert out["boxes"].tolist() == [[75.0, 10.0, 95.0, 30.0]]
    assert isinstance(out["labels"], torch.Tensor) and out["labels"].dtype == torch.int64
    assert out["labels"].tolist() == [3]
    assert isinstance(out["iscrowd"], torch.Tensor) and out["iscrowd"].tolist() == [1]
    assert isinstance(out["track_id"], np.ndarray)  # a list: NumPy
    plain = apply(recipe, image, np.array([[10.0, 20, 50, 60]]), [3])
    assert isinstance(plain["boxes"], np.ndarray) and isinstance(plain["labels"], np.ndarray)
    unlabelled = apply(recipe, image, torch.tensor([[10.0, 20, 50, 60]]))  # labels follow the boxes
    assert isinstance(unlabelled["labels"], torch.Tensor) and unlabelled["labels"].tolist() == [0]
    one = apply(recipe, image, [10, 20, 50, 60], [3])  # one box as [4]
    assert one["boxes"].tolist() == [[75.0, 10.0, 95.0, 30.0]]


@pytest.mark.parametrize("boxes", [np.zeros((1, 3)), [[1, 2, 3]], np.zeros((2, 4, 1)), [1, 2, 3, 4, 5]])
def test_malformed_boxes_say_the_shape_expected(boxes):
    with pytest.raises(ValueError, match=r"boxes must be \[N, 4\].*got shape"):
        apply(T.Compose([T.RandomHorizontalFlip()]), np.zeros((20, 20, 3), np.uint8), boxes, [1])


def test_boxes_on_the_border_come_back_exactly_there():
    """The exact border rule computes a rotated box's edge on the canvas border in float64; it
    comes back as 0, not 1e-15 (issue 38), as the loaders give it."""
    image = np.zeros((100, 200, 3), np.uint8)
    at_zero = 0
    for recipe in (T.Compose([T.RandomRotation(30)]), T.Compose([T.RandomAffine(degrees=10, scale=(0.8, 1.2))])):
        for seed in range(12):
            for box in ([0, 0, 200, 100], [0, 0, 50, 60], [150, 40, 200, 100]):
                b = apply(recipe, image, [box], [1], seed=seed, image_id=seed + 1)["boxes"]
                assert not ((b != 0) & (np.abs(b) < 1e-4)).any(), (recipe, seed, box, b)
                at_zero += int((b == 0).sum())
    assert at_zero > 0


def test_eager_calls_leave_no_garbage_for_the_cycle_collector():
    """The cached pipeline is run and read as the loaders run theirs (no class defined per call by
    DALI's public run calls)."""
    sample = scenes(1)[0]
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((48, 64))])
    call = lambda seed: recipe(image=sample.image, boxes=sample.boxes, labels=sample.labels, seed=seed)  # noqa: E731
    call(0)  # the pipeline's first (public) run
    seeds = iter(range(1, 5))
    garbage = cyclic_garbage(lambda: call(next(seeds)), 4)
    assert not [o for o in garbage if isinstance(o, type)], "a class made per call"
