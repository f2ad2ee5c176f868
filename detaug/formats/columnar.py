"""Columnar annotations: one array per field for a whole dataset, not a Python object per sample.

A dataset of ``n`` images and ``M`` boxes is held as (:class:`SampleTable`)::

    image_ids  int64   [n]        the images' ids
    sizes      int32   [n, 2]     declared (height, width); (0, 0) where none was declared
    box_starts int64   [n + 1]    image i's boxes are rows box_starts[i]:box_starts[i + 1]
    boxes      float32 [M, 4]     absolute xyxy, continuous pixels (pixel i spans [i, i + 1))
    labels     int32   [M]        category ids (handed out as int64)

plus, for COCO (:class:`CocoColumns`), the file names as one UTF-8 blob with offsets, the EXIF
orientation entries, crowd flags and annotation ids, a keypoints file's keypoints (float32
``[M, K, 3]``) and, read with ``masks=True``, the boxes' segmentations undecoded
(:mod:`detaug.formats.mask_columns`: number arrays with offsets, no pickle). A table is written as a folder of ``.npy``
files and a ``meta.json`` (:func:`save_columns`) and opened memory-mapped (:func:`load_columns`):
opening costs the same for 1k and 10M images, and a process touches (keeps resident) only the
pages of the samples it reads; processes on one host share them through the page cache.

COCO files are parsed once (:func:`parse_coco_columns`: streamed in chunks, each chunk parsed
with ``orjson`` where installed, else ``json``; the validation rules of
:mod:`detaug.formats.validation` applied column-wise) and the result cached
(:func:`load_coco_columns`; built in bounded memory: the chunks' columns spilled to files in the
folder being written, only 32 bytes an image and a block of boxes in memory, the arrays the bytes
the in-memory parse would save): the second start-up of a 10M-image COCO file opens the cache. A file
the fast path does not take (anything beyond plain ints, floats and strings where COCO has them,
or any error) is parsed by :func:`detaug.formats.coco.load_coco` instead, which names every
problem; a clean result of that is cached the same way (in memory, as ``load_coco`` reads it).

:class:`SampleView` is the ``source.samples`` of a columnar source: ``len``, indexing (builds the
:class:`~detaug.formats.samples.Sample` on demand) and iteration.

Modules (their public names are importable from here):

* :mod:`detaug.formats.column_store`: :class:`SampleTable`, :class:`SampleView`, :func:`save_columns`,
  :func:`load_columns`.
* :mod:`detaug.formats.coco_columns`: :class:`CocoColumns` and :func:`coco_view`.
* :mod:`detaug.formats.json_stream` and :mod:`detaug.formats.coco_stream`: the streaming parser
  (:func:`parse_coco_columns`).
* :mod:`detaug.formats.mask_columns`: :class:`~detaug.formats.mask_columns.MaskColumns`, the segmentations.
* :mod:`detaug.formats.cache_trust`: when a cache is this file's (keys, hashes, signature).
* :mod:`detaug.formats.coco_cache`: the cache (:func:`load_coco_columns`, :func:`cache_folder`).
"""

from __future__ import annotations

from detaug.formats.cache_trust import CACHE_VERSION
from detaug.formats.coco_cache import cache_folder, load_coco_columns
from detaug.formats.coco_columns import CocoColumns, coco_view
from detaug.formats.coco_stream import CHUNK_BYTES, parse_coco_columns
from detaug.formats.column_store import SampleTable, SampleView, load_columns, save_columns

__all__ = [
    "CACHE_VERSION", "CocoColumns", "SampleTable", "SampleView", "cache_folder", "coco_view",
    "load_coco_columns", "load_columns", "parse_coco_columns", "save_columns",
]
