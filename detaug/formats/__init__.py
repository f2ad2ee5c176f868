"""Dataset formats: parsing and checking annotations and image bytes.

* :mod:`detaug.formats.coco`: the one COCO detection JSON parser (:func:`~detaug.formats.coco.load_coco`).
* :mod:`detaug.formats.validation`: the checks every source runs once when it is built, and the
  :class:`~detaug.formats.validation.Report` of what was repaired.
* :mod:`detaug.formats.images`: image bytes: header, EXIF orientation, problems (its parts:
  :mod:`~detaug.formats.size_limits`, :mod:`~detaug.formats.image_info`,
  :mod:`~detaug.formats.image_headers`, :mod:`~detaug.formats.orientation`).
"""
