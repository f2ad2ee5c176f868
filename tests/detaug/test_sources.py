"""Sources: SampleListSource's checks and image kinds, the Source API, VocSource."""

import io
import math
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detaug.errors import DatasetError, DataWarning
from detaug.formats import validation as v
from detaug.formats.samples import CheckedSamples, Source
from detaug.sources import ORIENTATIONS, Sample, SampleListSource, VocSource, YoloSource, check_samples

REALDATA = Path(__file__).resolve().parents[3] / "shared" / "realdata"


def jpeg_bytes(h=20, w=30, mode="RGB"):
    buffer = io.BytesIO()
    Image.new(mode, (w, h), 128).save(buffer, "JPEG")
    return buffer.getvalue()


def build(samples, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        return SampleListSource(samples, **kwargs)


def rejects(samples, reason, *fragments, **kwargs):
    with pytest.raises(DatasetError) as info:
        build(samples, **kwargs)
    assert reason in info.value.report.errors, str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return info.value


# -- image kinds --------------------------------------------------------------------------------------

def test_encoded_bytes_of_every_kind():
    data = jpeg_bytes()
    kinds = [data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)]
    source = build([Sample(k, [[1, 1, 5, 5]], [1], i + 1) for i, k in enumerate(kinds)])
    assert not source.decoded
    for i in range(len(kinds)):
        loaded, _, _, image_id = source.load(i)
        assert loaded.dtype == np.uint8 and loaded.ndim == 1 and loaded.tobytes() == data
        assert image_id == i + 1
    pickle.loads(pickle.dumps(source))  # memoryviews were copied: the source goes to workers
    assert source.file_of(3) == f"sample 3 ({len(data)} bytes)"


def test_one_dimensional_uint8_is_encoded_never_grayscale():
    data = np.frombuffer(jpeg_bytes(), np.uint8)
    source = build([Sample(data)])
    assert not source.decoded
    assert source.load(0)[0].shape == data.shape  # no AxisError, no [L, 1, 3] "image"


def test_decoded_arrays_rgb_and_grayscale():
    rgb = np.zeros((6, 8, 3), np.uint8)
    gray = np.full((6, 8), 7, np.uint8)
    source = build([Sample(rgb, [[0, 0, 4, 4]], [2]), Sample(gray, [[1, 1, 3, 3]], [2])])
    assert source.decoded
    loaded = source.load(1)[0]
    assert loaded.shape == (6, 8, 3) and (loaded == 7).all()
    assert source.file_of(0) == "sample 0 (array (6, 8, 3))"


@pytest.mark.parametrize("array", [np.zeros((6, 8, 3), np.float32), np.zeros((6, 8, 4), np.uint8),
                                   np.zeros((6, 8, 1), np.uint8), np.zeros(5, np.int16), np.zeros((0, 8), np.uint8)])
def test_unusable_arrays(array):
    rejects([Sample(array)], v.MALFORMED_IMAGE, "sample 0")


def test_decoded_and_encoded_do_not_mix():
    rejects([Sample(np.zeros((4, 4, 3), np.uint8)), Sample(jpeg_bytes())], v.MALFORMED_IMAGE, "mix")


def test_wrong_python_types_are_type_errors():
    with pytest.raises(TypeError):
        SampleListSource([Sample(12345)])
    with pytest.raises(TypeError, match="sample 0: a tuple sample"):
        SampleListSource([("a.jpg", [])])
    with pytest.raises(TypeError):
        SampleListSource([{"image": "a.jpg", "bbox": []}])
    with pytest.raises(TypeError):
        SampleListSource("a.jpg")


def test_empty_list():
    rejects([], v.NO_IMAGES, "empty")


# -- labels -------------------------------------------------------------------------------------------

def test_big_labels_are_errors_not_truncated():
    err = rejects([Sample("a.jpg", [[0, 0, 1, 1]], [2**40], 3)], v.LABEL_RANGE, "a.jpg (image_id 3)", str(2**40))
    assert isinstance(err, ValueError)
    rejects([Sample("a.jpg", [[0, 0, 1, 1]], np.array([2**63], np.uint64), 3)], v.LABEL_RANGE)
    rejects([Sample("a.jpg", [[0, 0, 1, 1]], [2**70], 3)], v.LABEL_RANGE)


def test_negative_labels_are_errors():
    rejects([Sample("a.jpg", [[0, 0, 1, 1]], [-1], 3)], v.NEGATIVE_LABEL, "a.jpg (image_id 3): negative label: label -1")


