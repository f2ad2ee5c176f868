"""Bad images are skipped, named and counted (or raised with on_error="raise"); odd but valid
images decode to the right RGB; EXIF-rotated images keep their boxes on their objects. Real
DALI CPU pipelines, both adapters."""

from __future__ import annotations

import io
import os
import struct
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import detaug.transforms as T
from detaug import DataWarning, ImageError
from detaug.keras import DetectionSequence
from detaug.sources import Sample, SampleListSource
from detaug.torch import DetectionLoader

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")  # DETAUG_TEST_DEVICE=gpu: the same tests on a GPU
REALDATA = Path(__file__).resolve().parents[3] / "shared" / "realdata"
SIZE = (48, 64)  # (h, w) of the good images
RED = (230, 20, 20)


def good_jpeg(path: Path, **save) -> Path:
    image = np.full((*SIZE, 3), 114, np.uint8)
    image[8:24, 10:30] = RED
    Image.fromarray(image).save(path, "JPEG", quality=95, **save)
    return path


def huge_png_header() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def bad_files(folder: Path) -> dict[str, Path]:
    """One file per reason an image is skipped."""
    folder.mkdir(exist_ok=True)
    jpeg = good_jpeg(folder / "whole.jpg").read_bytes()
    files = {
        "missing": folder / "missing.jpg",
        "empty": folder / "empty.jpg",
        "truncated": folder / "truncated.jpg",
        "gif": folder / "anim.gif",
        "text": folder / "notes.jpg",
        "huge": folder / "huge.png",
    }
    files["empty"].write_bytes(b"")
    files["truncated"].write_bytes(jpeg[: len(jpeg) // 2])
    Image.new("RGB", (64, 48), RED).save(files["gif"], "GIF")
    files["text"].write_text("this is not an image\n")
    files["huge"].write_bytes(huge_png_header())
    return files


def dataset(tmp_path: Path, n_good: int = 6) -> tuple[list[Sample], dict[str, Path]]:
    bad = bad_files(tmp_path / "bad")
    samples = [Sample(str(good_jpeg(tmp_path / f"good{i}.jpg")), [[10, 8, 30, 24]], [1], image_id=i + 1) for i in range(n_good)]
    samples += [Sample(str(path), [[10, 8, 30, 24]], [1], image_id=100 + k) for k, path in enumerate(bad.values())]
    return samples, bad


RECIPE = T.Compose([T.RandomHorizontalFlip(), T.Resize(SIZE)])


def test_loader_skips_every_bad_image_and_names_it(tmp_path):
    samples, bad = dataset(tmp_path)
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device=DEVICE, shuffle=True, seed=3)
    assert len(loader) == 3  # 12 samples: the length holds
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader)
    assert [len(targets) for _, targets in batches] == [4, 4, 4]  # batches keep their size
    ids = [t["image_id"] for _, targets in batches for t in targets]
    assert set(ids) <= set(range(1, 7))  # only good images come out ...
    skipped = {s["file"]: s for s in loader.skipped}
    assert set(skipped) == {str(p) for p in bad.values()}  # ... and every bad one is named
    for s in loader.skipped:
        assert s["image_id"] >= 100 and s["reason"]
    reasons = {name: skipped[str(path)]["reason"] for name, path in bad.items()}
    assert "read" in reasons["missing"] and "empty" in reasons["empty"]
    assert "truncated" in reasons["truncated"] and "GIF" in reasons["gif"]
    messages = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert len(messages) == len(bad) and all(any(str(p) in m for m in messages) for p in bad.values())
    for _, targets in batches:  # the replacements carry their own boxes
        for t in targets:
            assert t["boxes"].shape == (1, 4)


def test_loader_raises_naming_file_and_id(tmp_path):
    samples, bad = dataset(tmp_path)
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 4, device=DEVICE, on_error="raise")
    with pytest.raises(ImageError) as info:
        list(loader)
    assert info.value.file == str(bad["missing"]) and info.value.image_id == 100
    assert str(bad["missing"]) in str(info.value) and "image_id 100" in str(info.value)


