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


@pytest.mark.parametrize("kind", ["samples", "coco"])
def test_cpu_and_gpu_give_same_boxes(kind, tmp_path):
    if kind == "samples":
        make = lambda: SampleListSource(scene_samples(24, seed=7)[0])  # noqa: E731
    else:
        write_coco_dataset(tmp_path, num_images=24, size=(200, 150), progress=False)
        make = lambda: CocoSource(tmp_path / "annotations.json", tmp_path / "images", shuffle=True, seed=4)  # noqa: E731
    cpu_images, cpu = run(DetectionLoader(make(), RECIPE, 8, device="cpu", seed=11))
    gpu_images, gpu = run(DetectionLoader(make(), RECIPE, 8, device="gpu", seed=11))
    assert [t["image_id"] for t in cpu] == [t["image_id"] for t in gpu]
    for c, g in zip(cpu, gpu):
        assert torch.equal(c["labels"], g["labels"])
        torch.testing.assert_close(c["boxes"], g["boxes"], atol=1e-4, rtol=0)
    # Pixels: same geometry, decoders and interpolation may differ by a few grey levels.
    diff = (cpu_images.float() - gpu_images.float()).abs()
    assert diff.mean() < 2.0, f"mean abs pixel difference {diff.mean():.2f}"
