"""Output digests of fixed recipes: the batches stay the same, bit for bit, for one seed.

Each test runs one fixed recipe through ``DetectionLoader(..., device="cpu", ready_batches=0)``
(real DALI CPU pipelines) over one epoch of generated scenes (:func:`detaug.synthetic.make_scene`,
PNG-encoded so the decoded pixels do not depend on a JPEG codec) and compares a SHA-256 of every
batch's images (shape, dtype, bytes) and targets (``boxes``, ``labels``, ``image_id``) with a
digest recorded from the code of the day it was written (issue 40). The digests are hard-coded on
purpose: a refactor (moving modules, renaming, typing the plan) must leave them unchanged; a change
of any random draw, planned parameter, operator argument, box rule or batch order shows here.

Updating them is a deliberate act, never a way to make a failure go away: when a change of the
batches is intended (a documented fix of a transform, a new draw order), say so in the commit
message, then print the new digests with

    PYTHONPATH=$PWD python3 -m tests.detaug.test_digests

and paste them into :data:`DIGESTS`. They were recorded with DALI 2.4.0, NumPy 2.4.6 and
PyTorch 2.13 on the CPU; the batches do not depend on the number of DALI threads. A new version
of those (not of detaug) may change them: check that nothing in detaug changed, run it twice
(the digests must agree), then update them in a commit of their own that names the versions.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable

import numpy as np
import pytest
import torch
from PIL import Image

import detaug.transforms as T
from detaug.sources import Sample, SampleListSource
from detaug.synthetic import DEFAULT_CLASSES, make_scene
from detaug.torch import DetectionLoader

NUM_IMAGES, BATCH_SIZE, SEED = 12, 4, 7


def _affine_perspective() -> T.Compose:
    return T.Compose(
        [
            T.RandomPerspective(distortion_scale=0.4, p=0.8, fill=90),
            T.RandomAffine(degrees=20, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(5, 10), fill=30),
            T.RandomRotation(degrees=15, p=0.5),
            T.RandomVerticalFlip(p=0.5),
            T.Resize((80, 112)),
        ],
        min_size=2.0,
        min_visibility=0.2,
    )


def _crop_resize_colour() -> T.Compose:
    return T.Compose(
        [
            T.RandomZoomOut(side_range=(1.0, 2.0), fill=60, p=0.5),
            T.RandomIoUCrop(),
            T.RandomHorizontalFlip(p=0.5),
            T.RandomShortestSize(min_size=[64, 72, 80], max_size=120),
            T.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3, hue=0.05),
            T.RandomPhotometricDistort(p=0.5),
            T.RandomGrayscale(p=0.3),
        ],
        min_size=1.0,
    )


def _crop_letterbox() -> T.Compose:
    return T.Compose(
        [
            T.RandomResizedCrop((72, 72), scale=(0.3, 1.0)),
            T.Pad([4, 8], fill=20),
            T.LetterBox((96, 80)),
            T.GaussianBlur(kernel_size=3, sigma=(0.1, 1.5), p=0.5),
            T.RandomErasing(p=0.5),
        ],
        min_size=2.0,
    )


#: Recipe builders by name: the default recipe, the YOLO preset (Mosaic, perspective, affine,
#: MixUp, HSV) at a small size, and three that cover the other warps, crops, resizes and colours.
RECIPES: dict[str, Callable[[], T.Compose]] = {
    "default": lambda: T.default_detection_recipe(96),
    "yolo": lambda: T.yolo_recipe(96, mixup=0.5),
    "affine_perspective": _affine_perspective,
    "crop_resize_colour": _crop_resize_colour,
    "crop_letterbox": _crop_letterbox,
}

#: SHA-256 of one epoch of each recipe (see the module docstring before changing one).
DIGESTS: dict[str, str] = {
    "default": "a2df71feb700dfa9356e36fb40db0a51ce21c1d081a6342ae2b995ee34682725",
    "yolo": "a348e7e0def4b763b7f62a6a9aa2b49cb00c17a98e52ee1076381173e8eceaf6",
    "affine_perspective": "3c9fb2c2921b5e84e9d866e10398f05686a71e6984ab99ba9dc77f9e1229473b",
    "crop_resize_colour": "5d16c4a056e8fc166b551640bc2c5820a6f9ea2e4d99648c090a1979cd24176d",
    "crop_letterbox": "eb6cbb5dd2a0bd173f78f420884afac05589b4b2ec01e0f6e9bca15348883016",
}


def scenes(n: int = NUM_IMAGES, seed: int = 0) -> list[Sample]:
    """``n`` PNG scenes of 80..160 x 64..128 pixels with 1..5 objects of the four default classes
    (labels 1..4)."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        width, height = int(rng.integers(80, 161)), int(rng.integers(64, 129))
        image, scene = make_scene(rng, width, height, 5, DEFAULT_CLASSES, min_size=10)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        boxes = np.array([o.box_xyxy for o in scene.objects], dtype=np.float32).reshape(-1, 4)
        labels = np.array([DEFAULT_CLASSES.index(o.label) + 1 for o in scene.objects], dtype=np.int32)
        samples.append(Sample(buffer.getvalue(), boxes, labels, image_id=i + 1))
    return samples


def _update(digest: "hashlib._Hash", tensor: torch.Tensor) -> None:
    array = tensor.detach().cpu().contiguous().numpy()
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())


def epoch_digest(recipe: T.Compose, samples: list[Sample]) -> str:
    """SHA-256 of one shuffled epoch of ``recipe`` over ``samples`` on the CPU, seed :data:`SEED`."""
    loader = DetectionLoader(SampleListSource(samples), recipe, BATCH_SIZE, device="cpu", shuffle=True,
                             seed=SEED, ready_batches=0)
    digest = hashlib.sha256()
    batches = 0
    for images, targets in loader:
        batches += 1
        for image in images:  # a stacked tensor or a list of differently sized ones
            _update(digest, image)
        for target in targets:
            _update(digest, target["boxes"])
            _update(digest, target["labels"])
            digest.update(str(int(target["image_id"])).encode())
    assert batches == NUM_IMAGES // BATCH_SIZE
    return digest.hexdigest()


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return scenes()


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_outputs_are_unchanged(name, samples):
    assert epoch_digest(RECIPES[name](), samples) == DIGESTS[name], (
        f"the CPU batches of recipe {name!r} changed; if intended, update DIGESTS as the module docstring says"
    )


if __name__ == "__main__":  # prints the digests of today's code, to update DIGESTS deliberately
    for name, build in RECIPES.items():
        print(f'    "{name}": "{epoch_digest(build(), scenes())}",')
