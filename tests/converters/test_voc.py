"""converters.voc: parsing one XML, on real files and on small documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from converters import report as R
from converters.voc import VocParseError, parse_voc_xml
from tests.converters.helpers import obj, voc_xml


def parse_file(path: Path):
    return parse_voc_xml(path.read_bytes())


class TestRealFiles:
    def test_voc2007_tab_indented(self, realdata: Path) -> None:
        ann = parse_file(realdata / "mmfewshot-voc2007/Annotations/000005.xml")
        assert ann.filename == "000005.jpg"
        assert (ann.width, ann.height, ann.depth) == (500, 375, 3)
        difficult = [o.attributes.get("difficult") for o in ann.objects]
        assert difficult.count(1) == 2  # two difficult chairs
        assert all(o.name == "chair" for o in ann.objects if o.attributes["difficult"] == 1)

    def test_parts_are_not_objects(self, realdata: Path) -> None:
        ann = parse_file(realdata / "mmfewshot-voc2012/Annotations/2007_000027.xml")
        assert [o.name for o in ann.objects] == ["person"]
        # the person box, not the head part that sticks out of it (part xmin 169 < 174)
        assert ann.objects[0].box == (174.0, 101.0, 349.0, 351.0)

    def test_bndbox_children_in_any_order(self, realdata: Path) -> None:
        # roboflow writes xmin, xmax, ymin, ymax
        ann = parse_file(realdata / "roboflow-cells/Annotations/000001.xml")
        assert ann.objects[0].box == (112.0, 185.0, 129.0, 198.0)
        assert ann.objects[0].attributes["occluded"] == 0

    def test_float_coords_empty_elements_and_space_in_name(self, realdata: Path) -> None:
        ann = parse_file(realdata / "xml-only-quirks/Annotations/pascal_voc4.xml")
        assert ann.depth is None and (ann.width, ann.height) == (640, 427)
        first = ann.objects[0]
        assert first.box == (217.62, 182.79, 256.61, 240.54)
        assert first.attributes == {}  # <pose/>, <truncated/>, <difficult/> are empty: absent
        assert first.has_non_integer_coords
        assert "dining table" in {o.name for o in ann.objects}
        person = ann.objects[2]
        assert person.name == "person" and person.box[1] == -207.7

    def test_whole_document_on_one_line(self, realdata: Path) -> None:
        path = realdata / "xml-only-quirks/Annotations/0_Parade_marchingband_1_5.xml"
        assert path.read_bytes().count(b"\n") <= 1
        ann = parse_file(path)
        assert len(ann.objects) == 10 and {o.name for o in ann.objects} == {"face"}
        assert ann.objects[0].box == (495.0, 177.0, 532.0, 228.0)

    def test_missing_size_and_no_objects(self, realdata: Path) -> None:
        ann = parse_file(realdata / "datumaro-voc-dataset2/Annotations/@.xml")
        assert ann.objects == [] and ann.width is None and ann.size_problem == "no <size>"
        a = parse_file(realdata / "datumaro-voc-dataset2/Annotations/a.xml")
        assert a.objects[0].box == (1.0, 2.0, 4.0, 6.0)
        assert not a.objects[0].has_non_integer_coords  # "1.0" is an integer value
        assert a.objects[0].attributes == {"truncated": 0, "occluded": 1, "difficult": 0}

    def test_wrong_depth_is_read_as_written(self, realdata: Path) -> None:
        assert parse_file(realdata / "fiber/Annotations/000001.xml").depth == 1


class TestErrors:
    def test_malformed_xml_names_line_and_column(self) -> None:
        text = b"<annotation>\n<filename>a.jpg</filename>\n<object><name>x</name>\n</annotation>"
        with pytest.raises(VocParseError) as info:
            parse_voc_xml(text)
        assert info.value.reason == R.MALFORMED_XML
        assert info.value.detail.startswith("line 4, column")

    def test_empty_file(self) -> None:
        with pytest.raises(VocParseError) as info:
            parse_voc_xml(b"")
        assert info.value.reason == R.MALFORMED_XML

    def test_binary_non_xml(self, realdata: Path) -> None:
        with pytest.raises(VocParseError) as info:
            parse_file(realdata / "traffic-signal/Annotations/desktop.ini")
        assert info.value.reason == R.MALFORMED_XML

    def test_other_root_element(self) -> None:
        with pytest.raises(VocParseError) as info:
            parse_voc_xml(b"<labelme><shape/></labelme>")
        assert info.value.reason == R.NOT_VOC and "<labelme>" in info.value.detail

    def test_entities_are_not_expanded(self) -> None:
        text = (b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
                b"<annotation><filename>&e;</filename></annotation>")
        ann = parse_voc_xml(text)
        assert ann.filename is None or "root:" not in ann.filename


class TestObjects:
    def parse_one(self, object_xml: str):
        return parse_voc_xml(voc_xml(objects=[object_xml]).encode()).objects[0]

    @pytest.mark.parametrize("value, expected", [("abc", "'abc'"), ("nan", "'nan'"),
                                                 ("inf", "'inf'"), ("", "empty")])
    def test_bad_coordinate(self, value: str, expected: str) -> None:
        o = self.parse_one(f"<object><name>cat</name><bndbox><xmin>{value}</xmin><ymin>1</ymin>"
                           "<xmax>3</xmax><ymax>4</ymax></bndbox></object>")
        assert o.box is None
        assert o.problem == (R.BAD_COORDINATE, f"'cat': <xmin> is {expected}")

    def test_missing_coordinate(self) -> None:
        o = self.parse_one("<object><name>cat</name><bndbox><xmin>1</xmin><ymin>1</ymin>"
                           "<xmax>3</xmax></bndbox></object>")
        assert o.problem == (R.BAD_COORDINATE, "'cat': <ymax> is missing")

    def test_no_name_and_no_bndbox(self) -> None:
        assert self.parse_one("<object><bndbox/></object>").problem == (R.NO_NAME, "")
        assert self.parse_one("<object><name>cat</name></object>").problem[0] == R.NO_BNDBOX

    def test_whitespace_around_values(self) -> None:
        o = self.parse_one("<object><name>\n  cat \n</name><difficult> 1 </difficult><bndbox>"
                           "<xmin> 1 </xmin><ymin>2</ymin><xmax>3</xmax><ymax>4</ymax></bndbox>"
                           "</object>")
        assert (o.name, o.box, o.attributes["difficult"]) == ("cat", (1.0, 2.0, 3.0, 4.0), 1)

    @pytest.mark.parametrize("text, value", [("1", 1), ("0", 0), ("true", 1), ("False", 0),
                                             ("1.0", 1)])
    def test_flags(self, text: str, value: int) -> None:
        assert self.parse_one(obj("cat", (1, 2, 3, 4), extra=f"<truncated>{text}</truncated>")
                              ).attributes["truncated"] == value

    def test_unreadable_flag_is_reported_not_guessed(self) -> None:
        o = self.parse_one(obj("cat", (1, 2, 3, 4), difficult=None,
                               extra="<difficult>maybe</difficult>"))
        assert "difficult" not in o.attributes
        assert o.attribute_problems == ("<difficult> is 'maybe'",)

    @pytest.mark.parametrize("size, problem", [
        ("<size><width>0</width><height>5</height></size>", "<width> is '0'"),
        ("<size><width></width><height>5</height></size>", "empty <width>"),
        ("<size><height>5</height></size>", "no <width>"),
        ("<size><width>5</width><height>-3</height></size>", "<height> is '-3'"),
    ])
    def test_size_problems(self, size: str, problem: str) -> None:
        ann = parse_voc_xml(f"<annotation>{size}</annotation>".encode())
        assert ann.size_problem == problem
        assert ann.width is None or ann.height is None
