"""The seed contract: a sample's plan is a pure function of its key (seed, epoch, image_id)."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug.seeds import SampleRandom, as_keys, order_generator, sample_keys
from detaug.transforms import Compose

MASK = 2**64 - 1


def every_transform() -> Compose:
    """A recipe with every transform; the probabilities below 1 mix rotated and axis-aligned
    samples in one batch, and the IoU crop follows a rotation (half-plane clipping)."""
    return Compose(
        [
            T.RandomZoomOut(fill=114, side_range=(1.0, 2.0), p=0.5),
            T.RandomRotation(20, fill=114, p=0.5),
            T.RandomIoUCrop(trials=20),
            T.RandomHorizontalFlip(),
            T.RandomVerticalFlip(),
            T.RandomAffine(degrees=10, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5, -3, 3), p=0.5),
            T.RandomRotation(15, expand=True, p=0.7),
            T.RandomResizedCrop((96, 128), scale=(0.3, 1.0)),
            T.Resize(80, max_size=120),
            T.LetterBox((128, 128)),
            T.ColorJitter(0.2, 0.3, 0.4, 0.05, p=0.5),
            T.Normalize(),
        ],
        min_size=1.0,
        min_visibility=0.2,
    )


RECIPES = {"default": lambda: T.default_detection_recipe(size=96), "every_transform": every_transform}


def make_pool(n: int = 40, seed: int = 5):
    """``n`` samples: shapes (H, W, 3), float32 xyxy boxes inside the image (some samples have
    none), labels, and their keys (image ids 1000 + i)."""
    rng = np.random.RandomState(seed)  # test data only; the planner never sees this generator
    shapes, boxes, labels = [], [], []
    for i in range(n):
        h, w = rng.randint(40, 300, size=2)
        k = 0 if i % 5 == 0 else rng.randint(1, 7)
        xy = rng.uniform(0, 1, (k, 2)) * [w * 0.8, h * 0.8]
        wh = rng.uniform(0.05, 1, (k, 2)) * [w * 0.5, h * 0.5] + 2
        b = np.concatenate([xy, np.minimum(xy + wh, [w, h])], axis=1).astype(np.float32)
        shapes.append(np.array([h, w, 3]))
        boxes.append(b)
        labels.append(rng.randint(0, 80, size=k).astype(np.int64))
    keys = sample_keys(3, 1, 1000 + np.arange(n))
    return shapes, boxes, labels, keys


def plan(recipe: Compose, pool, idx):
    shapes, boxes, labels, keys = pool
    idx = list(idx)
    return recipe.plan_batch([shapes[i] for i in idx], [boxes[i] for i in idx], [labels[i] for i in idx], keys[idx])


def assert_same_sample(batch, k, alone):
    for column, single in zip(batch, alone):
        assert column[k].dtype == single[0].dtype
        np.testing.assert_array_equal(column[k], single[0])


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_planning_a_batch_equals_planning_each_sample_alone(name):
    recipe, pool = RECIPES[name](), make_pool()
    alone = [plan(recipe, pool, [i]) for i in range(len(pool[0]))]
    rng = np.random.RandomState(11)
    rotated_and_aligned = cropped = False
    for size in (1, 4, 7, 16):
        for _ in range(3):  # different, shuffled batch-mates each time
            idx = rng.permutation(len(pool[0]))[:size]
            batch = plan(recipe, pool, idx)
            for k, i in enumerate(idx):
                assert_same_sample(batch, k, alone[i])
            matrices = np.stack(batch[0])[:, recipe.plan_layout.slice("warp0.matrix")]
            rotated = matrices[:, 1] != 0
            rotated_and_aligned |= bool(rotated.any() and not rotated.all())
            cropped |= any(len(b) < len(pool[1][i]) for b, i in zip(batch[1], idx))
    assert cropped  # boxes were dropped somewhere: the filters ran
    if name == "every_transform":
        assert rotated_and_aligned  # batches mixed rotated and axis-aligned samples


def test_key_lists_and_arrays_give_the_same_plan():
    recipe, (shapes, boxes, labels, keys) = T.default_detection_recipe(size=64), make_pool(6)
    a = recipe.plan_batch(shapes, boxes, labels, keys)
    b = recipe.plan_batch(shapes, boxes, labels, [k for k in keys])
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("word", [0, 1, 2])
def test_changing_any_key_word_changes_the_plan(word):
    recipe, (shapes, boxes, labels, keys) = every_transform(), make_pool(8)
    other = keys.copy()
    other[:, word] += 1
    a = recipe.plan_batch(shapes, boxes, labels, keys)
    b = recipe.plan_batch(shapes, boxes, labels, other)
    differs = [not np.array_equal(u, v) for u, v in zip(a[0], b[0])]
    assert all(differs)  # every sample's parameters changed


def test_same_key_same_plan_and_no_global_state():
    recipe, pool = every_transform(), make_pool(10)
    first = plan(recipe, pool, range(10))
    np.random.seed(123)  # the legacy global generator must not matter
    np.random.random(17)
    again = plan(every_transform(), pool, range(10))
    for x, y in zip(first, again):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def splitmix_reference(key: tuple[int, ...], count: int) -> list[int]:
    """Pure-Python statement of the contract in detaug.seeds' docstring."""

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    gamma, state = 0x9E3779B97F4A7C15, 0x6465746175675F31
    for word in key:
        state = mix(((state ^ (word & MASK)) + gamma) & MASK)
    return [mix((state + (p + 1) * gamma) & MASK) for p in range(count)]


