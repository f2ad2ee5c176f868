"""The converter on every folder of ../shared/realdata (see its SOURCES.md), end to end.

Per folder: the JSON loads with pycocotools; ground truth fed back as detections gives AP = 1.0;
DALI's COCO reader (CPU) returns the JSON's boxes and decodes images of the JSON's size; the
report accounts for every XML file and every object, counted here independently with lxml.
Then one test per real-world quirk listed in the issue.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from lxml import etree

from converters import report as R
from converters.coco import dumps_coco
from converters.voc2coco import ConversionResult, convert, write_coco_json
from tests.converters.helpers import REALDATA_FOLDERS, write_image

FOLDERS = REALDATA_FOLDERS or ["(realdata absent)"]
_converted: dict[tuple[str, bool], tuple[ConversionResult, Path]] = {}


@pytest.fixture
def converted(realdata: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Callable[..., tuple[ConversionResult, Path]]:
    """Convert a folder with the default options (``verify`` = verify_images) and write its JSON,
    once per module."""

    def get(folder: str, verify: bool = False) -> tuple[ConversionResult, Path]:
        if (folder, verify) not in _converted:
            result = convert(realdata / folder, verify_images=verify)
            path = result.write_json(tmp_path_factory.mktemp("coco") / "out.json")
            _converted[folder, verify] = (result, path)
        return _converted[folder, verify]

    return get


def load_coco(path: Path):
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(path))


def count_xml(realdata: Path, folder: str) -> tuple[int, int]:
    """(XML files, objects in the XML files that parse), counted with lxml directly."""
    files = objects = 0
    for path in (realdata / folder / "Annotations").iterdir():
        if path.suffix.lower() != ".xml":
            continue
        files += 1
        try:
            objects += len(etree.parse(str(path)).getroot().findall("object"))
        except etree.XMLSyntaxError:
            pass
    return files, objects


# ---------------------------------------------------------------------------------------------
# Every folder


@pytest.mark.parametrize("folder", FOLDERS)
def test_loads_with_pycocotools(folder: str, converted) -> None:
    result, path = converted(folder)
    # the JSON assembled from per-record pieces is the dict's JSON, byte for byte
    assert path.read_bytes() == dumps_coco(result.coco) == result.to_json()
    coco = load_coco(path)
    assert len(coco.getImgIds()) == len(result.coco["images"])
    assert len(coco.getAnnIds()) == len(result.coco["annotations"])
    ids = [a["id"] for a in result.coco["annotations"]]
    assert ids == list(range(1, len(ids) + 1))  # from 1: an id 0 breaks COCOeval
    for ann in result.coco["annotations"]:
        x, y, w, h = ann["bbox"]
        image = coco.imgs[ann["image_id"]]
        assert w > 0 and h > 0 and ann["area"] == pytest.approx(w * h)
        assert 0 <= x and x + w <= image["width"] and 0 <= y and y + h <= image["height"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_report_accounts_for_every_file_and_object(folder: str, converted,
                                                   realdata: Path) -> None:
    result, _ = converted(folder)
    report = result.report
    n_files, n_objects = count_xml(realdata, folder)
    assert report.images_total == n_files
    assert report.images_converted + sum(report.images_skipped.values()) == n_files
    assert report.objects_total == n_objects
    assert report.objects_converted + sum(report.objects_skipped.values()) == n_objects
    assert report.images_converted == len(result.coco["images"])
    assert report.objects_converted == len(result.coco["annotations"])
    assert f"of {n_files}" in report.summary()


@pytest.mark.parametrize("folder", FOLDERS)
def test_ground_truth_as_detections_gives_ap_1(folder: str, converted) -> None:
    from pycocotools.cocoeval import COCOeval

    result, path = converted(folder)
    if not result.coco["annotations"]:
        pytest.skip(f"{folder}: no boxes in the output ({result.report.skipped_total} skipped, "
                    "by design: see the tests of its quirks below)")
    gt = load_coco(path)
    detections = [{"image_id": a["image_id"], "category_id": a["category_id"],
                   "bbox": a["bbox"], "score": 1.0} for a in result.coco["annotations"]]
    with contextlib.redirect_stdout(io.StringIO()):
        dt = gt.loadRes(detections)
        evaluation = COCOeval(gt, dt, "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert evaluation.stats[0] == pytest.approx(1.0)  # AP @[.5:.95]


@pytest.mark.parametrize("folder", FOLDERS)
def test_dali_reader_returns_the_json_boxes(folder: str, converted) -> None:
    result, path = converted(folder, verify=True)  # DALI must decode every image
    if not result.coco["images"] or not result.image_root.is_dir():
        pytest.skip(f"{folder}: no images to read")
    expected = dali_read(result.image_root, path, len(result.coco["images"]))
    by_image: dict[int, list[list[float]]] = {}
    for ann in result.coco["annotations"]:
        x, y, w, h = ann["bbox"]
        by_image.setdefault(ann["image_id"], []).append([x, y, x + w, y + h])
    sizes = {img["id"]: (img["height"], img["width"]) for img in result.coco["images"]}
    assert sorted(expected) == sorted(sizes)
    for image_id, (boxes, shape) in expected.items():
        want = np.array(by_image.get(image_id, []), dtype=np.float32).reshape(-1, 4)
        np.testing.assert_allclose(boxes, want, atol=1e-3)
        assert shape[:2] == sizes[image_id]  # decoded image has the JSON's size


def dali_read(image_root: Path, annotations: Path, n_images: int
              ) -> dict[int, tuple[np.ndarray, tuple[int, ...]]]:
    """{image id: (ltrb boxes, decoded shape)} from DALI's COCO reader on the CPU."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=n_images, num_threads=1, device_id=None)
    def pipeline():
        jpegs, boxes, _, ids = fn.readers.coco(
            file_root=str(image_root), annotations_file=str(annotations), ltrb=True,
            image_ids=True, skip_empty=False, random_shuffle=False, size_threshold=0.0)
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        return boxes, ids, images

    pipe = pipeline()
    pipe.build()
    boxes, ids, images = pipe.run()
    return {int(np.array(ids[i]).ravel()[0]): (np.array(boxes[i]), np.array(images[i]).shape)
            for i in range(n_images)}