@pytest.mark.parametrize("labels", [["cat"], [1.5], [True], [math.nan], [None]])
def test_malformed_labels(labels):
    rejects([Sample("a.jpg", [[0, 0, 1, 1]], labels, 3)], v.MALFORMED_LABEL)


def test_labels_are_int64():
    source = build([Sample(b"jpeg", [[0, 0, 1, 1], [0, 0, 2, 2]], np.array([1.0, 2**31 - 1]), 3)])
    assert source.samples[0].labels.dtype == np.int64
    assert source.samples[0].labels.tolist() == [1, 2**31 - 1]
    assert source.load(0)[2].dtype == np.int64


def test_unknown_categories():
    rejects([Sample("a.jpg", [[0, 0, 1, 1]], [5], 3)], v.UNKNOWN_CATEGORY, "labels [5]", categories={1: "a"})
    assert build([Sample("a.jpg", [[0, 0, 1, 1]], [1], 3)], categories={1: "a"}).categories == {1: "a"}
    rejects([Sample("a.jpg")], v.NEGATIVE_LABEL, categories={-1: "pad"})


# -- boxes --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e39])
def test_non_finite_boxes_are_errors(bad):
    err = rejects([Sample("a.jpg", [[0, 0, 5, 5], [1, 1, bad, 4]], [1, 2], 4, size=(10, 10))],
                  v.NON_FINITE, "a.jpg (image_id 4, box 1)")
    assert "image edge" not in str(err)


@pytest.mark.parametrize("boxes", [[[1, 2, 3]], np.zeros(8), [["0", "0", "1", "1"]], np.ones((1, 4), bool),
                                   [[1, 2], [3, 4, 5, 6]], "0 0 1 1"])
def test_malformed_boxes(boxes):
    rejects([Sample("a.jpg", boxes, [1], 4)], v.MALFORMED_BOX)


def test_box_label_count_mismatch():
    with pytest.raises(ValueError, match="2 boxes but 1 labels"):
        SampleListSource([{"image": b"x", "boxes": np.zeros((2, 4)), "labels": [1]}])


def test_one_box_as_a_flat_list_and_no_boxes():
    source = build([Sample("a.jpg", [1, 2, 3, 4], 7, 1), Sample("b.jpg", [], [], 2)])
    assert source.samples[0].boxes.shape == (1, 4) and source.samples[0].labels.tolist() == [7]
    assert source.samples[1].boxes.shape == (0, 4) and source.samples[1].boxes.dtype == np.float32


def test_repairs_with_a_declared_size():
    boxes = [[-5, 0, 10, 10], [2, 2, 2, 8], [50, 50, 60, 60], [1, 1, 4, 4]]
    with pytest.warns(DataWarning, match="box clipped"):
        source = SampleListSource([Sample("a.jpg", boxes, [1, 2, 3, 4], 9, size=(20, 30))])
    s = source.samples[0]
    np.testing.assert_array_equal(s.boxes, [[0, 0, 10, 10], [1, 1, 4, 4]])
    assert s.labels.tolist() == [1, 4] and s.size == (20, 30)
    assert source.report.repairs == {v.BOX_CLIPPED: 1, v.EMPTY_BOX: 1, v.BOX_OUTSIDE: 1}
    assert "a.jpg (image_id 9, box 2)" in source.report.summary()


def test_decoded_arrays_are_their_own_declared_size():
    with pytest.warns(DataWarning):
        source = SampleListSource([Sample(np.zeros((10, 20, 3), np.uint8), [[15, 5, 25, 15]], [1])])
    np.testing.assert_array_equal(source.samples[0].boxes, [[15, 5, 20, 10]])
    rejects([Sample(np.zeros((10, 20, 3), np.uint8), size=(20, 10))], v.BAD_SIZE, "array is (10, 20)")


def test_encoded_without_size_are_not_clipped():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        source = SampleListSource([Sample(jpeg_bytes(), [[-5, -5, 500, 500]], [1])])
    np.testing.assert_array_equal(source.samples[0].boxes, [[-5, -5, 500, 500]])
    assert source.report.total == 1  # the ids note only


@pytest.mark.parametrize("size", [(0, 10), (-1, 10), (10,), "10x10", (math.nan, 3), (2**31, 3), (1.5, 3)])
def test_invalid_sizes(size):
    rejects([Sample("a.jpg", size=size)], v.BAD_SIZE, "a.jpg")


# -- ids and files ------------------------------------------------------------------------------------

