"""CopyPaste: a partner's objects pasted by their masks, the sample's objects occluded by them
(masks lose the pasted pixels, boxes recomputed, min_visibility applied), planned by the real
BatchPlanner and checked against masks computed independently from the painted scenes; the
pasted pixels drawn by real DALI CPU pipelines checked against the output masks (alone and
followed by warps, partners from the dataset and from the batch); the object choice, the seed
contract and the named errors. DETAUG_TEST_DEVICE=gpu runs the pipelines on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import detaug.transforms as T
from detaug.errors import RecipeError
from detaug.masks import masks_to_boxes, paste_over, warp_mask
from detaug.epochs import EpochSpec
from detaug.planning import BatchPlanner
from detaug.sources import Sample, SampleListSource
from tests.detaug.test_masks import DEVICE, HW, check_masks_on_pixels, iou, scene
from tests.detaug.transforms.test_mixing import run

SCENES = [scene(s) for s in range(6)]

#: CopyPaste alone (the canvas is the scenes' size: the partner's map is the identity), and
#: followed by warps of known geometry (a flip, then half the size): ``(recipe, output map)``
RECIPES = {
    "alone": ([T.Resize(HW), T.CopyPaste(p=1.0)], np.eye(3), HW),
    "half": ([T.Resize(HW), T.CopyPaste(p=1.0, fraction=0.5)], np.eye(3), HW),
    "flip_resize": ([T.Resize(HW), T.CopyPaste(p=1.0, max_objects=2), T.RandomHorizontalFlip(p=1.0),
                     T.Resize((HW[0] // 2, HW[1] // 2))],
                    np.array([[-0.5, 0, HW[1] / 2], [0, 0.5, 0], [0, 0, 1]]), (HW[0] // 2, HW[1] // 2)),
}


def plan(recipe: list, seed: int = 3, batch_size: int = 3, n: int = 6, **kwargs) -> list:
    planner = BatchPlanner(SampleListSource(SCENES[:n]), T.Compose(recipe, **kwargs),
                           EpochSpec(n=n, batch_size=batch_size, seed=seed))
    return [planner.plan(0, step) for step in range(n // batch_size)]


def expected(planned, i: int, matrix: np.ndarray, out_hw: tuple[int, int]) -> dict[int, np.ndarray]:
    """label -> the mask each kept object should have, computed from the scenes: the sample's
    own masks minus the pasted objects' (the partner's objects whose labels were kept), then
    moved by ``matrix`` (nearest)."""
    own, mate = SCENES[int(planned.positions[i])], SCENES[int(planned.partner_positions[i, 0])]
    own_labels, mate_labels = set(own.labels.tolist()), set(mate.labels.tolist())
    labels = planned.labels[i].tolist()
    pasted = [k for k, lab in enumerate(mate.labels.tolist()) if lab in labels and lab not in own_labels]
    cover = mate.fields["masks"][pasted].any(axis=0) if pasted else np.zeros(HW, bool)
    masks = {}
    for k, lab in enumerate(own.labels.tolist()):
        if lab not in mate_labels or own is mate:
            masks[lab] = own.fields["masks"][k] & ~cover
    for k in pasted:
        masks[int(mate.labels[k])] = mate.fields["masks"][k]
    return {lab: warp_mask(m, matrix, out_hw) for lab, m in masks.items()}


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_output_mask_is_its_object_left_visible_after_the_paste(name):
    recipe, matrix, out_hw = RECIPES[name]
    ious, pasted_seen, occluded_seen = [], 0, 0
    for planned in plan(recipe):
        for i in range(len(planned.labels)):
            want = expected(planned, i, matrix, out_hw)
            masks, boxes, labels = planned.fields[i]["masks"], planned.boxes[i], planned.labels[i].tolist()
            assert masks.shape == (len(labels), *out_hw) and masks.dtype == np.uint8
            mate = int(planned.partner_positions[i, 0])
            pasted_seen += sum(lab // 10 == mate for lab in labels) if mate != planned.positions[i] else 0
            for lab, mask, box in zip(labels, masks, boxes):
                ious.append(iou(mask == 1, want[lab] == 1))
                tight = masks_to_boxes(mask[None])[0]
                assert (tight[:2] >= box[:2] - 1.01).all() and (tight[2:] <= box[2:] + 1.01).all(), (lab, tight, box)
                original = SCENES[lab // 10].fields["masks"][lab % 10]
                occluded_seen += int(warp_mask(original, matrix, out_hw).sum() > mask.sum() + 10)
    assert pasted_seen > 0 and occluded_seen > 0  # the scenes overlap: some objects are pasted over others
    assert np.median(ious) >= 0.98 and min(ious) >= 0.9, sorted(ious)[:5]


def test_the_chosen_share_and_the_limit_of_pasted_objects():
    for recipe, most in (([T.Resize(HW), T.CopyPaste(p=1.0, fraction=0.5)], 2),
                         ([T.Resize(HW), T.CopyPaste(p=1.0, max_objects=1)], 1),
                         ([T.Resize(HW), T.CopyPaste(p=1.0, fraction=0.0)], 0)):
        for planned in plan(recipe):
            for i, labels in enumerate(planned.labels):
                mate, own = int(planned.partner_positions[i, 0]), int(planned.positions[i])
                if mate != own:
                    assert sum(lab // 10 == mate for lab in labels.tolist()) == most
    assert T.CopyPaste(fraction=0.5).choose(0.25, 3).sum() == 2
    assert not T.CopyPaste(p=1.0).choose(0.5, 0).size


def test_p_zero_pastes_nothing_and_keeps_the_samples_targets():
    for planned in plan([T.Resize(HW), T.CopyPaste(p=0.0)]):
        for i, labels in enumerate(planned.labels):
            own = SCENES[int(planned.positions[i])]
            assert labels.tolist() == own.labels.tolist()
            assert (planned.fields[i]["masks"] == own.fields["masks"]).all()


def test_min_visibility_drops_the_objects_mostly_covered():
    loose = plan([T.Resize(HW), T.CopyPaste(p=1.0)])
    strict = plan([T.Resize(HW), T.CopyPaste(p=1.0, min_visibility=0.7)])
    dropped = 0
    for a, b in zip(loose, strict):
        for i in range(len(a.labels)):
            own = SCENES[int(a.positions[i])]
            for k, lab in enumerate(own.labels.tolist()):
                if lab not in a.labels[i].tolist() or int(a.partner_positions[i, 0]) == int(a.positions[i]):
                    continue
                share = a.fields[i]["masks"][a.labels[i].tolist().index(lab)].sum() / own.fields["masks"][k].sum()
                assert (lab in b.labels[i].tolist()) == (share >= 0.7), (lab, share)
                dropped += share < 0.7
    assert dropped > 0


def test_paste_over_cuts_the_covered_pixels_recomputes_boxes_and_drops():
    masks = np.zeros((3, 10, 12), np.uint8)
    masks[0, 2:8, 1:7] = 1  # own, its right half covered
    masks[1, 2:4, 8:10] = 1  # own, covered whole
    masks[2, 0:10, 4:12] = 1  # pasted
    boxes = np.array([[1, 2, 7, 8], [8, 2, 10, 4], [4, 0, 12, 10]], np.float32)
    keep, out_boxes, out = paste_over(boxes, masks, np.array([False, False, True]), 0.5)
    assert keep.tolist() == [True, False, True]
    assert out_boxes[0].tolist() == [1, 2, 4, 8] and out_boxes[2].tolist() == boxes[2].tolist()
    assert out[0].sum() == 18 and (out[2] == masks[2]).all()
    keep, _, _ = paste_over(boxes, masks, np.array([False, False, True]), 0.6)
    assert keep.tolist() == [False, False, True]  # 18 of 36 pixels left


def test_the_seed_contract_holds_for_the_dataset_pool():
    recipe = [T.Resize(HW), T.CopyPaste(p=0.7, fraction=0.5), T.RandomHorizontalFlip()]
    by3 = plan(recipe, batch_size=3)
    by1 = plan(recipe, batch_size=1)
    again = plan(recipe, batch_size=3)
    flat1 = {int(p.image_ids[0]): (p.labels[0], p.boxes[0], p.fields[0]["masks"]) for p in by1}
    for a, b in zip(by3, again):
        for i, image_id in enumerate(a.image_ids.tolist()):
            labels, boxes, masks = flat1[image_id]
            assert a.labels[i].tolist() == labels.tolist() == b.labels[i].tolist()
            assert np.array_equal(a.boxes[i], boxes) and np.array_equal(a.fields[i]["masks"], masks)
    other = plan(recipe, seed=4)
    assert any(x.labels[i].tolist() != y.labels[i].tolist() for x, y in zip(by3, other) for i in range(3))


def test_a_source_without_masks_is_a_named_error():
    plain = SampleListSource([Sample(s.image, s.boxes, s.labels, image_id=s.image_id) for s in SCENES[:2]])
    with pytest.raises(RecipeError, match="CopyPaste.*no masks are carried"):
        BatchPlanner(plain, T.Compose([T.Resize(HW), T.CopyPaste()]), EpochSpec(n=2, batch_size=2))


#: recipes whose pasted pixels are checked against the output masks
PIXELS = {
    "alone": [T.Resize(HW), T.CopyPaste(p=1.0, fraction=0.5)],
    "batch_pool": [T.Resize(HW), T.CopyPaste(p=1.0, fraction=0.7, pool="batch")],
    "rotate_resize": [T.Resize(HW), T.CopyPaste(p=1.0, max_objects=2), T.RandomRotation(25, fill=0),
                      T.Resize((HW[0] // 2 + 8, HW[1] // 2 + 8))],
    "mosaic_affine": [T.Mosaic((HW[0] // 2, HW[1] // 2), fill=0), T.CopyPaste(p=1.0, min_visibility=0.3),
                      T.RandomAffine(degrees=10, scale=(0.8, 1.2), fill=0)],
}


@pytest.mark.parametrize("name", list(PIXELS))
def test_the_pasted_pixels_match_the_output_masks(name):
    """Each colour's pixels of the DALI output against the union of its objects' masks (the
    pasted objects' and what is left of the sample's): IoU >= 0.98 median."""
    ious, pasted = [], 0
    for planned, images in run(SampleListSource(SCENES), T.Compose(PIXELS[name]), 3, seed=5):
        for i, image in enumerate(images):
            out = {"image": image, "boxes": planned.boxes[i], "labels": planned.labels[i],
                   "masks": planned.fields[i]["masks"]}
            ious += check_masks_on_pixels(out)
            pasted += int(planned.pasted[i].any())
    assert pasted > 0
    assert np.median(ious) >= 0.98 and min(ious) >= 0.9, sorted(ious)[:5]


def test_an_eager_call_pastes_the_samples_own_objects_onto_itself():
    s = SCENES[0]
    out = T.Compose([T.Resize(HW), T.CopyPaste(p=1.0)])(image=s.image, boxes=s.boxes, labels=s.labels,
                                                         masks=s.fields["masks"], seed=0, image_id=1, device=DEVICE)
    assert sorted(out["labels"].tolist()) == s.labels.tolist()  # the copies on top; the covered originals dropped
    assert np.median(check_masks_on_pixels(out)) >= 0.98


@pytest.mark.parametrize("recipe, words", [
    ([T.CopyPaste()], "fixed canvas size"),
    ([T.Resize(HW), T.CutMix(), T.CopyPaste()], "blend only once"),
])
def test_misplaced_copypaste_is_a_recipe_error(recipe, words):
    with pytest.raises(RecipeError, match=words):
        T.Compose(recipe)


@pytest.mark.parametrize("kind", ["arrays", "coco"])
def test_planning_workers_paste_as_the_main_process(kind, tmp_path):
    """A loader whose plans come from a worker (decoded arrays planned from their shapes, or
    encoded COCO images, their paste masks through shared memory) gives the images and targets
    of one planned in the main process."""
    import torch

    from detaug.sources import CocoSource
    from detaug.torch import DetectionLoader
    from tests.detaug.test_masks import coco_scene

    if kind == "coco":
        path, root, _ = coco_scene(tmp_path)
        source = CocoSource(path, root, masks=True)
    else:
        source = SampleListSource(SCENES[:3])
    recipe = T.Compose([T.Resize(HW), T.CopyPaste(p=1.0, fraction=0.7), T.RandomRotation(15, fill=0)])
    got = []
    for workers in (0, 1):
        loader = DetectionLoader(source, recipe, 3, device=DEVICE, seed=2, num_threads=1, num_workers=workers)
        images, targets = next(iter(loader))
        loader.close()
        got.append((torch.stack([im.cpu() for im in images]), torch.cat([t["masks"].cpu() for t in targets])))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


def test_a_sample_without_objects_is_left_as_it_is():
    image = np.full((40, 60, 3), 7, np.uint8)
    out = T.Compose([T.Resize((40, 60)), T.CopyPaste(p=1.0)])(
        image=image, boxes=np.zeros((0, 4), np.float32), labels=[], masks=np.zeros((0, 40, 60), np.uint8),
        seed=0, image_id=1, device=DEVICE)
    assert (np.asarray(out["image"]) == 7).all() and out["masks"].shape == (0, 40, 60) and len(out["boxes"]) == 0
