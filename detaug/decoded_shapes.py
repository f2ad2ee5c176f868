"""What planning workers get of a source of decoded arrays: their shapes, not their pixels
(:class:`DecodedShapes`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detaug.sources import field_specs

__all__ = ["DecodedShapes"]


class DecodedShapes:
    """What planning workers get of a source of decoded arrays: each image's shape, not its
    pixels (``load`` returns a read-only zero-stride view of that shape), boxes, labels, ids,
    per-box fields."""

    decoded = True
    orientation = "ignore"

    def __init__(self, source: Any) -> None:
        self.samples = [_Shape(np.shape(s.image), s.boxes, s.labels, s.image_id, getattr(s, "fields", None) or {})
                        for s in source.samples]
        self.field_specs = field_specs(source)

    def __len__(self) -> int:
        return len(self.samples)

    def file_of(self, index: int) -> str:
        return f"sample {index} (array {self.samples[index].shape})"

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        s = self.samples[index]
        data = np.broadcast_to(np.zeros((), np.uint8), (*s.shape[:2], 3))
        return data, s.boxes, s.labels, s.image_id


@dataclass
class _Shape:
    shape: tuple[int, ...]
    boxes: np.ndarray
    labels: np.ndarray
    image_id: int
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    size: None = None