# ---------------------------------------------------------------------------------------------
# Quirks of the real data, one test each (folder names as in SOURCES.md)


def test_bndbox_children_in_any_order(converted) -> None:
    result, _ = converted("roboflow-cells")  # xmin, xmax, ymin, ymax
    first = result.coco["annotations"][0]
    assert first["bbox"] == [111.0, 184.0, 18.0, 14.0]  # (112, 185)-(129, 198), 1-based
    assert first["attributes"] == {"difficult": 0, "truncated": 0, "occluded": 0,
                                   "pose": "Unspecified"}


def test_filename_that_does_not_exist(converted) -> None:
    result, _ = converted("roboflow-cells")  # <filename> 000001_jpg.rf.<hash>.jpg
    assert [i["file_name"] for i in result.coco["images"]][:2] == ["000001.jpg", "000002.jpg"]
    assert result.report.warnings[R.FILENAME_MISMATCH] == 20
    assert len(result.coco["images"]) == 20  # augmented copies of one source stay apart


def test_filename_pointing_at_another_image(converted) -> None:
    result, _ = converted("fiber")  # 000032 -> 000031.jpg, 000131 and 000132 -> 000130.jpg
    names = [i["file_name"] for i in result.coco["images"]]
    assert len(names) == len(set(names)) == 19
    assert {"000130.jpg", "000131.jpg", "000132.jpg", "000031.jpg", "000032.jpg"} <= set(names)
    mismatched = {Path(m.path).name for m in result.report.messages_of(
        "warning", R.FILENAME_MISMATCH)}
    assert mismatched == {"000032.xml", "000044.xml", "000131.xml", "000132.xml"}


