"""Planning in worker processes: the planner sent to them (:func:`planner_payload`), their
initializer (:func:`init_plan_worker`) and their job (:func:`plan_group_job`), which
:mod:`detaug.plan_ahead` runs. Module-level, so that workers import neither Keras nor torch.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence

from detaug.decoded_shapes import DecodedShapes
from detaug.planned_batch import PlannedBatch
from detaug.planning import BatchPlanner

__all__ = ["worker_planner", "init_plan_worker", "plan_group_job", "planner_payload"]


def worker_planner(planner: BatchPlanner) -> BatchPlanner:
    """The planner to send to worker processes (decoded arrays stay in this process)."""
    if getattr(planner.source, "decoded", False) and not isinstance(planner.source, DecodedShapes):
        return BatchPlanner(DecodedShapes(planner.source), planner.transforms, planner.spec, planner.on_error,
                            fields=planner.fields)
    return planner


_PLANNER: BatchPlanner | None = None


def init_plan_worker(payload: bytes) -> None:
    """A planning worker's initializer: the pickled :class:`BatchPlanner` (:func:`planner_payload`),
    read once for all the worker's jobs."""
    global _PLANNER
    _PLANNER = pickle.loads(payload)


def plan_group_job(epoch: int, steps: Sequence[int], bad: Mapping[int, str] | None = None
                   ) -> list[PlannedBatch | Exception]:
    """In a planning worker: :meth:`BatchPlanner.plan_many` of batches ``steps`` (one batch:
    what :meth:`BatchPlanner.plan` gives, or its error)."""
    if _PLANNER is None:
        raise RuntimeError("this planning worker has no planner (init_plan_worker did not run)")
    return _PLANNER.plan_many(epoch, steps, bad=bad)


def planner_payload(planner: BatchPlanner) -> bytes:
    """The bytes :func:`init_plan_worker` takes (decoded arrays are sent as their shapes)."""
    return pickle.dumps(worker_planner(planner), protocol=pickle.HIGHEST_PROTOCOL)
