"""``DetectionLoader(targets="tv_tensors")``: batches torchvision.transforms.v2 takes as they are."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug.sources import SampleListSource
from detaug.torch import DetectionLoader


def source() -> SampleListSource:
    rng = np.random.default_rng(0)
    return SampleListSource([(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8), [[5, 5, 30, 20]], [1])
                             for _ in range(4)])


def _torchvision_works() -> str | None:
    try:
        import torchvision.transforms.v2  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"torchvision does not import next to this torch ({type(err).__name__}); runs on the GPU machine"
    return None


def test_without_torchvision_the_error_says_how_to_install_it():
    if _torchvision_works() is None:
        pytest.skip("torchvision imports here")
    with pytest.raises(ImportError, match=r"targets='tv_tensors' needs torchvision built for this torch .*pip install"):
        DetectionLoader(source(), T.Compose([T.Resize((32, 32))]), 2, device="cpu", targets="tv_tensors")


def test_tv_tensor_targets_feed_torchvision_v2():
    reason = _torchvision_works()
    if reason:
        pytest.skip(reason)
    import torchvision.transforms.v2 as V2
    from torchvision import tv_tensors

    loader = DetectionLoader(source(), T.Compose([T.Resize((32, 48))]), 2, device="cpu", targets="tv_tensors")
    images, targets = next(iter(loader))
    assert isinstance(images, tv_tensors.Image)
    boxes = targets[0]["boxes"]
    assert isinstance(boxes, tv_tensors.BoundingBoxes) and tuple(boxes.canvas_size) == (32, 48)
    flipped, out = V2.RandomHorizontalFlip(p=1.0)(images[0], {"boxes": boxes})
    np.testing.assert_allclose(out["boxes"].cpu().numpy(), [[24, 4, 44, 16]], atol=1e-4)  # [5, 5, 30, 20] x 0.8, flipped in 48
    loader.close()


def test_targets_is_checked():
    with pytest.raises(ValueError, match="targets must be one of 'dict', 'tv_tensors', 'padded', 'concat'"):
        DetectionLoader(source(), T.Compose([]), 2, device="cpu", targets="tensors")