def test_ids_default_to_positions():
    source = build([Sample("a.jpg"), Sample("b.jpg")])
    assert [s.image_id for s in source.samples] == [1, 2]
    assert source.report.notes == {v.IDS_ASSIGNED: 1}


def test_duplicate_ids_and_files():
    rejects([Sample("a.jpg", image_id=1), Sample("b.jpg", image_id=1)], v.DUPLICATE_IMAGE_ID, "b.jpg (image_id 1)")
    rejects([Sample("dir/a.jpg", image_id=1), Sample("dir/./a.jpg", image_id=2)], v.DUPLICATE_FILE, "also sample 0")
    build([Sample(b"same", image_id=1), Sample(b"same", image_id=2)])  # bytes are not files


@pytest.mark.parametrize("image_id", ["1", None, 1.5, 2**63, True])
def test_bad_ids(image_id):
    rejects([Sample("a.jpg", image_id=image_id)], v.BAD_IMAGE_ID)


# -- the source API -----------------------------------------------------------------------------------

def test_source_api(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(jpeg_bytes())
    samples = [Sample(path, [[1, 1, 5, 5]], [1], 5), {"image": str(tmp_path / "gone.jpg"), "image_id": 6}]
    source = build(samples, categories={1: "one"}, orientation="apply")
    assert len(source) == 2 and source.orientation == "apply" and source.to_sample_list() is source
    assert source.file_of(0) == str(path) and "image_id 6" in source.describe(1)
    data, _, _, image_id = source.load(0)
    assert data.tobytes() == path.read_bytes() and image_id == 5
    with pytest.raises(OSError, match="gone.jpg"):
        source.load(1)
    assert samples[0].boxes == [[1, 1, 5, 5]]  # the caller's samples are not changed
    assert set(ORIENTATIONS) == {"auto", "apply", "ignore"}
    with pytest.raises(ValueError, match="orientation"):
        build(samples, orientation="exif")

    assert isinstance(source, Source)


def test_checked_samples_build_a_source_as_they_are(tmp_path):
    """check_samples runs the checks into the report given (a parser's own, with its findings);
    SampleListSource takes CheckedSamples without checking again or finishing the report."""
    report = v.Report("my folder")
    report.add(v.SIZE_NOT_DECLARED, "my folder: a.txt", detail="a parser's finding")
    samples = [Sample(np.zeros((10, 20, 3), np.uint8), [[-5, 1, 8, 4], [30, 1, 40, 4]], [2, 3], 7)]
    checked = check_samples(samples, {2: "two", 3: "three"}, report=report)
    assert isinstance(checked, CheckedSamples) and checked.report is report and checked.field_specs == {}
    assert (report.images, report.boxes) == (1, 1)
    assert report.counts == {v.SIZE_NOT_DECLARED: 1, v.BOX_CLIPPED: 1, v.BOX_OUTSIDE: 1}
    assert checked.samples[0].boxes.tolist() == [[0, 1, 8, 4]] and checked.samples[0].labels.tolist() == [2]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # not finished here: the caller says it once
        source = SampleListSource(checked, orientation="ignore")
    assert source.samples is checked.samples and source.report is report and source.decoded
    assert source.categories == {2: "two", 3: "three"} and source.orientation == "ignore"
    with pytest.raises(TypeError, match="carry their categories"):
        SampleListSource(checked, {2: "two"})
    with pytest.raises(DatasetError, match="unknown category id"):
        check_samples(samples, {2: "two"})


# -- VocSource ----------------------------------------------------------------------------------------

def write_voc(root, boxes, size=(40, 60)):
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    Image.new("RGB", (size[1], size[0])).save(root / "JPEGImages" / "img1.jpg")
    objects = "".join(
        f"<object><name>{name}</name><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin>"
        f"<xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>" for name, b in boxes)
    (root / "Annotations" / "img1.xml").write_text(
        f"<annotation><filename>img1.jpg</filename><size><width>{size[1]}</width>"
        f"<height>{size[0]}</height><depth>3</depth></size>{objects}</annotation>")


def test_voc_source_attaches_both_reports(tmp_path):
    write_voc(tmp_path, [("cat", (5, 5, 20, 20)), ("dog", (10, 10, 90, 30))])
    with pytest.warns(DataWarning, match="1 box clipped to the image"):  # the dog: 90 > 60
        source = VocSource(tmp_path)
    assert len(source) == 1 and source.samples[0].size == (40, 60)
    assert set(source.categories.values()) == {"cat", "dog"}
    assert source.report.conversion is source.conversion_report
    assert "conversion:" in source.report.summary() and "1 images" in source.report.summary()
    assert source.report.as_dict()["conversion"]["images_converted"] == 1
    s = source.samples[0]
    assert s.labels.dtype == np.int64 and (s.boxes[:, 2] <= 60).all()


@pytest.mark.skipif(not REALDATA.is_dir(), reason=f"real data not found at {REALDATA}")
@pytest.mark.parametrize("name", sorted(p.name for p in REALDATA.iterdir() if p.is_dir()) if REALDATA.is_dir() else [])
def test_voc_source_on_real_data(name):
    try:
        source = VocSource(REALDATA / name)
    except DatasetError as err:
        assert "conversion:" in str(err)  # e.g. a folder without images: said, with the converter's counts
        return
    for s in source.samples:
        assert s.boxes.dtype == np.float32 and s.labels.dtype == np.int64 and np.isfinite(s.boxes).all()
        if s.size is not None:
            h, w = s.size
            assert (s.boxes >= 0).all() and (s.boxes[:, [0, 2]] <= w).all() and (s.boxes[:, [1, 3]] <= h).all()
        assert os.path.basename(s.image).endswith((".jpg", ".jpeg", ".png", ".JPG", ".PNG"))
    assert source.report.conversion is not None and not source.report.errors


def broken_voc(root: Path) -> dict[str, Path]:
    """A synthetic VOC folder of 6 images: 000002.jpg deleted, 000003.jpg emptied (issue 38)."""
    from detaug.synthetic import write_voc_dataset

    write_voc_dataset(root, num_images=6, size=(64, 48), max_objects=2, splits={"train": 1.0})
    images = root / "JPEGImages"
    (images / "000002.jpg").unlink()
    (images / "000003.jpg").write_bytes(b"")
    return {"missing": images / "000002.jpg", "empty": images / "000003.jpg"}


def test_voc_source_keeps_unreadable_images_for_the_loader_to_name(tmp_path):
    """A missing and an empty image are kept as CocoSource keeps them: the loader names them
    (DataWarning with file and image id, also under -W always) and lists them once each in
    loader.skipped; every other image keeps the id voc2coco gives it."""
    import detaug.transforms as T
    from converters.voc2coco import convert
    from detaug.torch import DetectionLoader

    bad = broken_voc(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # nothing to say when built: the loader says it
        source = VocSource(tmp_path)
    assert len(source) == 6
    coco_ids = {i["file_name"]: i["id"] for i in convert(tmp_path).coco["images"]}
    ids = {Path(s.image).name: s.image_id for s in source.samples}
    assert {name: ids[name] for name in coco_ids} == coco_ids  # the converted images: voc2coco's ids
    assert ids["000002.jpg"] == 5 and ids["000003.jpg"] == 6  # the kept ones: after them
    assert source.samples[2].size == (48, 64) and len(source.samples[2].boxes) >= 1  # in the <size> frame
    loader = DetectionLoader(source, T.Compose([T.Resize((32, 32))]), 4, device="cpu", num_threads=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [targets for _, targets in loader]
    loader.close()
    assert [len(t) for t in batches] == [4, 2]  # replaced by the next readable sample
    assert 5 not in [t["image_id"] for b in batches for t in b] and 6 not in [t["image_id"] for b in batches for t in b]
    skipped = {s["file"]: s for s in loader.skipped}
    assert len(loader.skipped) == 2 and set(skipped) == {str(p) for p in bad.values()}
    assert skipped[str(bad["missing"])]["image_id"] == 5 and "No such file" in skipped[str(bad["missing"])]["reason"]
    assert skipped[str(bad["empty"])]["image_id"] == 6 and "empty" in skipped[str(bad["empty"])]["reason"]
    messages = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert any(str(bad["missing"]) in m and "image_id 5" in m for m in messages)
    assert any(str(bad["empty"]) in m and "image_id 6" in m for m in messages)


def test_voc_source_with_verify_images_leaves_them_out_and_says_so(tmp_path):
    bad = broken_voc(tmp_path)
    with pytest.warns(DataWarning, match=r"left out 2 images \(1 empty file, 1 image file not found; e\.g\. .*000002"):
        source = VocSource(tmp_path, verify_images=True)
    assert len(source) == 4 and str(bad["missing"]) not in [s.image for s in source.samples]


def test_voc_source_counts_and_warns_the_boxes_the_converter_repaired(tmp_path):
    """Boxes the converter clipped, or left out for having no area, are repairs of the source's
    report (file, image id, object), said once when it is built (issue 38: not warned)."""
    write_voc(tmp_path, [("cat", (5, 5, 20, 20)), ("dog", (10, 10, 90, 30)), ("dog", (70, 5, 80, 9)),
                         ("cat", (7, 7, 6, 9))], size=(40, 60))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = VocSource(tmp_path)
    messages = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert len(messages) == 1, messages
    assert "1 box clipped to the image" in messages[0] and "1 box outside the image dropped" in messages[0]
    assert "1 empty box dropped" in messages[0]
    assert source.report.repairs == {v.BOX_CLIPPED: 1, v.BOX_OUTSIDE: 1, v.EMPTY_BOX: 1}
    clipped = source.report.examples[v.BOX_CLIPPED][0]
    assert clipped.image_id == 1 and clipped.file.endswith("img1.jpg") and "object 2" in clipped.detail
    assert len(source.samples[0].boxes) == 2 and source.samples[0].boxes[1].tolist() == [9, 9, 60, 30]


def test_voc_source_warns_what_the_conversion_left_out(tmp_path):
    """An XML that does not parse and objects whose label is not in ``labels`` are not silent."""
    write_voc(tmp_path, [("cat", (5, 5, 20, 20)), ("dog", (10, 10, 30, 30))])
    (tmp_path / "Annotations" / "img2.xml").write_text("<annotation><object>")
    with pytest.warns(DataWarning) as caught:
        source = VocSource(tmp_path, labels=["cat"])
    message = " ".join(str(w.message) for w in caught)
    assert "left out 1 image (1 malformed XML; e.g. " in message and "img2.xml" in message
    assert "1 object (1 label not in the labels list; e.g. " in message and "'dog'" in message
    assert len(source) == 1 and source.samples[0].labels.tolist() == [1]


# -- YoloSource ---------------------------------------------------------------------------------------

def write_yolo(root, lines, size=(20, 40), exif_orientation=None):
    """A YOLO folder of one JPEG ``a.jpg`` of ``size`` (h, w) with ``lines`` as its label file."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    exif = Image.Exif()
    if exif_orientation is not None:
        exif[0x0112] = exif_orientation
    Image.new("RGB", (size[1], size[0]), 100).save(root / "images" / "a.jpg", exif=exif)
    (root / "labels" / "a.txt").write_text("".join(line + "\n" for line in lines))
    (root / "classes.txt").write_text("cat\ndog\n")
    return root


def test_yolo_source_places_boxes_on_the_image_and_counts_repairs(tmp_path):
    write_yolo(tmp_path, ["1 0.5 0.5 0.5 0.5", "0 0.95 0.5 0.2 0.2", "0 1.5 0.5 0.2 0.2", "1 0.5 0.5 0 0.3"])
    with pytest.warns(DataWarning, match=r"\(YOLO\): 1 box clipped to the image, 1 box outside the image dropped, "
                                         r"1 empty box dropped"):
        source = YoloSource(tmp_path)
    sample = source.samples[0]
    assert isinstance(source, Source) and source.categories == {0: "cat", 1: "dog"} and source.orientation == "apply"
    assert sample.size == (20, 40) and sample.image_id == 1 and source.file_of(0) == str(tmp_path / "images" / "a.jpg")
    assert sample.boxes.tolist() == [[10, 5, 30, 15], [34, 8, 40, 12]] and sample.labels.tolist() == [1, 0]
    assert source.report.images == 1 and source.report.boxes == 2


def test_yolo_source_reads_the_displayed_frame_of_an_exif_rotated_image(tmp_path):
    write_yolo(tmp_path, ["0 0.25 0.5 0.5 1.0"], size=(20, 40), exif_orientation=6)  # displayed 40 x 20
    assert YoloSource(tmp_path).samples[0].boxes.tolist() == [[0, 0, 10, 40]]
    stored = YoloSource(tmp_path, orientation="ignore").samples[0]
    assert stored.size == (20, 40) and stored.boxes.tolist() == [[0, 0, 20, 20]]


def test_yolo_source_keeps_an_unreadable_image_without_its_boxes_and_says_so(tmp_path):
    write_yolo(tmp_path, ["0 0.5 0.5 0.5 0.5"])
    (tmp_path / "images" / "a.jpg").write_bytes(b"not an image")
    source = YoloSource(tmp_path)
    assert len(source) == 1 and source.samples[0].boxes.shape == (0, 4) and source.samples[0].size is None
    assert source.report.notes == {v.BOXES_NOT_PLACED: 1}
    assert "not an image (unknown format): the 1 boxes of" in str(source.report.examples[v.BOXES_NOT_PLACED][0])
