"""converters.voc2coco: the dataset-level API on small datasets made in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

import converters
from converters import report as R
from converters.coco import dumps_coco
from converters.voc2coco import ConversionError, convert, convert_splits
from tests.converters.helpers import make_voc, obj, voc_xml, write_image


def simple(tmp_path: Path, n: int = 3, **kwargs) -> Path:
    files = {f"{i:03d}.xml": voc_xml(f"{i:03d}.jpg", (40, 30), [obj("cat", (1, 1, 10, 10))])
             for i in range(n)}
    return make_voc(tmp_path / "VOC", files, {f"{i:03d}.jpg": (40, 30) for i in range(n)},
                    **kwargs)


class TestApi:
    def test_result_fields(self, tmp_path: Path) -> None:
        root = simple(tmp_path)
        result = convert(root)
        assert result.image_root == root / "JPEGImages"
        assert result.split is None
        coco = result.coco
        assert [i["id"] for i in coco["images"]] == [1, 2, 3]
        assert [a["id"] for a in coco["annotations"]] == [1, 2, 3]
        assert coco["annotations"][0] == {
            "id": 1, "image_id": 1, "category_id": 1, "bbox": [0.0, 0.0, 10.0, 10.0],
            "area": 100.0, "iscrowd": 0, "attributes": {"difficult": 0}}
        for image in coco["images"]:
            assert (result.image_root / image["file_name"]).is_file()

    def test_json_follows_edits_of_the_dict(self, tmp_path: Path) -> None:
        import json

        result = convert(simple(tmp_path))
        untouched = result.to_json()
        assert json.loads(untouched) == result.coco  # decoded on first access
        result.coco["images"][0]["file_name"] = "renamed.jpg"
        assert result.to_json() != untouched
        written = result.write_json(tmp_path / "out.json")
        assert json.loads(written.read_bytes())["images"][0]["file_name"] == "renamed.jpg"
        assert "images=3" in repr(result)

    def test_convert_splits_all_and_one(self, tmp_path: Path) -> None:
        root = simple(tmp_path, splits={"val": ["001"]})
        results = convert_splits(root, [None, "val"])
        assert list(results) == [None, "val"]
        assert results["val"].split == "val" and len(results["val"].coco["images"]) == 1
        assert len(results[None].coco["images"]) == 3
        with pytest.raises(ConversionError, match="named twice"):
            convert_splits(root, ["val", "val"])

    def test_package_exports_and_callable_module(self, tmp_path: Path) -> None:
        from converters import voc2coco

        root = simple(tmp_path)
        assert converters.convert is convert
        assert dumps_coco(voc2coco(root).coco) == dumps_coco(convert(root).coco)

    def test_alternative_layout(self, tmp_path: Path) -> None:
        root = simple(tmp_path)
        moved = tmp_path / "photos"
        (root / "JPEGImages").rename(moved)
        result = convert(annotations_dir=root / "Annotations", images_dir=moved)
        assert result.image_root == moved and len(result.coco["images"]) == 3
        assert result.report.skipped_total == 0

    def test_split_from_a_list_file_anywhere(self, tmp_path: Path) -> None:
        root = simple(tmp_path)
        listing = tmp_path / "mine.txt"
        listing.write_text("002\n000  1\n\n002\n", encoding="utf-8")  # repeat, 2nd column
        result = convert(root, split=str(listing))
        assert [i["file_name"] for i in result.coco["images"]] == ["002.jpg", "000.jpg"]
        assert result.report.images_total == 2

    def test_split_not_found_lists_available(self, tmp_path: Path) -> None:
        root = simple(tmp_path, splits={"train": ["000"], "val": ["001"], "cat_train": ["000"]})
        with pytest.raises(ConversionError, match=r"split 'trian' not found: .*available: "
                                                  r"train, val$"):
            convert(root, split="trian")

    @pytest.mark.parametrize("kwargs, message", [
        ({"coords": "pixels"}, "coords must be one of voc, raw"),
        ({"difficult": "ignore"}, "difficult must be one of keep, crowd, drop"),
        ({"workers": 0}, "workers must be a positive integer"),
    ])
    def test_bad_options(self, tmp_path: Path, kwargs: dict, message: str) -> None:
        with pytest.raises(ConversionError, match=message):
            convert(simple(tmp_path), **kwargs)

    def test_missing_folders(self, tmp_path: Path) -> None:
        with pytest.raises(ConversionError, match="annotations folder not found .*VOC2007"):
            convert(tmp_path)
        with pytest.raises(ConversionError, match="not a folder"):
            convert(tmp_path / "nope")
        with pytest.raises(ConversionError, match="images folder not found"):
            convert(simple(tmp_path), images_dir=tmp_path / "nope")

    def test_bad_labels_file_fails_first(self, tmp_path: Path) -> None:
        labels = tmp_path / "labels.txt"
        labels.write_text("cat\ncat\n", encoding="utf-8")
        with pytest.raises(ConversionError, match="labels.txt:2: duplicate label 'cat'"):
            convert(simple(tmp_path), labels=labels)

    def test_empty_dataset(self, tmp_path: Path) -> None:
        (tmp_path / "Annotations").mkdir()
        result = convert(tmp_path)
        assert result.coco["images"] == [] and result.coco["categories"] == []
        assert result.report.images_total == 0

    def test_progress_bar(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        convert(simple(tmp_path), progress=True)
        assert "voc2coco: 100%" in capsys.readouterr().err
        convert(simple(tmp_path / "2"), progress=None)  # small dataset: no bar
        assert capsys.readouterr().err == ""


class TestLabels:
    def test_voc_labels_skip_unknown_names(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg", objects=[
            obj("person", (1, 1, 5, 5)), obj("dining table", (1, 1, 5, 5))])}, {"a.jpg": (32, 24)})
        result = convert(root, labels="voc")
        assert len(result.coco["categories"]) == 20
        assert result.coco["annotations"][0]["category_id"] == 15  # person
        assert result.report.objects_skipped == {R.UNKNOWN_LABEL: 1}
        assert "'dining table'" in result.report.messages_of("object")[0].detail

    def test_list_of_names(self, tmp_path: Path) -> None:
        result = convert(simple(tmp_path), labels=["dog", "cat"])
        assert {a["category_id"] for a in result.coco["annotations"]} == {2}

    def test_discover_covers_the_whole_folder_so_splits_agree(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {
            "a.xml": voc_xml("a.jpg", objects=[obj("zebra", (1, 1, 5, 5))]),
            "b.xml": voc_xml("b.jpg", objects=[obj("ant", (1, 1, 5, 5))])},
            {"a.jpg": (32, 24), "b.jpg": (32, 24)}, splits={"train": ["a"], "val": ["b"]})
        train = convert(root, split="train")
        val = convert(root, split="val")
        assert train.coco["categories"] == val.coco["categories"]
        assert [c["name"] for c in train.coco["categories"]] == ["ant", "zebra"]
        both = convert_splits(root, ["train", "val"])
        assert dumps_coco(both["train"].coco) == dumps_coco(train.coco)
        assert dumps_coco(both["val"].coco) == dumps_coco(val.coco)


class TestImages:
    def test_any_extension_any_case(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg"), "b.xml": voc_xml("b.png")},
                        {"a.JPG": (32, 24), "b.png": (32, 24)})
        result = convert(root)
        assert [i["file_name"] for i in result.coco["images"]] == ["a.JPG", "b.png"]
        assert result.report.warnings == {}  # <filename> a.jpg is a.JPG, whatever the case

    def test_several_files_for_one_id(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.png")},
                        {"a.jpg": (32, 24), "a.png": (32, 24)})
        result = convert(root)
        assert result.coco["images"][0]["file_name"] == "a.png"  # the one <filename> names
        assert result.report.warnings[R.SEVERAL_IMAGE_FILES] == 1

    def test_fallback_to_filename(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("photo 1.jpg")}, {"photo 1.jpg": (32, 24)})
        result = convert(root)
        assert result.coco["images"][0]["file_name"] == "photo 1.jpg"
        assert result.report.skipped_total == 0

    def test_filename_fallback_never_takes_another_ids_image(self, tmp_path: Path) -> None:
        # c.xml has no c.jpg and points at a.jpg, which is a.xml's image: not merged
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg", objects=[obj("x", (1, 1, 3, 3))]),
                                   "c.xml": voc_xml("a.jpg", objects=[obj("x", (1, 1, 3, 3))])},
                        {"a.jpg": (32, 24)})
        result = convert(root)
        assert [i["file_name"] for i in result.coco["images"]] == ["a.jpg"]
        assert result.report.images_skipped == {R.IMAGE_FILE_TAKEN: 1}
        assert result.report.objects_skipped == {R.OBJECT_OF_SKIPPED_IMAGE: 1}
        assert "is the image of a" in result.report.messages_of("image")[0].detail

    def test_image_not_found(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg", objects=[obj("x", (1, 1, 3, 3))])},
                        {"b.jpg": (32, 24)})
        result = convert(root)
        assert result.report.images_skipped == {R.IMAGE_NOT_FOUND: 1}
        assert result.report.objects_total == 1 and result.coco["images"] == []

    def test_unreadable_image(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg")}, {})
        (root / "JPEGImages/a.jpg").write_bytes(b"not an image")
        result = convert(root)  # no size to be had: skipped even without verify_images
        assert result.report.images_skipped == {"not an image (unknown format)": 1}
        assert result.report.messages_of("image")[0].detail.endswith("a.jpg")

    def test_size_mismatch_uses_the_image(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg", (64, 48), [
            obj("x", (1, 1, 60, 40))])}, {"a.jpg": (32, 24)})
        result = convert(root)
        assert (result.coco["images"][0]["width"], result.coco["images"][0]["height"]) == (32, 24)
        assert result.report.warnings[R.SIZE_MISMATCH] == 1
        assert result.report.warnings[R.BOX_CLIPPED] == 1

    def test_grayscale_depth_one_is_fine(self, tmp_path: Path) -> None:
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg", depth=1)}, {})
        write_image(root / "JPEGImages/a.jpg", mode="L")
        result = convert(root)
        assert result.report.warnings == {} and len(result.coco["images"]) == 1


class TestRobustness:
    def test_duplicate_ids(self, tmp_path: Path) -> None:
        root = simple(tmp_path, n=1)
        (root / "Annotations/000.XML").write_text(voc_xml("000.jpg"), encoding="utf-8")
        result = convert(root)
        assert result.report.images_total == 2
        assert result.report.images_skipped == {R.DUPLICATE_ID: 1}

    def test_every_object_problem_is_counted(self, tmp_path: Path) -> None:
        objects = [obj("ok", (1, 1, 5, 5)), "<object><bndbox/></object>",
                   "<object><name>nobox</name></object>",
                   obj("bad", ("x", 1, 5, 5)), obj("empty", (5, 5, 3, 5)),
                   obj("outside", (50, 50, 60, 60)), obj("hard", (1, 1, 5, 5), difficult=1),
                   obj("weird", (1, 1, 5, 5), difficult=None, extra="<truncated>?</truncated>")]
        root = make_voc(tmp_path, {"a.xml": voc_xml("a.jpg", objects=objects)},
                        {"a.jpg": (32, 24)})
        result = convert(root, difficult="drop")
        report = result.report
        assert report.objects_total == 8 and report.objects_converted == 2
        assert report.objects_skipped == {R.NO_NAME: 1, R.NO_BNDBOX: 1, R.BAD_COORDINATE: 1,
                                          R.ZERO_SIZE_BOX: 1, R.BOX_OUTSIDE_IMAGE: 1,
                                          R.DIFFICULT_DROPPED: 1}
        assert report.warnings == {R.BAD_ATTRIBUTE: 1}
        assert all(m.path.endswith("a.xml") for m in report.messages)
        report.check()

    def test_parallel_equals_sequential(self, tmp_path: Path) -> None:
        root = simple(tmp_path, n=40)
        (root / "Annotations/bad.xml").write_text("<annotation>", encoding="utf-8")
        (root / "Annotations/empty.xml").write_bytes(b"")
        sequential = convert(root, workers=1)
        parallel = convert(root, workers=2)
        assert dumps_coco(parallel.coco) == dumps_coco(sequential.coco)
        assert parallel.report == sequential.report
        assert parallel.report.images_skipped == {R.MALFORMED_XML: 2}


def test_json_text_equals_json_dumps_of_the_dict(tmp_path: Path) -> None:
    """The document is assembled from texts made in the workers: check it against json.dumps
    with values that need escaping (quotes, %, unicode, backslash) and float noise."""
    pose = 'a "quoted" 100% 猫\\ pose'
    objects = [obj("cat", (1, 1, 10, 10), difficult=1, extra=f"<pose>{pose}</pose>"),
               obj("ça va", (217.62, 182.79, 256.61, 240.54), extra="<occluded>1</occluded>"),
               obj("cat", (0.5, 0.25, 3.75, 2.5), difficult=None,
                   extra="<truncated>1</truncated>")]
    root = make_voc(tmp_path, {"x%d.xml": voc_xml("x%d.jpg", (400, 300), objects)},
                    {"x%d.jpg": (400, 300)})
    for coords in ("voc", "raw"):
        result = convert(root, coords=coords, difficult="crowd")
        text = result.to_json()
        coco = result.coco
        assert dumps_coco(coco) == text
        assert coco["annotations"][0]["attributes"] == {"difficult": 1, "pose": pose}
        assert coco["annotations"][0]["iscrowd"] == 1
        assert coco["images"][0]["file_name"] == "x%d.jpg"
        assert [a["category_id"] for a in coco["annotations"]] == [1, 2, 1]


def test_large_xml_file_read_whole(tmp_path: Path) -> None:
    objects = [obj("cat", (1 + i % 20, 1, 5 + i % 20, 5)) for i in range(1500)]
    root = make_voc(tmp_path, {"big.xml": voc_xml("big.jpg", (32, 24), objects)},
                    {"big.jpg": (32, 24)})
    assert (root / "Annotations/big.xml").stat().st_size > 3 * 65536
    result = convert(root)
    assert len(result.coco["annotations"]) == 1500 and result.report.skipped_total == 0
