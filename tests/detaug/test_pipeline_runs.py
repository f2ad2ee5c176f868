"""Several batches in one DALI run (detaug.pipeline_runs): the loader yields the same batches,
targets, skips and resumed epochs whatever the number; real DALI CPU pipelines."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import detaug.transforms as T
from detaug import DataWarning
from detaug.pipeline_runs import MAX_BATCHES_PER_RUN, RUN_BYTES, RUN_IMAGES, default_batches_per_run, join_run
from detaug.sources import Sample, SampleListSource
from detaug.torch import DetectionLoader
from tests.detaug.consistency import scene_samples
from tests.detaug.test_bad_images import RECIPE as BAD_RECIPE
from tests.detaug.test_bad_images import good_jpeg, header_fine_body_broken

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")  # DETAUG_TEST_DEVICE=gpu: the same tests on a GPU
#: On a GPU the hardware decoder takes a share of each run, so which decoder an image meets
#: depends on the run (their pixels may differ by rounding): compared runs use the CUDA decoder.
SAME_DECODER = 0.0


@pytest.fixture(scope="module")
def samples():
    return scene_samples(23, size=(96, 80), max_objects=4, min_size=12)[0]


def test_the_default_aims_at_256_images_on_the_gpu_and_one_batch_on_the_cpu(samples):
    assert RUN_IMAGES == 256 and MAX_BATCHES_PER_RUN == 8 and RUN_BYTES == 512 * 2**20
    small = 320 * 320 * 3 * 4  # float32 images of 320x320: 256 of them fit in RUN_BYTES
    assert [default_batches_per_run(b, True, small) for b in (8, 16, 32, 64, 100, 128, 256, 512)] == \
        [8, 8, 8, 4, 3, 2, 1, 1]
    big = 800 * 1333 * 3 * 4  # 41 of them fit
    assert [default_batches_per_run(b, True, big) for b in (2, 8, 16, 64)] == [8, 5, 2, 1]
    assert default_batches_per_run(64, True, None) == 1  # no fixed output size: images of any size
    assert [default_batches_per_run(b, False, small) for b in (8, 64, 256)] == [1, 1, 1]
    given = DetectionLoader(SampleListSource(samples), RECIPES["ragged"], 4, device=DEVICE, batches_per_run=3)
    assert given.batches_per_run == 3 and given.pipeline.max_batch_size == 12
    given.close()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"batches_per_run must be an integer >= 1 or None, got {bad!r}"):
            DetectionLoader(SampleListSource(samples), RECIPES["ragged"], 4, device=DEVICE, batches_per_run=bad)
    # a loader's default: from its recipe's output size and dtype (float32 after Normalize)
    fixed = DetectionLoader(SampleListSource(samples), RECIPES["crop-flip-resize"], 4, device=DEVICE)
    assert fixed.batches_per_run == (8 if DEVICE == "gpu" else 1)
    assert fixed.pipeline.max_batch_size == 4 * fixed.batches_per_run
    ragged = DetectionLoader(SampleListSource(samples), RECIPES["ragged"], 4, device=DEVICE)
    assert ragged.batches_per_run == 1
    fixed.close()
    ragged.close()


def _epochs(loader, epochs=2):
    """Every batch of ``epochs`` epochs: ``(ids, images, targets)``, tensors cloned."""
    out = []
    for _ in range(epochs):
        for images, targets in loader:
            images = images.clone() if isinstance(images, torch.Tensor) else [i.clone() for i in images]
            if isinstance(targets, list):
                ids = [t["image_id"] for t in targets]
                targets = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in t.items()} for t in targets]
            else:
                ids = targets["image_id"].tolist()
                targets = {k: v.clone() for k, v in targets.items()}
            out.append((ids, images, targets))
    return out


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


RECIPES = {
    "crop-flip-resize": T.Compose([T.RandomIoUCrop(), T.RandomHorizontalFlip(),
                                   T.RandomAffine(10, (0.1, 0.1), (0.9, 1.1), shear=5, fill=114),
                                   T.Resize((48, 64)), T.ColorJitter(0.2, 0.2, 0.2, 0.05), T.Normalize()]),
    "ragged": T.Compose([T.RandomHorizontalFlip(), T.RandomIoUCrop()]),  # no output size: a list of images
    "batch-mates": T.Compose([T.Mosaic((64, 64), fill=114, pool="batch"), T.MixUp(p=0.5, pool="batch"),
                              T.Resize((48, 64))]),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("targets", ["dict", "padded", "concat"])
def test_runs_of_several_batches_yield_what_runs_of_one_do(samples, recipe, targets):
    """Batches of 4 from 23 samples (6 batches, the last of 3): runs of 2 and 4 batches (a short
    run at each epoch's end, none across it) give the same ids, images and targets as runs of one, in
    two shuffled epochs, also with partners drawn from the batch (their places move in a run)."""
    source = SampleListSource(samples)
    made = {}
    for per_run in (1, 2, 4):
        loader = DetectionLoader(source, RECIPES[recipe], 4, device=DEVICE, shuffle=True, seed=3, targets=targets,
                                 batches_per_run=per_run, hw_decoder_load=SAME_DECODER)
        assert loader.batches_per_run == per_run and loader.pipeline.max_batch_size == 4 * per_run
        made[per_run] = _epochs(loader)
        loader.close()
    one = made[1]
    assert len(one) == 12 and [len(ids) for ids, *_ in one[:6]] == [4, 4, 4, 4, 4, 3]
    for per_run in (2, 4):
        assert [ids for ids, *_ in made[per_run]] == [ids for ids, *_ in one]
        for (_, images, tg), (_, images1, tg1) in zip(made[per_run], one):
            assert _equal(images, images1) and _equal(tg, tg1)


def test_runs_resume_mid_run_and_mid_epoch(samples):
    """A state saved after any batch, also inside a run, resumes with the batches an unbroken
    run yields."""
    recipe = RECIPES["crop-flip-resize"]
    source = SampleListSource(samples)
    def loader_of():
        return DetectionLoader(source, recipe, 4, device=DEVICE, shuffle=True, seed=3, batches_per_run=3,
                               hw_decoder_load=SAME_DECODER)

    whole = _epochs(loader_of())
    for after in (1, 4):  # inside the first run; inside the second
        loader = loader_of()
        it = iter(loader)
        for _ in range(after):
            next(it)
        state = loader.state_dict()
        it.close()
        loader.close()
        resumed = loader_of()
        resumed.load_state_dict(state)
        rest = _epochs(resumed, epochs=2)[: len(whole) - after]
        assert [ids for ids, *_ in rest] == [ids for ids, *_ in whole[after:]]
        assert all(_equal(a[1], b[1]) and _equal(a[2], b[2]) for a, b in zip(rest, whole[after:]))
        resumed.close()


def test_a_decoder_failure_inside_a_run_costs_only_the_culprit(tmp_path):
    """An image DALI fails on (header fine) in the second batch of a run of three: it is named
    and skipped, the run planned again without it, and the batches are those of runs of one."""
    broken = header_fine_body_broken(tmp_path / "broken.jpg")
    samples = [Sample(str(good_jpeg(tmp_path / f"g{i}.jpg")), [[10, 8, 30, 24]], [1], i + 1) for i in range(10)]
    samples.insert(4, Sample(str(broken), [[10, 8, 30, 24]], [1], 99))
    made = {}
    for per_run in (1, 3):
        loader = DetectionLoader(SampleListSource(samples), BAD_RECIPE, 3, device=DEVICE, batches_per_run=per_run,
                                 hw_decoder_load=SAME_DECODER)
        with pytest.warns(DataWarning, match=r"broken.jpg \(image_id 99\): cannot be decoded"):
            made[per_run] = _epochs(loader, epochs=1)
        assert [s["image_id"] for s in loader.skipped] == [99]
        loader.close()
    assert [ids for ids, *_ in made[3]] == [ids for ids, *_ in made[1]]
    assert 99 not in [i for ids, *_ in made[3] for i in ids]
    assert all(_equal(a[1], b[1]) for a, b in zip(made[3], made[1]))


def test_join_run_moves_batch_mates_to_their_places_in_the_run(samples):
    """A partner drawn from the batch (pool="batch") is a place in its batch; joined in a run it
    is that place plus the batch's start, the rest of the parameters as they were."""
    recipe = RECIPES["batch-mates"]
    loader = DetectionLoader(SampleListSource(samples), recipe, 4, device="cpu", shuffle=True, seed=3)
    plans = [loader.planner.plan(0, step) for step in (0, 1, 2)]
    for p in plans:
        loader.planner.fill_data(p)
    run = join_run(plans)
    assert run.sizes == [4, 4, 4] and run.describe() == "batches 0-2 of epoch 0"
    assert run.joined.image_ids.tolist() == [i for p in plans for i in p.image_ids.tolist()]
    assert len(run.joined.data) == 12
    names = [n for n in plans[0].layout.names if n.endswith(".batch_index")]
    assert names
    for name in plans[0].layout.names:
        joined = run.joined.plan(name)
        want = np.concatenate([p.plan(name) + (4 * k if name in names else 0) for k, p in enumerate(plans)])
        np.testing.assert_array_equal(joined, want)
    assert join_run(plans[:1]).joined is plans[0] and join_run(plans[:1]).describe() == "batch 0 of epoch 0"
    loader.close()


def over_max_boxes() -> list[Sample]:
    """12 samples of one box each but image 6 (the second batch of 4), with 3: over ``max_boxes=2``."""
    image = np.full((48, 64, 3), 114, np.uint8)
    samples = [Sample(image, [[4, 4, 20, 20]], [1], image_id=i + 1) for i in range(12)]
    samples[5] = Sample(image, [[4, 4, 20, 20], [30, 4, 50, 20], [4, 24, 20, 40]], [1, 1, 1], image_id=6)
    return samples


@pytest.mark.parametrize("per_run", [1, 3])
def test_an_error_in_a_runs_batch_comes_after_the_batches_before_it(per_run):
    """A batch that cannot be handed over (an image with more boxes than ``max_boxes``), the
    second of its run: the batch before it comes out, then the error naming the image, as with
    runs of one batch."""
    loader = DetectionLoader(SampleListSource(over_max_boxes()), BAD_RECIPE, 4, device=DEVICE, targets="padded",
                             max_boxes=2, batches_per_run=per_run)
    got = []
    with pytest.raises(ValueError, match="image 6 has 3 boxes, more than max_boxes=2"):
        for _, targets in loader:
            got.append(targets["image_id"].tolist())
    assert got == [[1, 2, 3, 4]]
    loader.close()