def test_keras_sequence_skips_the_same_way(tmp_path):
    samples, bad = dataset(tmp_path)
    seq = DetectionSequence(SampleListSource(samples), RECIPE, 4, max_boxes=2, device=DEVICE, plan_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        labels = [seq[i][1]["labels"] for i in range(len(seq))]
    assert all(len(lab) == 4 and (lab[:, 0] == 1).all() for lab in labels)
    assert {s["file"] for s in seq.skipped} == {str(p) for p in bad.values()}
    raising = DetectionSequence(SampleListSource(samples), RECIPE, 4, max_boxes=2, device=DEVICE, plan_workers=0, on_error="raise")
    with pytest.raises(ImageError, match="image_id 10"):
        for i in range(len(raising)):
            raising[i]


@pytest.mark.skipif(not (REALDATA / "damse-truncated-jpeg").is_dir(), reason="needs ../shared/realdata (absent in a fresh clone)")
def test_the_real_truncated_upload_is_skipped(tmp_path):
    path = REALDATA / "damse-truncated-jpeg" / "JPEGImages" / "000001.jpg"
    samples = [Sample(str(good_jpeg(tmp_path / "ok.jpg")), [[10, 8, 30, 24]], [1], 1), Sample(str(path), [[1, 1, 9, 9]], [2], 2)]
    loader = DetectionLoader(SampleListSource(samples), RECIPE, 2, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        (_, targets), = list(loader)
    assert [t["image_id"] for t in targets] == [1, 1]
    assert loader.skipped == [{"image_id": 2, "file": str(path), "reason": loader.skipped[0]["reason"]}]


def odd_images() -> dict[str, bytes]:
    """Valid images DALI must decode to the right RGB: (name, bytes); each is RED on grey."""
    base = np.full((*SIZE, 3), 114, np.uint8)
    base[8:24, 10:30] = RED
    rgb = Image.fromarray(base)
    out = {}
    for name, image, fmt in [
        ("gray", rgb.convert("L"), "JPEG"),
        ("cmyk", rgb.convert("CMYK"), "JPEG"),
        ("rgba", rgb.convert("RGBA"), "PNG"),
        ("png_named_jpg", rgb, "PNG"),
    ]:
        buffer = io.BytesIO()
        image.save(buffer, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        out[name] = buffer.getvalue()
    sixteen = (base.astype(np.uint16) * 257)[..., 0]  # 16-bit grayscale PNG of the red channel
    buffer = io.BytesIO()
    Image.fromarray(sixteen.astype("<u2")).save(buffer, "PNG")
    out["png16"] = buffer.getvalue()
    return out


@pytest.mark.parametrize("name", ["cmyk", "gray", "png16", "png_named_jpg", "rgba"])
def test_odd_images_decode_to_rgb(tmp_path, name):
    data = odd_images()[name]
    path = tmp_path / (name + ".jpg")  # every one named .jpg: the bytes decide
    path.write_bytes(data)
    loader = DetectionLoader(SampleListSource([Sample(str(path), [[10, 8, 30, 24]], [1], 1)]),
                             T.Compose([T.Resize(SIZE)]), 1, device=DEVICE)
    (images, targets), = list(loader)
    assert not loader.skipped
    image = images[0].cpu().numpy().transpose(1, 2, 0).astype(int)
    assert image.shape == (*SIZE, 3)
    expected = np.array(Image.open(io.BytesIO(data)).convert("RGB"), dtype=int)
    if name == "png16":
        expected = np.repeat((np.array(Image.open(io.BytesIO(data)), dtype=np.int64) // 257)[..., None], 3, axis=2)
    assert np.abs(image - expected).mean() < 4, name


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("frame", ["stored", "displayed"])
def test_exif_rotated_boxes_stay_on_their_object(tmp_path, orientation, frame):
    """A red block annotated in the stored or the displayed frame: its output box covers it."""
    from detaug.formats.images import orient_boxes

    stored = np.full((40, 80, 3), 114, np.uint8)
    stored[4:14, 6:26] = RED  # stored-frame box [6, 4, 26, 14]
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "rotated.jpg"
    Image.fromarray(stored).save(path, "JPEG", quality=95, exif=exif)
    box = np.array([[6, 4, 26, 14]], np.float32)
    size = (40, 80)
    if frame == "displayed":
        box = orient_boxes(box, orientation, (40, 80))
        size = (80, 40) if orientation >= 5 else (40, 80)
    # "auto" tells the frame from the declared size when the EXIF rotation swaps the sides
    policy = "auto" if (frame == "stored" or orientation >= 5) else "apply"
    sample = Sample(str(path), box, [1], 1, size=size)
    loader = DetectionLoader(SampleListSource([sample], orientation=policy), T.Compose([T.RandomHorizontalFlip(p=0.0)]), 1, device=DEVICE)
    (images, targets), = list(loader)
    assert images[0].shape[1:] == ((80, 40) if orientation >= 5 else (40, 80))  # the displayed frame
    image = images[0].cpu().numpy().transpose(1, 2, 0).astype(int)
    red = np.argwhere((image[..., 0] > 150) & (image[..., 1] < 90))
    y0, x0 = red.min(axis=0)
    y1, x1 = red.max(axis=0) + 1
    np.testing.assert_allclose(targets[0]["boxes"][0].cpu().numpy(), [x0, y0, x1, y1], atol=1.01)


def test_orientation_ignore_delivers_the_stored_pixels(tmp_path):
    stored = np.full((40, 80, 3), 114, np.uint8)
    stored[4:14, 6:26] = RED
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    Image.fromarray(stored).save(path, "JPEG", quality=95, exif=exif)
    source = SampleListSource([Sample(str(path), [[6, 4, 26, 14]], [1], 1)], orientation="ignore")
    (images, targets), = list(DetectionLoader(source, T.Compose([T.Resize((40, 80))]), 1, device=DEVICE))
    image = images[0].cpu().numpy().transpose(1, 2, 0).astype(int)
    assert image.shape == (40, 80, 3) and (image[6:12, 8:24, 0] > 150).all()
    np.testing.assert_allclose(targets[0]["boxes"][0].cpu().numpy(), [6, 4, 26, 14])


def test_boxes_outside_an_undeclared_image_size_are_clipped_and_counted(tmp_path):
    """A sample list gives no image size: boxes are checked against the image when it is read."""
    path = good_jpeg(tmp_path / "img.jpg")  # 64 wide, 48 high
    boxes = [[10, 8, 30, 24], [50, 40, 90, 60], [70, 10, 80, 20]]  # inside, partly outside, outside
    source = SampleListSource([Sample(str(path), boxes, [1, 2, 3], 1)])
    loader = DetectionLoader(source, T.Compose([T.Resize(SIZE)]), 1, device=DEVICE)
    with pytest.warns(DataWarning) as caught:
        (_, targets), = list(loader)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2 and "box clipped to the image" in messages[0] and "outside the image dropped" in messages[1]
    np.testing.assert_allclose(targets[0]["boxes"].cpu().numpy(), [[10, 8, 30, 24], [50, 40, 64, 48]])
    assert targets[0]["labels"].tolist() == [1, 2]
    assert sorted((r["reason"], r["count"]) for r in loader.repaired) == [
        ("box clipped to the image", 1), ("box outside the image dropped", 1)]


def header_fine_body_broken(path: Path) -> Path:
    """A JPEG whose header and end marker are fine but whose Huffman table is garbage: the probe
    lets it through and DALI's decoder fails on it."""
    data = bytearray(good_jpeg(path).read_bytes())
    i = data.find(b"\xff\xc4")
    data[i + 5 : i + 25] = b"\xff" * 20
    path.write_bytes(bytes(data))
    return path


def test_a_decoder_failure_costs_only_the_culprit(tmp_path):
    broken = header_fine_body_broken(tmp_path / "broken.jpg")
    samples = [Sample(str(good_jpeg(tmp_path / f"g{i}.jpg")), [[10, 8, 30, 24]], [1], i + 1) for i in range(5)]
    samples.insert(2, Sample(str(broken), [[10, 8, 30, 24]], [1], 99))
    for epoch_runs in range(2):  # the second epoch already knows the culprit
        loader = DetectionLoader(SampleListSource(samples), RECIPE, 3, device=DEVICE)
        with pytest.warns(DataWarning, match="broken.jpg"):
            batches = list(loader) if epoch_runs == 0 else list(loader) + list(loader)
        assert all(len(targets) == 3 for _, targets in batches)
        ids = [t["image_id"] for _, targets in batches for t in targets]
        assert 99 not in ids and {1, 2, 3, 4, 5} <= set(ids)
        assert loader.skipped[0]["image_id"] == 99 and "cannot be decoded" in loader.skipped[0]["reason"]
    with pytest.raises(ImageError, match=r"broken.jpg \(image_id 99\): cannot be decoded"):
        list(DetectionLoader(SampleListSource(samples), RECIPE, 3, device=DEVICE, on_error="raise"))
    seq = DetectionSequence(SampleListSource(samples), RECIPE, 3, max_boxes=2, device=DEVICE, plan_workers=0, shuffle=False)
    with pytest.warns(DataWarning, match="broken.jpg"):
        images, targets = seq[0]
    assert len(images) == 3 and (targets["labels"][:, 0] == 1).all()
    assert [s["image_id"] for s in seq.skipped] == [99]
    # Calls at once share the pipeline: the batch failing in it is planned again without the
    # culprit, the batches in flight beside it are fed again to a new pipeline, and all come out whole.
    seq = DetectionSequence(SampleListSource(samples), RECIPE, 3, max_boxes=2, device=DEVICE, plan_workers=0,
                            shuffle=False, images_on_device=False)
    together = DetectionSequence(SampleListSource(samples), RECIPE, 3, max_boxes=2, device=DEVICE, plan_workers=0,
                                 shuffle=False, workers=4, prefetch=False, images_on_device=False)
    order = [1, 0, 1, 0, 1]
    with pytest.warns(DataWarning, match="broken.jpg"), ThreadPoolExecutor(4) as pool:
        seq[0]
        got = list(pool.map(together.__getitem__, order))
    for i, (images, targets) in zip(order, got):
        want_images, want_targets = seq[i]
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(targets["boxes"], want_targets["boxes"])
    assert {s["image_id"] for s in together.skipped} == {99}


def test_a_decoder_failure_of_a_mosaic_partner_costs_only_the_culprit(tmp_path):
    """An image DALI cannot decode (header fine) that a batch reads only as a Mosaic partner is
    found among the partners, skipped and named, like a sample; with on_error="raise" it is
    the error, named."""
    broken = header_fine_body_broken(tmp_path / "broken.jpg")
    samples = [Sample(str(good_jpeg(tmp_path / f"g{i}.jpg")), [[10, 8, 30, 24]], [1], i + 1) for i in range(8)]
    samples.insert(5, Sample(str(broken), [[10, 8, 30, 24]], [1], 99))
    recipe = T.Compose([T.Mosaic((64, 64), fill=114), T.Resize(SIZE)])
    loader = DetectionLoader(SampleListSource(samples), recipe, 3, device=DEVICE, shuffle=True, seed=1)
    plans = [loader.planner.plan(0, step) for step in range(len(loader))]
    assert any(5 in p.partner_positions and 5 not in p.positions for p in plans)  # a partner only
    with pytest.warns(DataWarning, match="broken.jpg"):
        batches = list(loader)
    assert len(batches) == 3 and all(len(targets) == 3 for _, targets in batches)
    assert 99 not in [t["image_id"] for _, targets in batches for t in targets]
    assert {s["image_id"] for s in loader.skipped} == {99}
    with pytest.raises(ImageError, match=r"broken.jpg \(image_id 99\): cannot be decoded"):
        list(DetectionLoader(SampleListSource(samples), recipe, 3, device=DEVICE, shuffle=True, seed=1, on_error="raise"))
    seq = DetectionSequence(SampleListSource(samples), recipe, 3, max_boxes=8, device=DEVICE, plan_workers=0, seed=1)
    with pytest.warns(DataWarning, match="broken.jpg"):
        got = [seq[i] for i in range(len(seq))]
    assert all(len(images) == 3 for images, _ in got) and [s["image_id"] for s in seq.skipped][:1] == [99]


def test_skipped_lists_each_image_once_per_epoch(tmp_path):
    """5 consecutive missing files: the batches that probe them for replacements do not list
    them again (issue 38: 15 entries); both adapters, two epochs, with planning workers."""
    samples = [Sample(str(good_jpeg(tmp_path / f"g{i}.jpg")), [[10, 8, 30, 24]], [1], image_id=i + 1) for i in range(7)]
    missing = [Sample(str(tmp_path / f"gone{k}.jpg"), [[10, 8, 30, 24]], [1], image_id=100 + k) for k in range(5)]
    samples[2:2] = missing
    source = SampleListSource(samples)
    want = sorted(100 + k for k in range(5))
    loader = DetectionLoader(source, RECIPE, 4, device=DEVICE, num_workers=2)
    with pytest.warns(DataWarning) as caught:
        for _ in range(2):
            assert all(len(targets) == 4 for _, targets in loader)
    loader.close()
    assert sorted(s["image_id"] for s in loader.skipped) == sorted(want * 2)  # once per image per epoch
    assert sum("gone" in str(w.message) for w in caught) == 5  # warned once per image
    seq = DetectionSequence(source, RECIPE, 4, max_boxes=2, device=DEVICE, plan_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        for _ in range(2):
            for i in range(len(seq)):
                seq[i]
            seq.on_epoch_end()
    assert sorted(s["image_id"] for s in seq.skipped) == sorted(want * 2)
