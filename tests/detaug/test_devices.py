"""CPU and GPU pipelines give the same boxes and labels for one seed (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

import detaug.transforms as T
from detaug.sources import CocoSource, SampleListSource
from detaug.synthetic import write_coco_dataset
from detaug.torch import DetectionLoader
from tests.detaug.consistency import scene_samples

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CPU/GPU comparison)")

FILL = 114
RECIPE = T.Compose(
    [
        T.RandomZoomOut(fill=FILL, side_range=(1.0, 1.5)),
        T.RandomIoUCrop(),
        T.RandomHorizontalFlip(),
        T.RandomAffine(degrees=20, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=8, fill=FILL),
        T.Resize((160, 192)),
    ]
)


def run(loader):
    images, targets = [], []
    for batch, batch_targets in loader:
        images.append(batch.cpu())
        targets += batch_targets
    return torch.cat(images), targets


def assert_same_on_cpu_and_gpu(make, recipe: T.Compose, seed: int, max_mean_diff: float, what: str, **kw) -> None:
    """Asserts that loaders of one recipe and seed (batches of 8, ``kw`` more arguments; ``make``
    builds the source) give the same images in the same order with the same labels and boxes
    (within 1e-4 px) on the CPU as on the GPU, the GPU's targets on the images' device, and pixels
    ``max_mean_diff`` grey levels apart at most on average (the same geometry; decoders and
    interpolation may differ by a few levels). ``what`` names the case in the message."""
    cpu_images, cpu = run(DetectionLoader(make(), recipe, 8, device="cpu", seed=seed, **kw))
    gpu_images, gpu = run(DetectionLoader(make(), recipe, 8, device="gpu", seed=seed, **kw))
    assert [t["image_id"] for t in cpu] == [t["image_id"] for t in gpu]
    for c, g in zip(cpu, gpu):
        assert g["boxes"].is_cuda and g["labels"].is_cuda  # the targets come on the images' device
        assert torch.equal(c["labels"], g["labels"].cpu())
        torch.testing.assert_close(c["boxes"], g["boxes"].cpu(), atol=1e-4, rtol=0)
    diff = (cpu_images.float() - gpu_images.float()).abs()
    assert diff.mean() < max_mean_diff, f"{what}: mean abs pixel difference {diff.mean():.2f}"


@pytest.mark.parametrize("kind", ["samples", "coco"])
def test_cpu_and_gpu_give_same_boxes(kind, tmp_path):
    if kind == "samples":
        make = lambda: SampleListSource(scene_samples(24, seed=7)[0])  # noqa: E731
    else:
        write_coco_dataset(tmp_path, num_images=24, size=(200, 150), progress=False)
        make = lambda: CocoSource(tmp_path / "annotations.json", tmp_path / "images", shuffle=True, seed=4)  # noqa: E731
    assert_same_on_cpu_and_gpu(make, RECIPE, 11, 2.0, kind)


@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0])
def test_every_hardware_decoder_share_gives_the_same_boxes(hw_decoder_load, tmp_path):
    """The JPEGs all on the CUDA decoder (0.0) or all on the GPU's hardware decoder (1.0, where it
    has one): the same boxes as on the CPU."""
    write_coco_dataset(tmp_path, num_images=16, size=(200, 150), progress=False)
    make = lambda: CocoSource(tmp_path / "annotations.json", tmp_path / "images", shuffle=True, seed=2)  # noqa: E731
    loader = DetectionLoader(make(), RECIPE, 8, device="gpu", hw_decoder_load=hw_decoder_load)
    assert loader.hw_decoder_load == hw_decoder_load
    loader.close()
    assert_same_on_cpu_and_gpu(make, RECIPE, 5, 2.0, f"hw_decoder_load={hw_decoder_load}", hw_decoder_load=hw_decoder_load)


def _recipes() -> dict[str, T.Compose]:
    size = (160, 192)
    return {
        "yolo": T.yolo_recipe(size=192, mixup=0.5, perspective=0.3),
        "perspective": T.Compose([T.RandomPerspective(distortion_scale=0.4, p=1.0, fill=FILL), T.Resize(size)]),
        "crops": T.Compose([T.ScaleJitter(target_size=(192, 192)), T.FixedSizeCrop(size=(192, 192), fill=FILL),
                            T.RandomCrop((150, 150), pad_if_needed=True), T.RandomRotation(15, expand=True), T.Resize(size)]),
        "photometric": T.Compose([
            T.RandomIoUCrop(drop="invisible"), T.Resize(size), T.RandomPhotometricDistort(p=1.0), T.RandomGrayscale(p=0.3),
            T.GaussianBlur(5, sigma=(0.1, 1.5)), T.GaussNoise(), T.RandomErasing(p=0.7),
            T.OneOf([T.ColorJitter(brightness=0.3), T.ColorJitter(contrast=0.3)]),
        ], min_visibility=0.3),
        "composition": T.Compose([T.OneOf([T.RandomHorizontalFlip(p=1.0), T.RandomVerticalFlip(p=1.0)]),
                                  T.RandomApply([T.RandomAffine(degrees=10, fill=FILL)], p=0.5),
                                  T.SomeOf([T.Pad(8, fill=FILL), T.RandomZoomOut(fill=FILL, side_range=(1, 1.3))], n=1),
                                  T.Resize(size)]),
    }


@pytest.mark.parametrize("name", ["yolo", "perspective", "crops", "photometric", "composition"])
def test_new_transforms_give_same_boxes_on_cpu_and_gpu(name):
    recipe = _recipes()[name]
    make = lambda: SampleListSource(scene_samples(24, seed=5)[0])  # noqa: E731
    assert_same_on_cpu_and_gpu(make, recipe, 3, 3.0, name, shuffle=True)
