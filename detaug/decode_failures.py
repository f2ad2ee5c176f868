"""A batch DALI failed on although every image header was fine: finding the culprits
(:func:`undecodable`) and the error the user gets when they are not skipped (:class:`DecodeFailure`)."""

from __future__ import annotations

import io
from typing import Any

from detaug.errors import ImageError
from detaug.planned_batch import PlannedBatch

__all__ = ["undecodable", "DecodeFailure"]


def undecodable(planned: PlannedBatch) -> list[tuple[int, str]]:
    """``(dataset position, reason)`` of the encoded images of ``planned``, its samples' and
    its Mosaic/MixUp partners', that Pillow cannot decode fully: the culprits of a batch DALI
    failed on although every header was fine. Each position once, samples first."""
    from PIL import Image

    images = list(zip(planned.positions.tolist(), planned.data or []))
    for k, column in enumerate(planned.partners or []):
        if column is not None:  # None: batch-mates (pool="batch"), checked as samples
            images += [(p, d) for p, d in zip(planned.partner_positions[:, k].tolist(), column) if p >= 0]
    found, seen = [], set()
    for p, d in images:
        if d.ndim != 1 or p in seen:
            continue
        seen.add(p)
        try:
            with Image.open(io.BytesIO(d.tobytes())) as im:
                im.load()
        except Exception as err:  # noqa: BLE001 - any failure marks the culprit
            found.append((int(p), f"cannot be decoded: {err}"))
    return found


class DecodeFailure(Exception):
    """DALI failed on a batch (an image whose header was fine); the adapter finds the culprit."""

    def __init__(self, planned: PlannedBatch, cause: BaseException, where: str | None = None) -> None:
        super().__init__(str(cause))
        self.planned = planned
        #: the batch (or run of batches, :mod:`detaug.pipeline_runs`) in words, for the error
        self.where = where if where is not None else f"batch {planned.step} of epoch {planned.epoch}"

    def error(self, source: Any, culprits: list[tuple[int, str]]) -> Exception:
        """What the user gets when the culprit is not skipped: an :class:`ImageError` naming the
        first of ``culprits`` (``(dataset position, reason)``, :func:`undecodable`), or, when
        there are none, a ``RuntimeError`` naming every file of the batch."""
        planned = self.planned
        if culprits:
            p, reason = culprits[0]
            return ImageError(source.file_of(p), int(source.samples[p].image_id), reason)
        files = [source.file_of(int(p)) for p in planned.positions]
        return RuntimeError(f"{self.where} (files {files}) failed in DALI: {self}")