def test_generator_matches_a_pure_python_reference():
    keys = sample_keys(-7, 2, [0, 1, 2**40, -5])
    rand = SampleRandom(keys)
    u = rand.random((2, 3))
    ints = rand.integers(10, 4)
    for k, key in enumerate(keys.tolist()):
        ref = splitmix_reference(tuple(key), 10)
        np.testing.assert_array_equal(u[k].ravel(), [(z >> 11) * 2.0**-53 for z in ref[:6]])
        np.testing.assert_array_equal(ints[k], [((z >> 32) * 10) >> 32 for z in ref[6:]])


def test_rows_and_counter():
    keys = sample_keys(0, 0, np.arange(10))
    full, part = SampleRandom(keys), SampleRandom(keys)
    rows = np.array([7, 2, 5])
    a, b = full.uniform(2.0, 3.0, (4, 5)), part.uniform(2.0, 3.0, (4, 5), rows=rows)
    assert a.shape == (10, 4, 5) and b.shape == (3, 4, 5) and full.counter == part.counter == 20
    np.testing.assert_array_equal(a[rows], b)
    assert ((a >= 2.0) & (a < 3.0)).all()
    alone = SampleRandom(keys[[5]])
    alone.advance_to(20)
    np.testing.assert_array_equal(alone.random(3)[0], full.random(3)[5])
    with pytest.raises(RuntimeError, match="overran"):
        full.advance_to(5)


def test_uniform_and_integers_are_statistically_sane():
    rand = SampleRandom(sample_keys(42, 0, np.arange(500)))
    u = rand.random(400)  # [500 samples, 400 draws]
    assert abs(u.mean() - 0.5) < 0.003  # sd of the mean: 0.29 / sqrt(2e5) = 0.00065
    assert abs(u.var() - 1 / 12) < 0.002
    assert u.min() >= 0.0 and u.max() < 1.0
    # neighbouring samples (consecutive image ids) and neighbouring draws are uncorrelated
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.01
    hist = np.histogram(u, bins=20, range=(0, 1))[0]
    expected = u.size / 20
    assert ((hist - expected) ** 2 / expected).sum() < 50  # chi2(19): p < 1e-4 beyond 45
    ints = rand.integers(7, 300)
    counts = np.bincount(ints.ravel(), minlength=8)
    assert counts[7] == 0 and ints.min() == 0  # [0, 7): covers 0..6, never 7
    assert ((counts[:7] - ints.size / 7) ** 2 / (ints.size / 7)).sum() < 30  # chi2(6)
    assert set(np.unique(rand.integers(1, 50))) == {0}
    with pytest.raises(ValueError, match="high"):
        rand.integers(0)