def test_wrong_depth_reported_size_from_header(converted, realdata: Path) -> None:
    from PIL import Image

    result, _ = converted("fiber")  # <depth>1 but RGB JPEGs
    assert result.report.warnings[R.DEPTH_MISMATCH] == 19
    for image in result.coco["images"]:
        with Image.open(realdata / "fiber/JPEGImages" / image["file_name"]) as im:
            assert (image["width"], image["height"]) == im.size


def test_grayscale_images(converted) -> None:
    result, _ = converted("raccoon")  # raccoon-150/152/161: mode L, <depth>1
    names = {i["file_name"] for i in result.coco["images"]}
    assert {"raccoon-150.jpg", "raccoon-152.jpg", "raccoon-161.jpg"} <= names
    assert R.DEPTH_MISMATCH not in result.report.warnings  # depth 1 is right for them


def test_single_point_box_is_one_pixel_by_default(converted) -> None:
    result, _ = converted("bccd")  # BloodImage_00338 and 00343
    images = {i["file_name"]: i["id"] for i in result.coco["images"]}
    ones = [a for a in result.coco["annotations"] if a["area"] == 1.0]
    assert {a["image_id"] for a in ones} == {images["BloodImage_00338.jpg"],
                                             images["BloodImage_00343.jpg"]}
    assert result.report.skipped_total == 0


def test_single_point_box_is_skipped_and_counted_under_raw(realdata: Path) -> None:
    result = convert(realdata / "bccd", coords="raw")
    assert result.report.objects_skipped == {R.ZERO_SIZE_BOX: 2}
    messages = result.report.messages_of("object", R.ZERO_SIZE_BOX)
    assert sorted(Path(m.path).name for m in messages) == ["BloodImage_00338.xml",
                                                           "BloodImage_00343.xml"]
    assert len(result.coco["annotations"]) == 576 - 2


def test_float_and_negative_coordinates_raw(realdata: Path) -> None:
    result = convert(realdata / "xml-only-quirks", coords="raw")
    by_image = {i["file_name"]: i["id"] for i in result.coco["images"]}
    anns = [a for a in result.coco["annotations"] if a["image_id"] == by_image["pascal_voc4.jpg"]]
    assert anns[0]["bbox"] == [217.62, 182.79, 38.99, 57.75]
    person = anns[2]  # ymin -207.7: clipped, reported
    assert person["bbox"] == [388.66, 0.0, 109.41, 69.92]
    clipped = result.report.messages_of("warning", R.BOX_CLIPPED)
    assert [m.path.endswith("pascal_voc4.xml") for m in clipped] == [True]
    assert "-207.7" in clipped[0].detail
    names = {c["name"] for c in result.coco["categories"]}
    assert "dining table" in names


def test_float_coordinates_under_voc_convention_are_flagged(converted) -> None:
    result, _ = converted("xml-only-quirks")
    assert result.report.warnings[R.NON_INTEGER_VOC_COORDS] == 1
    assert "--coords raw" in result.report.messages_of(
        "warning", R.NON_INTEGER_VOC_COORDS)[0].detail


def test_whole_document_on_one_line(converted) -> None:
    result, _ = converted("xml-only-quirks")
    by_image = {i["file_name"]: i["id"] for i in result.coco["images"]}
    faces = [a for a in result.coco["annotations"]
             if a["image_id"] == by_image["0_Parade_marchingband_1_5.jpg"]]
    assert len(faces) == 10 and faces[0]["bbox"] == [494.0, 176.0, 38.0, 52.0]


