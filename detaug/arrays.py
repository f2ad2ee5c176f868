"""Numbers given by users as arrays: NumPy arrays, nested lists or torch tensors (on any device)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["numeric_array"]


def numeric_array(values: Any, what: str, kinds: str = "iuf", verb: str = "are") -> tuple[np.ndarray | None, str]:
    """``values`` as a NumPy array of numbers (a tensor is copied to the host), or ``(None,
    why)``: why names ``what`` ("keypoints", "field 'score'", ...; ``verb`` agrees with it).

    Args:
        values: an array, nested sequences or anything with ``.detach()`` (a torch tensor).
        what: the name of the values in the message.
        kinds: the NumPy dtype kinds accepted (``"iuf"``: integers and floats; ``"b"``: bools).
        verb: ``"are"`` or ``"is"``.
    """
    try:
        arr = np.asarray(values.detach().cpu().numpy() if hasattr(values, "detach") else values)
    except (TypeError, ValueError) as err:
        return None, f"{what} {verb} not an array ({err})"
    if arr.dtype.kind not in kinds:
        return None, f"{what} of dtype {arr.dtype} {verb} not numbers"
    return arr, ""
