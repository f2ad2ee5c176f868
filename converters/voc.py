"""Parse one Pascal VOC annotation XML into plain Python values, as written in the file.

Nothing here converts coordinates: :attr:`VocObject.box` holds ``(xmin, ymin, xmax, ymax)``
exactly as written (floats), in whatever convention the writer used. The VOC devkit's convention
is 1-based inclusive pixel indices (pixel ``i`` of the devkit is pixel ``i - 1`` of COCO, which
spans ``[i - 1, i)``); :mod:`converters.boxes` turns them into COCO boxes.

What counts as an object: the ``<object>`` children of ``<annotation>`` only. ``<part>`` elements
(inside an ``<object>``) are parts of that object, not objects. ``<bndbox>`` children may come in
any order. Empty elements (``<difficult/>``) count as absent.

Numbers must be finite and plausible: a coordinate, width or height that is NaN, infinite, or
at or beyond :data:`ABSURD` in absolute value (``1e200``), and a ``<size>`` whose width * height
reaches :data:`detaug.formats.images.MAX_PIXELS`, are reported, never used.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from lxml import etree

from converters import report as R
from detaug.formats.size_limits import MAX_PIXELS

#: A coordinate or a side at or beyond this (in absolute value) is absurd: no image that the
#: loader accepts has a side that long (its width * height would reach MAX_PIXELS).
ABSURD = float(MAX_PIXELS)
#: Most ``<object>`` elements of one annotation file (real VOC files hold a few dozen); a file
#: with more is skipped with reason :data:`TOO_MANY_OBJECTS` (docs/security.md).
MAX_OBJECTS = 10_000
TOO_MANY_OBJECTS = "too many objects"

#: The attributes carried over to COCO as integers (VOC flags) and as strings.
FLAG_ATTRIBUTES = ("difficult", "truncated", "occluded")
TEXT_ATTRIBUTES = ("pose",)

_FLAG_SET = frozenset(FLAG_ATTRIBUTES)
_FLAG_WORDS = {"0": 0, "1": 1, "false": 0, "true": 1, "no": 0, "yes": 1}
_COORDS = ("xmin", "ymin", "xmax", "ymax")
_COORD_SET = frozenset(_COORDS)

# One parser per process: no entity expansion, no network, no DTD loading (untrusted input).
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                          remove_comments=True, remove_pis=True)


class VocParseError(Exception):
    """The file is not a usable VOC annotation. ``reason`` is one of the report's reasons."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class VocObject(NamedTuple):
    """One ``<object>``.

    ``box`` is ``(xmin, ymin, xmax, ymax)`` as written, or ``None`` when ``problem`` says why
    there is no usable box. ``problem`` is ``(reason, detail)`` for an object that cannot be
    converted (no name, no ``<bndbox>``, a coordinate that is not a finite number).
    ``attributes`` holds ``difficult``/``truncated``/``occluded`` (ints) and ``pose`` (str)
    when the XML states them; ``attribute_problems`` the values that could not be read.
    (NamedTuples, not dataclasses: they cross process boundaries as plain tuples, cheaply.)
    """

    name: str | None
    box: tuple[float, float, float, float] | None
    problem: tuple[str, str] | None
    attributes: dict[str, int | str]
    attribute_problems: tuple[str, ...]

    @property
    def has_non_integer_coords(self) -> bool:
        """True when a coordinate has a fractional part (e.g. ``217.62``; ``1.0`` is integer)."""
        box = self.box
        return box is not None and not (box[0].is_integer() and box[1].is_integer()
                                        and box[2].is_integer() and box[3].is_integer())


class VocAnnotation(NamedTuple):
    """One annotation file: ``<filename>``, ``<size>`` and the objects.

    ``width``/``height``/``depth`` are ``None`` when missing, empty, unreadable or not positive;
    ``size_problem`` then says what was wrong with ``<size>`` (``None`` when width and height
    are fine).
    """

    filename: str | None
    width: int | None
    height: int | None
    depth: int | None
    objects: list[VocObject]
    size_problem: str | None


def parse_voc_xml(data: bytes) -> VocAnnotation:
    """Parse the bytes of one VOC XML file.

    Raises :class:`VocParseError` with reason ``malformed XML`` (the message gives the line and
    column), ``not a VOC annotation`` (the root element is not ``<annotation>``) or ``too many
    objects`` (more than :data:`MAX_OBJECTS` ``<object>`` elements).
    """
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError as err:
        line, column = err.position if err.position else (err.lineno, 0)
        raise VocParseError(R.MALFORMED_XML, f"line {line}, column {column}: {err.msg}") from None
    if root is None:  # lxml returns None for some empty documents
        raise VocParseError(R.MALFORMED_XML, "line 1, column 0: document is empty")
    if root.tag != "annotation":
        raise VocParseError(R.NOT_VOC, f"root element is <{root.tag}>, expected <annotation>")

    # One walk over the children (much faster than find() per field with lxml).
    filename = None
    size = None
    objects: list[VocObject] = []
    for child in root:
        tag = child.tag
        if tag == "object":
            if len(objects) >= MAX_OBJECTS:
                raise VocParseError(TOO_MANY_OBJECTS, f"more than {MAX_OBJECTS} <object> elements "
                                    "(converters.voc.MAX_OBJECTS)")
            objects.append(_parse_object(child))
        elif tag == "filename" and filename is None:
            filename = _strip(child.text)
        elif tag == "size" and size is None:
            size = child
    width = height = depth = None
    if size is None:
        size_problem: str | None = "no <size>"
    else:
        fields = _child_texts(size)
        width, problem_w = _positive_int(fields, "width")
        height, problem_h = _positive_int(fields, "height")
        depth, _ = _positive_int(fields, "depth")
        size_problem = problem_w or problem_h
        if width is not None and height is not None and width * height >= MAX_PIXELS:
            size_problem = (f"<size> {width}x{height} is absurd "
                            "(width * height >= 30000 * 30000)")
            width = height = None
    return VocAnnotation(filename, width, height, depth, objects, size_problem)