def test_annotation_only_folder_is_reported(converted) -> None:
    result, _ = converted("xml-only-quirks")  # no JPEGImages/: sizes from <size>
    assert result.report.warnings[R.ANNOTATION_ONLY] == 1
    sizes = {i["file_name"]: (i["width"], i["height"]) for i in result.coco["images"]}
    assert sizes == {"pascal_voc4.jpg": (640, 427), "0_Parade_marchingband_1_5.jpg": (1024, 683)}


def test_part_children_are_not_objects(converted) -> None:
    result, _ = converted("mmfewshot-voc2012")  # 2007_000027: person with 4 parts
    image_id = next(i["id"] for i in result.coco["images"]
                    if i["file_name"] == "2007_000027.jpg")
    anns = [a for a in result.coco["annotations"] if a["image_id"] == image_id]
    assert len(anns) == 1 and anns[0]["bbox"] == [173.0, 100.0, 176.0, 251.0]
    result1, _ = converted("datumaro-voc-dataset1")  # float part coords, <actions>
    assert len(result1.coco["annotations"]) == 2


def test_difficult_kept_crowd_or_dropped(realdata: Path, converted) -> None:
    kept, _ = converted("mmfewshot-voc2007")  # 000005: two difficult chairs
    difficult = [a for a in kept.coco["annotations"] if a["attributes"]["difficult"]]
    assert len(difficult) == 2 and all(a["iscrowd"] == 0 for a in difficult)
    crowd = convert(realdata / "mmfewshot-voc2007", difficult="crowd")
    assert sum(a["iscrowd"] for a in crowd.coco["annotations"]) == 2
    dropped = convert(realdata / "mmfewshot-voc2007", difficult="drop")
    assert len(dropped.coco["annotations"]) == len(kept.coco["annotations"]) - 2
    assert dropped.report.objects_skipped == {R.DIFFICULT_DROPPED: 2}


def test_crowd_difficult_excluded_by_dali(realdata: Path, tmp_path: Path) -> None:
    from nvidia.dali import fn, pipeline_def

    result = convert(realdata / "mmfewshot-voc2007", difficult="crowd")
    path = write_coco_json(result.coco, tmp_path / "crowd.json")

    @pipeline_def(batch_size=5, num_threads=1, device_id=None)
    def pipeline():
        _, boxes, _ = fn.readers.coco(file_root=str(result.image_root),
                                      annotations_file=str(path), include_iscrowd=False,
                                      random_shuffle=False)
        return boxes

    pipe = pipeline()
    pipe.build()
    (boxes,) = pipe.run()
    assert sum(np.array(b).shape[0] for b in boxes) == len(result.coco["annotations"]) - 2


def test_non_xml_file_in_annotations(converted) -> None:
    result, _ = converted("traffic-signal")
    assert result.report.ignored == {R.NOT_XML_FILE: 1}
    assert result.report.messages_of("ignored")[0].path.endswith("desktop.ini")
    assert result.report.images_total == 10  # desktop.ini is not an XML file


def test_unicode_folder_values_and_paths(copy_realdata) -> None:
    root = copy_realdata("traffic-signal", dest="数据/交通 信号")
    (root / "Annotations/000001.xml").rename(root / "Annotations/红灯 1.xml")
    (root / "JPEGImages/000001.jpg").rename(root / "JPEGImages/红灯 1.jpg")
    result = convert(root, verify_images=True)
    assert "红灯 1.jpg" in {i["file_name"] for i in result.coco["images"]}
    path = write_coco_json(result.coco, root.parent / "输出.json")
    assert "红灯 1.jpg" in path.read_text(encoding="utf-8")
    boxes = dali_read(result.image_root, path, len(result.coco["images"]))
    assert len(boxes) == 10


