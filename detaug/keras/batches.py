"""How a :class:`~detaug.keras.DetectionSequence` makes batch ``i``: its plan, the pipeline, the
prefetch of the batches expected next, the Keras targets (:class:`SequenceBatches`, a mixin of the
sequence: the sequence keeps the Keras protocol, this module its batches).

A batch is planned by the rules the PyTorch loader shares (:mod:`detaug.loader_core`: the epoch
spec, the skip bookkeeping, :func:`~detaug.loader_core.plan_here`), and run through the sequence's
one pipeline, :class:`~detaug.keras.pipeline_queue.PipelineQueue`.

Access pattern, concurrency and prefetching:

1. ``seq[i]`` right after ``seq[i - 1]`` (or ``seq[0]`` first in an epoch), with no other call in
   progress, is *sequential*: once batch ``i`` is out of the pipeline, the next
   ``PIPELINE_DEPTH`` batches (two) are planned, fed and held for the calls expected next: DALI
   makes them while the caller trains on batch ``i``; the call for one takes DALI's outputs and
   copies the images out. This is how ``fit(seq, shuffle=False)`` asks with the default
   ``workers=1`` (docs/keras.md);
2. ``seq[i]`` may be called from several threads at once (Keras' ``workers > 1``, or your own):
   the sequence runs their batches through one DALI pipeline in the order they come, two at
   once, in one pipeline's memory (batch ``i``'s result does not depend on what ran beside it);
3. a prefetched batch that is not asked for next is dropped (``prefetch_wasted`` counts them):
   in a random order (``fit(seq)``, which shuffles the batch order), with one caller, each batch
   runs alone, on demand;
4. the last batches of an epoch prefetch the first of the next one, so that the pipeline does
   not run dry between epochs; ``on_epoch_end()`` moves to the next epoch (and keeps them),
   ``set_epoch(e)`` to another epoch drops them.

Planning ahead (:mod:`detaug.keras.plan_ahead`): with ``plan_workers > 0`` the host-side work of
every batch of the epoch and the next (reading the image files, ``Compose.plan_batch``) runs in
worker processes ahead of the ``seq[i]`` calls; a batch whose plan is not ready is planned in the
calling thread, with the same result.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import numpy as np

from detaug import loader_core as core
from detaug.errors import DataWarning
from detaug.keras.pipeline_queue import PIPELINE_DEPTH, Ticket
from detaug.keras.targets import BoxOverflowWarning, overflowing, pad_targets
from detaug.pipeline import build_pipeline
from detaug.decode_failures import DecodeFailure
from detaug.planned_batch import PlannedBatch, batch_columns

__all__ = ["SequenceBatches"]


class SequenceBatches:
    """The batches of a :class:`~detaug.keras.DetectionSequence`: reads the attributes its
    ``__init__`` sets (``planner``, ``spec``, ``_queue``, ``_planner``, ``_lock``, the counters)
    and takes the sequence's lock (a ``threading.Condition``) around them."""

    def _build(self) -> Any:
        pipe = build_pipeline(
            self.source, self.transforms, batch_size=self.batch_size, device=self.device,
            device_id=self.device_id, num_threads=self.num_threads, hw_decoder_load=self.hw_decoder_load,
            seed=self.seed, layout="HWC",
            prefetch_queue_depth=PIPELINE_DEPTH,  # the batches of the calls waiting, in turn (detaug.keras.pipeline_queue)
        )
        pipe.build()
        return pipe

    def _check_index(self, index: Any) -> int:
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"batch indexes must be integers, got {type(index).__name__}") from None
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch index {index} out of range for a sequence of {n} batches")
        return i + n if i < 0 else i

    def _plan(self, i: int, epoch: int) -> PlannedBatch:
        """Batch ``i`` of ``epoch``, planned, with its image data: a worker's plan (the image
        bytes it read, or, when it left them out, read here; decoded arrays are taken here), or,
        where its job has not started (or there is none), planned here."""
        with self._lock:
            # a call that began before set_epoch plans its own batch; the next epoch's are planned ahead too
            plannable = self._planner is not None and self._plans_ahead_for(epoch)
            planned = self._planner.take(i, epoch) if plannable else None  # raises the job's error
        ahead = planned is not None
        if planned is None:
            with self._lock:
                bad = dict(self._bad)
            planned = self.planner.plan(epoch, i, bad=bad)  # reads and plans before feeding
        with self._lock:
            if ahead:
                self.planned_ahead += 1
            else:
                self.planned_inline += 1
        if planned.data is None or planned.partners is None:  # decoded arrays, or a plan made without the bytes
            self.planner.fill_data(planned)
        return planned

    def _run(self, ticket: Ticket | None, i: int, epoch: int) -> tuple[Ticket, Any]:
        """``(ticket, images)`` of batch ``i`` of ``epoch``: the prefetched ``ticket``, or planned
        and submitted now (on demand), run through the pipeline; a batch DALI fails on (an image
        whose header was fine) is planned again without the culprit and run again."""
        if ticket is None:
            ticket = self._queue.submit(self._plan(i, epoch))
        while True:
            try:
                return ticket, self._queue.result(ticket)
            except DecodeFailure as failure:
                ticket = self._queue.submit(self._without_undecodable(ticket.planned, failure))

    def _plans_ahead_for(self, epoch: int) -> bool:
        """Whether ``epoch``'s batches are planned ahead (and prefetched): the current epoch's and
        the next one's (called under the lock)."""
        return epoch in (self.epoch, self.epoch + 1)

    def _without_undecodable(self, planned: PlannedBatch, failure: DecodeFailure) -> PlannedBatch:
        """Batch ``planned`` planned again without the images DALI failed on (``on_error="skip"``),
        or the error naming the culprit (``"raise"``, or no culprit found)."""
        core.skip_undecodable(self, failure, failure.__cause__, self._lock)  # raises with on_error="raise"
        with self._lock:
            bad = dict(self._bad)
        return core.plan_here(self, planned.epoch, planned.step, bad)

    def _record(self, planned: PlannedBatch) -> None:
        """Keep the batch's skipped images and repaired boxes (:attr:`skipped`,
        :attr:`repaired`); warn once per file and reason."""
        if not planned.skipped and not planned.repaired:
            return
        with self._lock:
            messages = core.record(self, planned)
        for message in messages:
            warnings.warn(message, DataWarning, stacklevel=3)

    def _prefetch_after(self, i: int, epoch: int) -> None:
        """The ``PIPELINE_DEPTH`` batches after batch ``i`` of ``epoch`` (into the next epoch at the
        end of this one), prefetched for the sequential calls expected next."""
        for ahead in range(1, 1 + PIPELINE_DEPTH):
            next_epoch, j = self.spec.after(epoch, i, ahead)
            self._prefetch_next(j, next_epoch)

    def _prefetch_next(self, i: int, epoch: int) -> None:
        """Submit batch ``i`` for a later call, unless one is held for it already, and feed it now
        if the pipeline is free. Errors are not this call's: batch ``i`` raises them when it is
        asked for."""
        with self._lock:
            if (epoch, i) in self._queue.prefetched:
                return
        try:
            planned = self._plan(i, epoch)
        except Exception:  # noqa: BLE001 - batch i's error, raised again when batch i is asked for
            return
        with self._lock:
            if not self._plans_ahead_for(epoch):  # the sequence moved on meanwhile
                return
            self._queue.hold((epoch, i), self._queue.submit(planned))
        self._queue.feed_waiting()

    # -- Keras targets ----------------------------------------------------------------------------

    def _targets(self, i: int, epoch: int, planned: PlannedBatch, images: Any) -> dict[str, np.ndarray]:
        """The batch's boxes (xyxy ``[N_k, 4]`` per sample, the plan's: the pipeline only moves
        pixels), labels and fields padded to ``max_boxes`` rows
        (:func:`~detaug.keras.targets.pad_targets`), after the ``overflow`` policy."""
        over = overflowing(planned.boxes, self.max_boxes)
        if over:
            self._overflow(i, epoch, planned.image_ids, over, planned.boxes)
        height, width = images.shape[1:3]
        return pad_targets(batch_columns(planned), self.max_boxes, self.bounding_box_format, (height, width),
                           self.label_mapping, self._field_outputs)

    def _overflow(self, i: int, epoch: int, image_ids: np.ndarray, over: list[int], boxes: list[np.ndarray]) -> None:
        detail = ", ".join(
            f"image_id {image_ids[k]}: {len(boxes[k])}" for k in over[:5]
        ) + (", ..." if len(over) > 5 else "")
        if self.overflow == "raise":
            raise ValueError(
                f"batch {i} (epoch {epoch}): {len(over)} sample(s) have more than max_boxes={self.max_boxes} "
                f"boxes ({detail}); raise max_boxes (the largest source sample has {self.most_source_boxes}, "
                "max_boxes=None uses that) or pass overflow='warn' or 'truncate' to keep the first max_boxes"
            )
        cut = sum(len(boxes[k]) - self.max_boxes for k in over)
        with self._lock:
            self.boxes_truncated += cut
            self.samples_truncated += len(over)
            so_far = self.boxes_truncated
        if self.overflow == "warn":
            warnings.warn(
                f"batch {i} (epoch {epoch}): cut {cut} box(es) beyond max_boxes={self.max_boxes} "
                f"from {len(over)} sample(s) ({detail}); {so_far} cut so far",
                BoxOverflowWarning,
                stacklevel=5,  # the caller of seq[i]: _overflow < _targets < batch < __getitem__
            )
