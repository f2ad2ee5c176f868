"""What ``SampleListSource`` takes (issue 17, item 5): file paths, encoded bytes, decoded arrays,
PIL images and CHW / HWC uint8 torch tensors, in samples given as ``Sample``, mappings or
``(image, boxes, labels[, image_id])`` tuples; anything else is a ``TypeError`` naming the
sample's index and what it got. The type rules live in ``detaug.formats.sample_inputs``.
"""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from detaug import DatasetError
from detaug.sources import Sample, SampleListSource

BOXES = np.array([[2.0, 3.0, 20.0, 18.0]], np.float32)
LABELS = [4]


def _pixels(h: int = 24, w: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _jpeg(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


# -- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: Image.fromarray(p), lambda p: p),                                   # PIL RGB
        (lambda p: Image.fromarray(p).convert("L"), lambda p: np.asarray(Image.fromarray(p).convert("L"))),
        (lambda p: Image.fromarray(p).convert("RGBA"), lambda p: p),                   # alpha dropped
        (lambda p: torch.from_numpy(p.copy()).permute(2, 0, 1), lambda p: p),          # CHW (non-contiguous)
        (lambda p: torch.from_numpy(p.copy()).permute(2, 0, 1).contiguous(), lambda p: p),
        (lambda p: torch.from_numpy(p.copy()), lambda p: p),                           # HWC
        (lambda p: torch.from_numpy(p[..., 0].copy()), lambda p: p[..., 0]),           # [H, W]
        (lambda p: torch.from_numpy(p[..., :1].copy()).permute(2, 0, 1), lambda p: p[..., 0]),  # [1, H, W]
    ],
    ids=["pil-rgb", "pil-l", "pil-rgba", "tensor-chw-view", "tensor-chw", "tensor-hwc", "tensor-hw", "tensor-1hw"],
)
def test_decoded_images_become_uint8_arrays(make, expected):
    pixels = _pixels()
    source = SampleListSource([Sample(make(pixels), BOXES, LABELS)])
    image = source.samples[0].image
    assert isinstance(image, np.ndarray) and image.dtype == np.uint8
    np.testing.assert_array_equal(image, expected(pixels))
    assert source.decoded


def test_a_chw_tensor_whose_width_is_3_is_read_as_chw():
    """``[3, H, 3]`` is ambiguous; torch's convention (CHW) wins, as documented."""
    chw = torch.arange(3 * 5 * 3, dtype=torch.uint8).reshape(3, 5, 3)
    image = SampleListSource([(chw, np.zeros((0, 4)), [])]).samples[0].image
    assert image.shape == (5, 3, 3)
    np.testing.assert_array_equal(image, chw.permute(1, 2, 0).numpy())


def test_a_1d_uint8_tensor_is_encoded_bytes():
    data = _jpeg(_pixels())
    source = SampleListSource([(torch.frombuffer(bytearray(data), dtype=torch.uint8), BOXES, LABELS)])
    assert not source.decoded
    assert source.samples[0].image.tobytes() == data


def test_a_float_tensor_is_a_malformed_image_naming_the_tensor():
    with pytest.raises(DatasetError, match=r"sample 0.*malformed image entry.*Tensor of shape \(3, 24, 32\).*float32"):
        SampleListSource([(torch.zeros(3, 24, 32), BOXES, LABELS)])


# -- sample containers ----------------------------------------------------------------------------


def test_samples_as_tuples_mappings_and_samples_mix():
    pixels = [_pixels(seed=k) for k in range(5)]
    source = SampleListSource([
        (pixels[0], BOXES, LABELS),
        (pixels[1], BOXES, LABELS, 11),
        [pixels[2], BOXES, LABELS, 12],
        {"image": pixels[3], "boxes": BOXES, "labels": LABELS, "image_id": 13, "size": (24, 32)},
        Sample(pixels[4], BOXES, LABELS, 14),
    ])
    assert [s.image_id for s in source.samples] == [0, 11, 12, 13, 14]
    assert source.samples[3].size == (24, 32)
    for s in source.samples:
        np.testing.assert_array_equal(s.boxes, BOXES)
        assert s.labels.tolist() == LABELS