def test_missing_size_read_from_image_and_xml_without_objects(copy_realdata) -> None:
    root = copy_realdata("datumaro-voc-dataset2")  # no <size>, no images upstream
    for stem, size in {"@": (7, 9), "a": (10, 8), "b": (10, 8), "c": (10, 8), "d": (10, 8)}.items():
        write_image(root / "JPEGImages" / f"{stem}.jpg", size)
    result = convert(root, labels=root / "labelmap.txt", coords="raw")
    report = result.report
    assert report.warnings[R.SIZE_FROM_IMAGE] == 5 and report.skipped_total == 0
    images = {i["file_name"]: i for i in result.coco["images"]}
    assert (images["@.jpg"]["width"], images["@.jpg"]["height"]) == (7, 9)
    assert not [a for a in result.coco["annotations"] if a["image_id"] == images["@.jpg"]["id"]]
    assert len(result.coco["categories"]) == 22  # labelmap.txt order, background first
    assert result.coco["categories"][0]["name"] == "background"


def test_missing_size_without_image_is_skipped_and_counted(converted) -> None:
    result, _ = converted("datumaro-voc-dataset2")
    assert result.report.images_skipped == {R.IMAGE_SIZE_UNKNOWN: 5}
    assert result.report.objects_skipped == {R.OBJECT_OF_SKIPPED_IMAGE: 4}
    assert "no <size>" in result.report.messages_of("image")[0].detail


def test_split_entry_without_xml(realdata: Path) -> None:
    result = convert(realdata / "datumaro-voc-dataset1", split="test")
    assert result.report.images_skipped == {R.NO_XML_FOR_SPLIT_ENTRY: 1}
    message = result.report.messages_of("image")[0]
    assert message.path.endswith("test.txt") and "2007_000002" in message.detail
    train = convert(realdata / "datumaro-voc-dataset1", split="train")
    assert len(train.coco["images"]) == 1 and train.report.skipped_total == 0


def test_truncated_jpeg(realdata: Path, converted) -> None:
    unchecked, _ = converted("damse-truncated-jpeg")  # header is fine: kept, with a warning
    assert [(i["width"], i["height"]) for i in unchecked.coco["images"]] == [(353, 500)]
    assert unchecked.report.warnings == {R.IMAGE_PROBLEM_KEPT: 1}
    warning = unchecked.report.messages_of("warning")[0]
    assert warning.path.endswith("000001.xml")
    assert warning.detail.endswith("000001.jpg: truncated JPEG (no end-of-image marker)")
    verified, _ = converted("damse-truncated-jpeg", verify=True)  # what the loader skips
    assert verified.report.images_skipped == {"truncated JPEG (no end-of-image marker)": 1}
    assert verified.report.messages_of("image")[0].detail.endswith("JPEGImages/000001.jpg")


def test_malformed_xml_reported_with_line_and_skipped(copy_realdata) -> None:
    root = copy_realdata("kangaroo")
    path = root / "Annotations/00006.xml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: len(text) // 2], encoding="utf-8")  # cut, like a crashed writer
    result = convert(root)
    assert result.report.images_skipped == {R.MALFORMED_XML: 1}
    message = result.report.messages_of("image")[0]
    assert message.path.endswith("00006.xml") and message.detail.startswith("line ")
    assert len(result.coco["images"]) == 11


def test_same_input_same_bytes(realdata: Path, tmp_path: Path) -> None:
    first = write_coco_json(convert(realdata / "bccd").coco, tmp_path / "1.json").read_bytes()
    second = write_coco_json(convert(realdata / "bccd", workers=2).coco,
                             tmp_path / "2.json").read_bytes()
    assert first == second
    assert json.loads(first)["images"][0]["file_name"] == "BloodImage_00000.jpg"


def test_every_category_used_in_real_data(converted) -> None:
    result, _ = converted("bccd")
    used = Counter(a["category_id"] for a in result.coco["annotations"])
    assert [c["name"] for c in result.coco["categories"]] == ["Platelets", "RBC", "WBC"]
    assert set(used) == {1, 2, 3}


@pytest.fixture(autouse=True, scope="module")
def _forget_conversions():
    yield
    _converted.clear()