def test_sample_keys_and_validation():
    keys = sample_keys(5, 2, np.array([[3], [9]], dtype=np.int32))
    assert keys.dtype == np.int64 and keys.tolist() == [[5, 2, 3], [5, 2, 9]]
    assert sample_keys(0, 0, []).shape == (0, 3)
    with pytest.raises(TypeError, match="image_ids must be integers"):
        sample_keys(0, 0, [1.5])
    with pytest.raises(ValueError, match="epoch"):
        sample_keys(0, -1, [1])
    with pytest.raises(TypeError, match="seed"):
        sample_keys("0", 0, [1])
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        as_keys([np.array([1])])
    with pytest.raises(ValueError, match="2 keys for a batch of 3"):
        as_keys(keys, batch_size=3)


def test_plan_batch_rejects_bad_keys():
    recipe, (shapes, boxes, labels, keys) = T.default_detection_recipe(size=64), make_pool(3)
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        recipe.plan_batch(shapes, boxes, labels, [np.array([0])] * 3)
    with pytest.raises(ValueError, match="2 keys for a batch of 3"):
        recipe.plan_batch(shapes, boxes, labels, keys[:2])


def test_order_generator_depends_on_seed_and_epoch_only():
    a = order_generator(1, 2).permutation(50)
    np.testing.assert_array_equal(a, order_generator(1, 2).permutation(50))
    assert not np.array_equal(a, order_generator(1, 3).permutation(50))
    assert not np.array_equal(a, order_generator(2, 2).permutation(50))
    with pytest.raises(ValueError, match=">= 0"):
        order_generator(-1, 0)


def test_box_geometry_of_a_sample_does_not_depend_on_its_batch():
    """``PlanState`` decides rectangle or half-plane clipping, and sums polygon areas, per sample:
    the visibility (which ``min_visibility`` compares) is bit for bit the same in any batch."""
    from detaug.boxes import rotation_matrix, translation_matrix
    from detaug.plan import PlanState

    rng = np.random.RandomState(2)
    n = 12
    hw = rng.randint(100, 140, size=(n, 2)).astype(np.float64)
    counts = np.where(np.arange(n) % 4 == 1, 1, rng.randint(1, 30, size=n))  # some have one box
    boxes = []
    for (h, w), c in zip(hw, counts):
        xy = rng.uniform(0, 1, (c, 2)) * [w, h]
        xy[: c // 2] *= 0.2  # large boxes: cut by both rotated canvases, up to 8 vertices
        size = np.where(np.arange(c)[:, None] < c // 2, [w, h], 60) * rng.uniform(0.05, 1, (c, 2))
        boxes.append(np.concatenate([xy, np.minimum(xy + size, [w, h])], axis=1))
        if len(boxes) % 3 == 0:  # the whole image: an octagon once cut by the rotated crop
            boxes[-1][0] = (0, 0, w, h)
    angle = np.where(np.arange(n) % 3 == 0, 0.0, rng.uniform(30, 45, n))  # a third stay aligned
    shift = rng.uniform(-5, 5, (n, 2))

    def result(idx):
        keys = sample_keys(0, 0, idx)
        state = PlanState(
            rand=SampleRandom(keys),
            source_hw=hw[idx],
            boxes_src=np.concatenate([boxes[i] for i in idx]),
            sample=np.repeat(np.arange(len(idx)), counts[idx]),
        )
        centre = translation_matrix(hw[idx, 1] / 2, hw[idx, 0] / 2)
        back = translation_matrix(-hw[idx, 1] / 2, -hw[idx, 0] / 2)
        state.apply(centre @ rotation_matrix(angle[idx]) @ back, hw[idx])  # a rotation that crops
        state.apply(translation_matrix(shift[idx, 0], shift[idx, 1]), hw[idx] * 0.9)  # then a crop
        out = state.boxes()
        split = np.cumsum(counts[idx])[:-1]
        return [np.split(a, split) for a in (out.boxes_xyxy, out.keep, out.visibility)]

    alone = [result(np.array([i])) for i in range(n)]
    for idx in (np.arange(n), np.arange(n)[::-1], np.array([4, 0, 9])):
        batch = result(idx)
        for k, i in enumerate(idx):
            for column, single in zip(batch, alone[i]):
                np.testing.assert_array_equal(column[k], single[0])