def test_tuple_ids_default_to_positions():
    source = SampleListSource([(_pixels(seed=k), BOXES, LABELS) for k in range(3)])
    assert [s.image_id for s in source.samples] == [1, 2, 3]


@pytest.mark.parametrize(
    "bad, message",
    [
        (5, r"sample 1: a Sample, a mapping or an \(image, boxes, labels\[, image_id\]\) tuple, got int"),
        (None, r"sample 1: .* got NoneType"),
        ("img.jpg", r"sample 1: .* got str"),
        ((np.zeros((4, 4, 3), np.uint8), BOXES), r"sample 1: a tuple sample is .* got a tuple of 2 items"),
        ((np.zeros((4, 4, 3), np.uint8), BOXES, LABELS, 1, (4, 4)), r"sample 1: .* got a tuple of 5 items"),
        ({"image": "a.jpg", "bbox": BOXES}, r"sample 1: unknown key\(s\) 'bbox'"),
        ({"boxes": BOXES}, r"sample 1: a sample mapping needs an 'image' key"),
        ((3.5, BOXES, LABELS), r"sample 1: image must be .* got float"),
        (([[1, 2], [3, 4]], BOXES, LABELS), r"sample 1: image must be .* got a list of 2 items"),
        ((object(), BOXES, LABELS), r"sample 1: image must be .* got object"),
    ],
)
def test_anything_else_is_a_type_error_naming_index_and_type(bad, message):
    with pytest.raises(TypeError, match=message):
        SampleListSource([(_pixels(), BOXES, LABELS), bad])


def test_the_sample_list_itself_must_be_a_list():
    with pytest.raises(TypeError, match="samples must be a list of Sample, mappings or"):
        SampleListSource({"image": "a.jpg"})


# -- through the loader ---------------------------------------------------------------------------


def _batches(samples) -> list:
    import detaug.transforms as T
    from detaug.torch import DetectionLoader

    recipe = T.Compose([T.RandomHorizontalFlip(p=0.5), T.Resize((16, 16))])
    loader = DetectionLoader(SampleListSource(samples), recipe, 2, device="cpu", seed=3, num_workers=0)
    try:
        return [(images.clone(), [t["boxes"].clone() for t in targets]) for images, targets in loader]
    finally:
        loader.close()


def test_pil_images_and_tensors_give_the_arrays_batches():
    """The same pixels given as arrays, PIL images, CHW and HWC tensors: the same batches."""
    pixels = [_pixels(seed=k) for k in range(3)]
    as_arrays = _batches([(p, BOXES, LABELS) for p in pixels])
    for convert in (Image.fromarray, lambda p: torch.from_numpy(p.copy()).permute(2, 0, 1),
                    lambda p: torch.from_numpy(p.copy())):
        got = _batches([(convert(p), BOXES, LABELS) for p in pixels])
        assert len(got) == len(as_arrays) == 2
        for (images, boxes), (ref_images, ref_boxes) in zip(got, as_arrays):
            assert torch.equal(images, ref_images)
            assert all(torch.equal(b, r) for b, r in zip(boxes, ref_boxes))


def test_sources_do_not_import_torch_or_pil():
    code = "import sys, detaug.sources; assert 'torch' not in sys.modules and 'PIL.Image' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("box_format", ["xywh", "cxcywh", "yolo"])
def test_sample_lists_take_box_formats(tmp_path, box_format):
    from PIL import Image

    from detaug.formats.box_formats import from_xyxy

    xyxy = np.array([[10, 20, 50, 60], [0, 0, 30, 10]], np.float64)
    path = tmp_path / "a.png"
    Image.new("RGB", (200, 100)).save(path)
    array = np.zeros((100, 200, 3), np.uint8)
    for image in (str(path), array):
        given = from_xyxy(xyxy, box_format, (100, 200))
        source = SampleListSource([(image, given, [1, 2])], box_format=box_format)
        np.testing.assert_allclose(source.samples[0].boxes, xyxy, atol=1e-3)
    with pytest.raises(ValueError, match="box_format must be one of 'xyxy', 'xywh', 'cxcywh', 'yolo'"):
        SampleListSource([(array, xyxy, [1, 2])], box_format="xyxyn")
