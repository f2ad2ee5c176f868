"""Tests of detaug.synthetic: boxes match the pixels, objects are apart, output is reproducible,
and the COCO file is read identically by pycocotools and by DALI's COCO reader."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from lxml import etree
from PIL import Image

from detaug.synthetic import (
    BACKGROUND,
    PALETTE,
    SyntheticImage,
    make_scene,
    write_coco_dataset,
    write_voc_dataset,
)

CLASSES = ("cat", "dog", "car", "person")


def _pixel_extent(image: np.ndarray, mask: np.ndarray) -> tuple[float, float, float, float]:
    """xyxy box (pixel i spans [i, i + 1)) of the True pixels of ``mask``."""
    ys, xs = np.nonzero(mask)
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def _read_voc_boxes(xml_path: Path) -> tuple[dict, list[tuple[str, tuple[float, ...]]]]:
    """(size, [(name, xyxy box)]) of a VOC file; 1-based inclusive -> continuous xyxy."""
    root = etree.parse(str(xml_path)).getroot()
    size = {k: int(root.findtext(f"size/{k}")) for k in ("width", "height", "depth")}
    objects = []
    for obj in root.iterfind("object"):
        b = {k: int(obj.findtext(f"bndbox/{k}")) for k in ("xmin", "ymin", "xmax", "ymax")}
        box = (b["xmin"] - 1.0, b["ymin"] - 1.0, float(b["xmax"]), float(b["ymax"]))
        objects.append((obj.findtext("name"), box))
    return size, objects


class TestPalette:
    def test_colours_are_far_apart_and_far_from_background(self):
        colors = np.array(PALETTE, dtype=np.float64)
        assert len(PALETTE) >= 12
        assert len(set(PALETTE)) == len(PALETTE)
        gaps = np.linalg.norm(colors[:, None] - colors[None], axis=-1)
        np.fill_diagonal(gaps, np.inf)
        assert gaps.min() >= 100
        assert np.linalg.norm(colors - np.array(BACKGROUND), axis=-1).min() >= 100


class TestMakeScene:
    def test_image_matches_objects_exactly(self):
        rng = np.random.default_rng(0)
        for _ in range(20):
            image, meta = make_scene(rng, 160, 120, 8, CLASSES)
            assert image.shape == (120, 160, 3) and image.dtype == np.uint8
            assert 1 <= len(meta.objects) <= 8
            assert len({o.color for o in meta.objects}) == len(meta.objects)
            covered = np.zeros(image.shape[:2], dtype=bool)
            for obj in meta.objects:
                mask = (image == obj.color).all(axis=-1)
                assert _pixel_extent(image, mask) == obj.box_xyxy
                x0, y0, x1, y1 = (int(v) for v in obj.box_xyxy)
                assert mask.sum() == (x1 - x0) * (y1 - y0)  # solid rectangle
                assert min(x1 - x0, y1 - y0) >= 8
                assert obj.label in CLASSES
                covered |= mask
            assert (image[~covered] == BACKGROUND).all()

    @pytest.mark.parametrize("margin", [0, 2, 5])
    def test_objects_keep_the_margin(self, margin):
        rng = np.random.default_rng(1)
        for _ in range(30):
            _, meta = make_scene(rng, 96, 96, 12, CLASSES, min_size=4, margin=margin)
            for a, b in itertools.combinations(meta.objects, 2):
                ax0, ay0, ax1, ay1 = a.box_xyxy
                bx0, by0, bx1, by1 = b.box_xyxy
                gap_x = max(bx0 - ax1, ax0 - bx1)
                gap_y = max(by0 - ay1, ay0 - by1)
                assert max(gap_x, gap_y) >= margin

    def test_same_seed_same_scene(self):
        a = make_scene(np.random.default_rng(7), 200, 150, 6, CLASSES)
        b = make_scene(np.random.default_rng(7), 200, 150, 6, CLASSES)
        c = make_scene(np.random.default_rng(8), 200, 150, 6, CLASSES)
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1] == b[1]
        assert a[1] != c[1]

    def test_min_objects_is_honoured(self):
        rng = np.random.default_rng(2)
        for _ in range(20):
            _, meta = make_scene(rng, 200, 140, 11, CLASSES, min_objects=11)
            assert len(meta.objects) == 11

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"width": 4}, "smaller than min_size"),
            ({"max_objects": len(PALETTE) + 1}, "max_objects"),
            ({"max_objects": 0}, "max_objects"),
            ({"classes": ()}, "classes"),
            ({"classes": "cat"}, "classes"),
            ({"margin": -1}, "margin"),
            ({"width": 10, "height": 10, "max_objects": 5, "min_objects": 5}, "could only place"),
        ],
    )
    def test_invalid_arguments(self, kwargs, match):
        args = {"width": 64, "height": 64, "max_objects": 3, "classes": CLASSES} | kwargs
        with pytest.raises(ValueError, match=match):
            make_scene(np.random.default_rng(0), **args)


class TestVOC:
    def test_xml_boxes_are_the_pixel_extents_of_the_objects(self, tmp_path):
        metas = write_voc_dataset(
            tmp_path, num_images=6, image_format="png", size=((120, 200), (100, 160)), seed=3
        )
        assert [m.name for m in metas] == [f"{i:06d}" for i in range(6)]
        for meta in metas:
            xml_path = tmp_path / "Annotations" / f"{meta.name}.xml"
            root = etree.parse(str(xml_path)).getroot()
            assert root.tag == "annotation"
            assert root.findtext("filename") == f"{meta.name}.png"
            assert root.findtext("segmented") == "0"
            for obj in root.iterfind("object"):
                assert obj.findtext("pose") == "Unspecified"
                assert obj.findtext("truncated") == "0" and obj.findtext("difficult") == "0"

            image = np.asarray(Image.open(tmp_path / "JPEGImages" / f"{meta.name}.png"))
            size, objects = _read_voc_boxes(xml_path)
            assert size == {"width": image.shape[1], "height": image.shape[0], "depth": 3}
            assert (meta.width, meta.height) == (image.shape[1], image.shape[0])
            assert len(objects) == len(meta.objects) >= 1
            for (name, box), obj in zip(objects, meta.objects):
                assert name == obj.label
                assert box == obj.box_xyxy
                assert _pixel_extent(image, (image == obj.color).all(axis=-1)) == box

    def test_jpeg_objects_keep_their_colours(self, tmp_path):
        metas = write_voc_dataset(tmp_path, num_images=2, size=(160, 120), seed=4)
        for meta in metas:
            image = np.asarray(Image.open(tmp_path / "JPEGImages" / f"{meta.name}.jpg"), np.int32)
            for obj in meta.objects:
                x0, y0, x1, y1 = (int(v) for v in obj.box_xyxy)
                inner = image[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1]
                assert np.abs(inner - obj.color).max() <= 24

    def test_splits_partition_the_images(self, tmp_path):
        write_voc_dataset(
            tmp_path, num_images=10, size=(64, 48), splits={"train": 0.6, "val": 0.2, "test": 0.2}
        )
        sets = {
            s: (tmp_path / "ImageSets" / "Main" / f"{s}.txt").read_text().split()
            for s in ("train", "val", "test")
        }
        assert [len(v) for v in sets.values()] == [6, 2, 2]
        assert sorted(itertools.chain(*sets.values())) == [f"{i:06d}" for i in range(10)]

    def test_same_seed_same_files(self, tmp_path):
        a = write_voc_dataset(tmp_path / "a", num_images=3, size=(80, 64), seed=5)
        b = write_voc_dataset(tmp_path / "b", num_images=3, size=(80, 64), seed=5)
        c = write_voc_dataset(tmp_path / "c", num_images=3, size=(80, 64), seed=6)
        assert a == b and a != c
        files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.*"))
        assert len(files) == 3 + 3 + 2
        for rel in files:
            if rel.suffix == ".xml":  # <folder> holds the root's name
                continue
            assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()

    def test_invalid_splits(self, tmp_path):
        with pytest.raises(ValueError, match="sum to 1"):
            write_voc_dataset(tmp_path, num_images=2, splits={"train": 0.5})
        with pytest.raises(ValueError, match="image_format"):
            write_voc_dataset(tmp_path, num_images=2, image_format="bmp")


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coco")
    write_coco_dataset(
        root, num_images=6, size=((96, 160), (80, 128)), max_objects=6, seed=11, progress=False
    )
    return root


class TestCOCO:
    def test_json_is_valid_coco(self, coco_root):
        from pycocotools.coco import COCO

        coco = COCO(str(coco_root / "annotations.json"))
        assert sorted(coco.getImgIds()) == list(range(1, 7))
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(CLASSES)
        assert {"info", "licenses"} <= set(coco.dataset)
        ann_ids = coco.getAnnIds()
        assert sorted(ann_ids) == list(range(1, len(ann_ids) + 1))
        for img in coco.loadImgs(coco.getImgIds()):
            with Image.open(coco_root / "images" / img["file_name"]) as pil:
                assert pil.format == "JPEG" and pil.size == (img["width"], img["height"])
            anns = coco.loadAnns(coco.getAnnIds(imgIds=img["id"]))
            assert len(anns) >= 1
            for ann in anns:
                x, y, w, h = ann["bbox"]
                assert ann["area"] == w * h and ann["iscrowd"] == 0
                assert 0 <= x and 0 <= y and x + w <= img["width"] and y + h <= img["height"]

    def test_boxes_cover_the_object_pixels(self, coco_root):
        data = json.loads((coco_root / "annotations.json").read_text())
        images = {img["id"]: img for img in data["images"]}
        for ann in data["annotations"]:
            image = np.asarray(
                Image.open(coco_root / "images" / images[ann["image_id"]]["file_name"]), np.int32
            )
            x, y, w, h = ann["bbox"]
            centre = image[int(y + h / 2), int(x + w / 2)]
            color = min(PALETTE, key=lambda c: np.abs(centre - c).sum())
            mask = np.linalg.norm(image - color, axis=-1) < 40  # JPEG 4:2:0 blurs the edges
            extent = np.array(_pixel_extent(image, mask))
            np.testing.assert_allclose(extent, [x, y, x + w, y + h], atol=1)

    def test_same_seed_same_json(self, tmp_path, coco_root):
        path = write_coco_dataset(
            tmp_path, num_images=6, size=((96, 160), (80, 128)), max_objects=6, seed=11,
            progress=False,
        )
        assert path == tmp_path / "annotations.json"
        assert path.read_bytes() == (coco_root / "annotations.json").read_bytes()

    def test_dali_reader_returns_the_same_boxes(self, coco_root):
        from nvidia.dali import fn, pipeline_def
        from pycocotools.coco import COCO

        coco = COCO(str(coco_root / "annotations.json"))
        n = len(coco.getImgIds())

        @pipeline_def(batch_size=n, num_threads=1, device_id=None)
        def read():
            _, boxes, labels, ids = fn.readers.coco(
                file_root=str(coco_root / "images"),
                annotations_file=str(coco_root / "annotations.json"),
                ltrb=True,
                image_ids=True,
                avoid_class_remapping=True,
            )
            return boxes, labels, ids

        pipe = read()
        pipe.build()
        boxes, labels, ids = pipe.run()
        seen = set()
        for i in range(n):
            image_id = int(np.asarray(ids[i]).reshape(-1)[0])
            seen.add(image_id)
            anns = coco.loadAnns(coco.getAnnIds(imgIds=image_id))
            expected = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)])
            np.testing.assert_array_equal(np.asarray(boxes[i]), expected.astype(np.float32))
            np.testing.assert_array_equal(
                np.asarray(labels[i]).reshape(-1), [a["category_id"] for a in anns]
            )
        assert seen == set(coco.getImgIds())

    def test_invalid_arguments(self, tmp_path):
        with pytest.raises(ValueError, match="min_objects"):
            write_coco_dataset(tmp_path, num_images=1, min_objects=5, max_objects=4, progress=False)
        with pytest.raises(ValueError, match="size"):
            write_coco_dataset(tmp_path, num_images=1, size=(0, 10), progress=False)


def test_synthetic_image_is_hashable_and_frozen():
    meta = SyntheticImage(name="x", width=1, height=1, objects=())
    hash(meta)
    with pytest.raises(AttributeError):
        meta.name = "y"  # type: ignore[misc]
