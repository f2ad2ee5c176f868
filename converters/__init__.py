"""Dataset format converters (Pascal VOC -> COCO)."""
