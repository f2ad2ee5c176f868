"""Dataset formats: parsing and checking annotations and image bytes.

* :mod:`detaug.formats.coco`: the one COCO detection JSON parser (:func:`~detaug.formats.coco.load_coco`).
* :mod:`detaug.formats.validation`: the checks every source runs once when it is built (its
  table of reasons, the box checks), and every name of its parts: :mod:`~detaug.formats.report`
  (the :class:`~detaug.formats.report.Report` of what was repaired, the reasons),
  :mod:`~detaug.formats.values` (value rules), :mod:`~detaug.formats.sample_inputs` (the type
  rules of sample lists), :mod:`~detaug.formats.paths` (paths a dataset names).
* :mod:`detaug.formats.images`: image bytes: header, EXIF orientation, problems (its parts:
  :mod:`~detaug.formats.size_limits`, :mod:`~detaug.formats.image_info`,
  :mod:`~detaug.formats.image_headers`, :mod:`~detaug.formats.orientation`).
"""
