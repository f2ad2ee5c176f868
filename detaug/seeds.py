"""The seed contract: every random number of the augmentations and of the epoch order comes from here.

**A sample's augmentation is a pure function of its key** ``(seed, epoch, image_id)`` (and of the
sample itself: its image shape, boxes and labels). It does not depend on the batch size, on the
other samples of its batch or their order, on the number of worker processes, on the rank or on
the device. Planning a batch therefore gives, row for row, exactly what planning each of its
samples alone gives, and a batch can be planned again (after a resume, in another process) with
the same result.

* :func:`sample_keys` builds the keys: int64 ``[B, 3]`` rows ``(seed, epoch, image_id)``.
  ``image_id`` is what tells two samples of one epoch apart, so it must be unique within a
  dataset: the sources validate that when they are built (:mod:`detaug.formats.validation`).
  A sample that appears twice in one epoch (ranks padded to equal length) gets the same
  augmentation both times, by design.
* :class:`SampleRandom` is the planner's random source: a *counter-based* generator. Row ``k``
  of every draw is ``mix64(s_k + (p + 1) * GAMMA)`` for the draw's counter positions ``p``, where
  ``s_k`` is a 64-bit hash of key ``k`` and ``mix64`` is SplitMix64's finaliser (so each row is
  the SplitMix64 stream seeded with ``s_k``). The counter is shared by the batch and advanced by
  each draw by the same amount for every row (``prod(tail)`` positions), so a row's values
  depend only on its key and on how many positions the recipe consumed before: the recipe draws
  the same counts for every sample, whatever the others do. A draw may be evaluated for some
  rows only (``rows=``): the other rows' values are simply not computed, and the counter still
  advances by the full amount. Loops whose number of draws depends on the data reserve a fixed
  block of positions and :meth:`SampleRandom.advance_to` its end.
* :func:`order_generator` is the only other generator: the epoch permutation, a function of
  ``(seed, epoch)`` alone, the same on every rank.

Everything is vectorised NumPy ``uint64`` arithmetic (wrapping modulo ``2**64``); there is no
global state, so the same key gives the same numbers in every process and on every machine.
Doubles take the top 53 bits of a 64-bit output (``[0, 1)``); integers below ``high`` take
``(top 32 bits * high) >> 32`` (bias below ``high / 2**32``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["KEY_WORDS", "sample_keys", "as_keys", "order_generator", "SampleRandom"]

#: Words of a sample key: ``(seed, epoch, image_id)``.
KEY_WORDS = ("seed", "epoch", "image_id")

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment (odd, the golden ratio * 2**64)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_DOMAIN = np.uint64(0x6465746175675F31)  # "detaug_1": the hash's starting value
_DOUBLE = 2.0**-53
_GAMMA_INT, _MASK = int(_GAMMA), 2**64 - 1
_STEPS: dict[int, np.ndarray] = {}


def _gamma_steps(m: int) -> np.ndarray:
    """Read-only uint64 ``[m]``: ``j * GAMMA`` (mod ``2**64``) for ``j < m``, cached per ``m``."""
    steps = _STEPS.get(m)
    if steps is None:
        steps = np.arange(m, dtype=np.uint64) * _GAMMA
        steps.flags.writeable = False
        if len(_STEPS) < 256:  # a recipe uses a handful of draw sizes
            _STEPS[m] = steps
    return steps


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64), in place on a fresh ``uint64`` array."""
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _as_int(name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{name} must fit in int64, got {value}")
    return value


def sample_keys(seed: int, epoch: int, image_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """The keys of a batch: int64 ``[B, 3]`` rows ``(seed, epoch, image_id)``.

    Args:
        seed: the run's seed (any int64).
        epoch: the epoch (``>= 0``).
        image_ids: ``B`` integer image ids (any shape holding ``B`` values, e.g. ``[B]`` or
            ``[B, 1]``), unique within the dataset (see the module docstring).
    """
    seed, epoch = _as_int("seed", seed), _as_int("epoch", epoch)
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    ids = np.asarray(image_ids)
    if ids.size == 0:
        ids = ids.astype(np.int64)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"image_ids must be integers, got dtype {ids.dtype}")
    if ids.dtype.kind == "u" and ids.size and ids.max() >= 2**63:
        raise ValueError("image_ids must fit in int64")
    ids = ids.reshape(-1).astype(np.int64)
    keys = np.empty((len(ids), 3), dtype=np.int64)
    keys[:, 0], keys[:, 1], keys[:, 2] = seed, epoch, ids
    return keys


def as_keys(keys: np.ndarray | Sequence[np.ndarray], batch_size: int | None = None) -> np.ndarray:
    """Validate keys: int64 ``[B, 3]`` from :func:`sample_keys`, or a list of ``B`` 1-D arrays of
    3 integers each. ``batch_size``, when given, must equal ``B``."""
    if isinstance(keys, np.ndarray):
        arr = keys
    else:
        rows = [np.asarray(k).reshape(-1) for k in keys]
        bad = next((r for r in rows if len(r) != len(KEY_WORDS)), None)
        if bad is not None:
            raise ValueError(f"keys must be [B, 3] (seed, epoch, image_id) rows, got a row of {len(bad)} words")
        arr = np.stack(rows) if rows else np.zeros((0, len(KEY_WORDS)), np.int64)
    if arr.ndim != 2 or arr.shape[1] != len(KEY_WORDS):
        raise ValueError(f"keys must be [B, 3] (seed, epoch, image_id) rows, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"keys must be integers, got dtype {arr.dtype}")
    if batch_size is not None and len(arr) != batch_size:
        raise ValueError(f"got {len(arr)} keys for a batch of {batch_size}")
    return arr.astype(np.int64, copy=False)


def order_generator(seed: int, epoch: int) -> np.random.Generator:
    """The generator of epoch ``epoch``'s sample order (a function of ``(seed, epoch)`` only).

    ``seed`` and ``epoch`` must be non-negative (NumPy's ``SeedSequence`` entropy)."""
    seed, epoch = _as_int("seed", seed), _as_int("epoch", epoch)
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0 for the epoch order, got seed={seed}, epoch={epoch}")
    return np.random.default_rng([seed, epoch])


class SampleRandom:
    """Per-sample, counter-based random numbers for planning a batch (see the module docstring).

    Every method returns an array ``[R, *tail]`` (``R`` = ``B``, or ``len(rows)`` when ``rows``
    is given) and advances :attr:`counter` by ``prod(tail)`` for every sample. Row ``k`` depends
    only on key ``k`` and on :attr:`counter`.

    Args:
        keys: int ``[B, K]`` sample keys (normally :func:`sample_keys`' ``[B, 3]``).
    """

    def __init__(self, keys: np.ndarray) -> None:
        words = np.asarray(keys)
        if words.ndim != 2 or words.dtype.kind not in "iu":
            raise ValueError(f"keys must be an integer [B, K] array, got {words.dtype} {words.shape}")
        state = np.full(len(words), _DOMAIN, dtype=np.uint64)
        for j in range(words.shape[1]):
            state ^= words[:, j].astype(np.int64).view(np.uint64)
            state += _GAMMA
            state = _mix64(state)
        self._state = state  # uint64 [B]: each sample's SplitMix64 seed
        self.counter = 0  # positions consumed so far (the same for every sample)

    @property
    def batch_size(self) -> int:
        return len(self._state)

    def advance_to(self, position: int) -> None:
        """Move the counter forward to ``position`` (the end of a block reserved for a loop whose
        number of draws depends on the data). Moving backwards would reuse numbers: an error."""
        if position < self.counter:
            raise RuntimeError(f"draws overran their reserved block: counter {self.counter} > {position}")
        self.counter = int(position)

    def _bits(self, tail: int | Sequence[int], rows: np.ndarray | None) -> np.ndarray:
        """uint64 ``[R, *tail]`` raw outputs at the next ``prod(tail)`` positions."""
        shape = (tail,) if isinstance(tail, (int, np.integer)) else tuple(tail)
        m = math.prod(shape)
        start = self.counter
        self.counter = start + m
        state = self._state if rows is None else self._state[rows]
        first = np.uint64(((start + 1) * _GAMMA_INT) & _MASK)  # SplitMix64 state at position start
        if m == 1:
            z = state + first
        else:
            z = state[:, None] + _gamma_steps(m)[None, :]
            z += first
        return _mix64(z).reshape((len(state), *shape))

    def random(self, tail: int | Sequence[int] = (), rows: np.ndarray | None = None) -> np.ndarray:
        """Uniform float64 in ``[0, 1)``, ``[R, *tail]``."""
        bits = self._bits(tail, rows)
        bits >>= np.uint64(11)
        out = bits.astype(np.float64)
        out *= _DOUBLE
        return out

    def uniform(
        self, low: float, high: float, tail: int | Sequence[int] = (), rows: np.ndarray | None = None
    ) -> np.ndarray:
        """Uniform float64 in ``[low, high)`` (``low + (high - low) * u``), ``[R, *tail]``."""
        out = self.random(tail, rows)
        out *= high - low
        out += low
        return out

    def integers(self, high: int | Sequence[int] | np.ndarray, tail: int | Sequence[int] = (),
                 rows: np.ndarray | None = None) -> np.ndarray:
        """Uniform int64 in ``[0, high)`` for ``1 <= high <= 2**32``, ``[R, *tail]``; ``high`` may
        be an array broadcast against ``tail`` (a bound per column: the same draws as one bound)."""
        bound = np.asarray(high, dtype=np.int64)
        if bound.size == 0 or bound.min() < 1 or bound.max() > 2**32:
            raise ValueError(f"high must be between 1 and 2**32, got {high}")
        bits = self._bits(tail, rows)
        bits >>= np.uint64(32)
        bits *= bound.astype(np.uint64)
        bits >>= np.uint64(32)
        return bits.astype(np.int64)