def _strip(text: str | None) -> str | None:
    """Stripped text; ``None`` for missing or blank text."""
    if text is None:
        return None
    text = text.strip()
    return text or None


def _child_texts(element: etree._Element) -> dict[str, str | None]:
    """``{tag: stripped text}`` of the element children (the first of each tag wins)."""
    texts: dict[str, str | None] = {}
    for child in element:
        tag = child.tag
        if tag not in texts:
            texts[tag] = _strip(child.text)
    return texts


def _positive_int(fields: dict[str, str | None], tag: str) -> tuple[int | None, str | None]:
    """``fields[tag]`` as a positive int (``"500.0"`` is accepted), or why not."""
    if tag not in fields:
        return None, f"no <{tag}>"
    text = fields[tag]
    if text is None:
        return None, f"empty <{tag}>"
    try:
        value = float(text)
    except ValueError:
        return None, f"<{tag}> is {text!r}"
    if not 0 < value < ABSURD or not value.is_integer():  # NaN fails the comparison too
        return None, f"<{tag}> is {text!r}"
    return int(value), None


def _parse_object(element: etree._Element) -> VocObject:
    # Hot loop (one call per object): inlined on purpose, measured by converters.bench.
    name = None
    bndbox = None
    attributes: dict[str, int | str] = {}
    attribute_problems: tuple[str, ...] = ()
    for child in element:
        tag = child.tag
        if tag == "bndbox":
            if bndbox is None:
                bndbox = child
            continue
        if tag == "name":
            if name is None:
                text = child.text
                name = (text.strip() or None) if text is not None else None
        elif tag in _FLAG_SET:
            text = child.text
            text = text.strip() if text is not None else ""
            if text and tag not in attributes:
                value = _FLAG_WORDS.get(text)
                if value is None:
                    value = _flag(text)
                if value is None:
                    attribute_problems += (f"<{tag}> is {text!r}",)
                else:
                    attributes[tag] = value
        elif tag == "pose":
            text = child.text
            text = text.strip() if text is not None else ""
            if text and tag not in attributes:
                attributes[tag] = text

    if name is None:
        return VocObject(None, None, (R.NO_NAME, ""), attributes, attribute_problems)
    if bndbox is None:
        return VocObject(name, None, (R.NO_BNDBOX, f"'{name}'"), attributes, attribute_problems)
    texts: dict[str, str] = {}
    for child in bndbox:
        tag = child.tag
        if tag in _COORD_SET and tag not in texts:
            texts[tag] = child.text
    try:
        box = (float(texts["xmin"]), float(texts["ymin"]), float(texts["xmax"]),
               float(texts["ymax"]))
        # each in (-ABSURD, ABSURD): NaN fails the comparisons, infinities and 1e200 the bound
        if (-ABSURD < box[0] < ABSURD and -ABSURD < box[1] < ABSURD
                and -ABSURD < box[2] < ABSURD and -ABSURD < box[3] < ABSURD):
            return VocObject(name, box, None, attributes, attribute_problems)
    except (KeyError, TypeError, ValueError):
        pass
    return VocObject(name, None, (R.BAD_COORDINATE, f"'{name}': {_bad_coordinate(texts)}"),
                     attributes, attribute_problems)


def _bad_coordinate(texts: dict[str, str | None]) -> str:
    """What is wrong with the first bad coordinate of a ``<bndbox>``."""
    for tag in _COORDS:
        text = texts.get(tag)
        text = text.strip() if text is not None else ""
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not -ABSURD < value < ABSURD:
            what = repr(text) if text else ("empty" if tag in texts else "missing")
            absurd = f" (absurd: |value| >= {MAX_PIXELS})" if math.isfinite(value) else ""
            return f"<{tag}> is {what}{absurd}"
    return "unreadable <bndbox>"  # not reached: one coordinate failed the check above


def _flag(text: str) -> int | None:
    """A VOC flag (``0``/``1``, ``true``/``false``, ``1.0``) as an int; ``None`` if unreadable."""
    value = _FLAG_WORDS.get(text.lower())
    if value is not None:
        return value
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() and number >= 0 else None
