"""Several planned batches in one DALI run: joined for the pipeline (:func:`join_run`), their
outputs split back by the loader, batch by batch.

A DALI run has costs of its own, whatever its size: the feeding of its inputs, the executor's
per-operator events and copies, the collection of its outputs, the copy to PyTorch, the hand-over
from the loader's thread to the caller's. Beside a fast model in the same process the training
thread runs slower for them (docs/loader.md, "Feeding a fast model"); a run of several batches
pays them once. The batches stay what they are: each is planned alone (its samples, its
augmentation: a pure function of ``(seed, epoch, image_id)``), counted, skipped and repaired
alone, and given to the caller alone, in order; a run ends with its epoch.

:func:`default_batches_per_run` is the default number, :data:`RUN_IMAGES` the images it aims at,
:data:`RUN_BYTES` the output bytes it stays within.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detaug.planned_batch import PlannedBatch
from detaug.sample_rows import Chained

__all__ = ["MAX_BATCHES_PER_RUN", "RUN_BYTES", "RUN_IMAGES", "Run", "default_batches_per_run", "join_run"]

#: Images a DALI run aims at on the GPU (the default of :func:`default_batches_per_run`). With the bench's
#: fast detector at batch 64 on an H200 (padded targets, a steady host), runs of 4 batches trained
#: at 0.87-0.93x of the model's ceiling against 0.81-0.88x for runs of one batch (docs/benchmarks.md,
#: "Runs of several batches").
RUN_IMAGES = 256

#: The most batches one run joins by default.
MAX_BATCHES_PER_RUN = 8

#: The most bytes of output images a run holds by default (DALI keeps ``prefetch_queue_depth``
#: runs of outputs, and the caller's images are slices of a run's tensor): 256 images of 320x320
#: float32 (315 MB) fit; 800x1333 float32 images (12.8 MB) make runs of 41 images at most.
RUN_BYTES = 512 * 2**20


def default_batches_per_run(batch_size: int, on_gpu: bool, image_bytes: int | None) -> int:
    """Batches a loader joins in one DALI run by default: on the GPU enough batches for
    :data:`RUN_IMAGES` images (1 for a batch of 256 or more, at most :data:`MAX_BATCHES_PER_RUN`)
    whose output images (``image_bytes`` each) fit in :data:`RUN_BYTES` (at least one batch); 1
    where ``image_bytes`` is ``None`` (a recipe that fixes no output size: images of any size) and
    on the CPU (a CPU pipeline's cost is per image)."""
    if not on_gpu or image_bytes is None:
        return 1
    batch_size = max(1, int(batch_size))
    by_count = -(-RUN_IMAGES // batch_size)
    by_bytes = RUN_BYTES // max(1, batch_size * int(image_bytes))
    return max(1, min(MAX_BATCHES_PER_RUN, by_count, by_bytes))


@dataclass
class Run:
    """Consecutive planned batches fed to the pipeline as one run.

    Attributes:
        members: the batches, in order (each a :class:`PlannedBatch` of its own step).
        joined: one :class:`PlannedBatch` holding them all, what the pipeline is fed and what a
            failed run is searched for culprits (:mod:`detaug.decode_failures`): the members'
            samples in order, partner positions within the batch (``pool="batch"``) moved to
            their places in the run. ``members[0]`` itself for a run of one batch.
    """

    members: list[PlannedBatch]
    joined: PlannedBatch

    @property
    def sizes(self) -> list[int]:
        """Each member's samples: how the run's outputs split."""
        return [len(m.image_ids) for m in self.members]

    def describe(self) -> str:
        """``"batch 4 of epoch 0"`` or ``"batches 4-7 of epoch 0"`` (a run holds batches of one
        epoch), for messages."""
        first, last = self.members[0], self.members[-1]
        if first is last:
            return f"batch {first.step} of epoch {first.epoch}"
        return f"batches {first.step}-{last.step} of epoch {first.epoch}"


def join_run(members: list[PlannedBatch]) -> Run:
    """The :class:`Run` of ``members`` (at least one), their inputs joined in order."""
    if not members:
        raise ValueError("a run needs at least one planned batch")
    if len(members) == 1:
        return Run(list(members), members[0])
    first = members[0]
    params = np.concatenate([m.params for m in members])
    if first.layout is not None:
        starts = np.cumsum([0] + [len(m.image_ids) for m in members[:-1]])
        for name in first.layout.names:
            if name.startswith("slot") and name.endswith(".batch_index"):  # a batch-mate's place in its batch
                column = first.layout.slice(name)
                for start, m in zip(starts.tolist(), members):
                    params[start : start + len(m.image_ids), column] += start
    slots = len(first.partners) if first.partners else 0
    partners: list[list[np.ndarray] | None] | None
    if first.partners is None or any(m.partners is None for m in members):
        partners = None
    else:
        partners = [None if first.partners[k] is None else [a for m in members for a in m.partners[k]]
                    for k in range(slots)]
    joined = PlannedBatch(
        epoch=first.epoch,
        step=first.step,
        positions=np.concatenate([m.positions for m in members]),
        image_ids=np.concatenate([m.image_ids for m in members]),
        data=None if any(m.data is None for m in members) else [a for m in members for a in m.data],
        params=params,
        boxes=Chained([m.boxes for m in members]),  # read per sample only where wanted (detaug.sample_rows)
        labels=Chained([m.labels for m in members]),
        partners=partners,
        partner_positions=np.concatenate([m.partner_positions for m in members]),
        fields=Chained([m.fields for m in members]),
        layout=first.layout,
        pasted=None if first.pasted is None else [a for m in members for a in m.pasted],
    )
    return Run(list(members), joined)
