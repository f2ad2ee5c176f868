"""Dataset format converters: Pascal VOC -> COCO.

``from converters import convert`` (or ``from converters.voc2coco import convert``) converts a
VOC dataset into a COCO dict; ``converters.voc2coco`` is the module and is callable as
``convert``. The command line is ``voc2coco`` (:mod:`converters.cli`).
"""

from converters.voc2coco import (
                                 ConversionError,
                                 ConversionResult,
                                 convert,
                                 convert_splits,
                                 write_coco_json,
)

__all__ = ["ConversionError", "ConversionResult", "convert", "convert_splits", "write_coco_json"]
