"""Epochs and shards: which samples a rank sees in an epoch, in which batches (pure functions).

The rules are those of ``torch.utils.data.DistributedSampler`` followed by a ``DataLoader``, the
same for every source and both adapters (:class:`~detaug.torch.DetectionLoader`,
:class:`~detaug.keras.DetectionSequence`):

1. **Order.** Epoch ``e`` visits the ``n`` samples of the dataset in the order ``0..n-1``, or,
   with ``shuffle=True``, in a permutation of all ``n`` drawn from ``(seed, e)``
   (:func:`detaug.seeds.order_generator`): the same on every rank, a new one every epoch.
2. **Equal ranks.** With ``drop_last=False`` the order is padded to ``ceil(n / W) * W`` by
   repeating its first samples (at most ``W - 1`` repeats per epoch, fewer than ``n`` unless
   ``n < W``); with ``drop_last=True`` it is cut to ``floor(n / W) * W`` (at most ``W - 1``
   samples of the epoch left out, different ones each epoch when shuffled).
3. **Shards.** Rank ``r`` of ``W`` takes positions ``r, r + W, r + 2W, ...`` of that list: every
   rank holds the same number of samples, and with ``drop_last=False`` their union is the
   whole dataset in every epoch.
4. **Batches.** A rank's samples are cut into batches of ``batch_size`` in order; the last may
   be smaller, and ``drop_last=True`` drops it. ``len(loader)`` is therefore the same on every
   rank: :func:`num_batches`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["shard_size", "num_batches", "shard_order", "batch_slice", "check_shard", "EpochSpec", "source_groups"]


def check_shard(shard_id: int, num_shards: int) -> tuple[int, int]:
    """``(shard_id, num_shards)`` as ints, or a ``ValueError`` saying what is wrong."""
    if isinstance(num_shards, bool) or int(num_shards) != num_shards or num_shards < 1:
        raise ValueError(f"num_shards must be an integer >= 1, got {num_shards!r}")
    if isinstance(shard_id, bool) or int(shard_id) != shard_id or not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be an integer in [0, {num_shards}), got {shard_id!r}")
    return int(shard_id), int(num_shards)


def shard_size(n: int, num_shards: int, *, drop_last: bool) -> int:
    """Samples per rank and epoch: ``ceil(n / W)``, or ``floor(n / W)`` with ``drop_last``."""
    return n // num_shards if drop_last else math.ceil(n / num_shards)


def num_batches(n: int, num_shards: int, batch_size: int, *, drop_last: bool) -> int:
    """Batches per rank and epoch (``len(loader)``), the same on every rank."""
    per_rank = shard_size(n, num_shards, drop_last=drop_last)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)


def grouped_order(sizes: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """int64 ``[sum(sizes)]``: epoch ``epoch``'s order of a dataset stored as consecutive groups
    of ``sizes`` samples (tar shards): the groups in a permutation, and each group's samples in a
    permutation of their own, all drawn from ``order_generator(seed, epoch)`` (first the groups'
    permutation, then one permutation per group in storage order). Every position once."""
    from detaug.seeds import order_generator

    sizes = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    rng = order_generator(seed, epoch)
    groups = rng.permutation(len(sizes))
    inner = [starts[g] + rng.permutation(int(sizes[g])) for g in range(len(sizes))]
    return np.concatenate([inner[g] for g in groups] or [np.zeros(0, np.int64)]).astype(np.int64)


def shard_order(
    n: int, epoch: int, *, shard_id: int, num_shards: int, shuffle: bool, seed: int, drop_last: bool,
    groups: Sequence[int] | None = None,
) -> np.ndarray:
    """int64 ``[shard_size]``: the dataset positions rank ``shard_id`` visits in ``epoch``, in order
    (rules 1-3 of the module docstring). ``groups``: sizes of consecutive groups stored together
    (tar shards): a shuffled epoch then visits them group by group (:func:`grouped_order`)."""
    from detaug.seeds import order_generator

    if n < 1:
        raise ValueError("the dataset is empty")
    if shuffle and groups is not None:
        if sum(groups) != n:
            raise ValueError(f"groups of {sum(groups)} samples for a dataset of {n}")
        order = grouped_order(groups, seed, epoch)
    else:
        order = order_generator(seed, epoch).permutation(n) if shuffle else np.arange(n)
    total = shard_size(n, num_shards, drop_last=drop_last) * num_shards
    if total > n:  # pad by repeating from the start (several times over only when n < W - 1)
        order = np.resize(order, total)
    return order[shard_id:total:num_shards].astype(np.int64)


def batch_slice(step: int, batch_size: int, shard_len: int) -> slice:
    """Positions of batch ``step`` in a rank's order of ``shard_len`` samples."""
    start = step * batch_size
    return slice(start, min(start + batch_size, shard_len))


@dataclass(frozen=True)
class EpochSpec:
    """What decides the batches of a rank: the epoch rules of :mod:`detaug.epochs` and the seed."""

    n: int
    batch_size: int
    shard_id: int = 0
    num_shards: int = 1
    shuffle: bool = False
    drop_last: bool = False
    seed: int = 0
    #: sizes of consecutive sample groups stored together (tar shards), or ``None``
    groups: tuple[int, ...] | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return num_batches(self.n, self.num_shards, self.batch_size, drop_last=self.drop_last)

    def after(self, epoch: int, step: int, ahead: int = 1) -> tuple[int, int]:
        """``(epoch, step)`` of the batch ``ahead`` steps after batch ``step`` of ``epoch``: past
        an epoch's last batch come the next epoch's first (what the loaders prepare while an
        epoch ends)."""
        k = step + ahead
        return epoch + k // len(self), k % len(self)

    def order(self, epoch: int) -> np.ndarray:
        """int64 ``[shard_size]``: the rank's dataset positions in ``epoch``."""
        return shard_order(self.n, epoch, shard_id=self.shard_id, num_shards=self.num_shards,
                           shuffle=self.shuffle, seed=self.seed, drop_last=self.drop_last, groups=self.groups)

    def first_places(self, epoch: int) -> np.ndarray | None:
        """int64 ``[n]``: where each dataset position first comes in ``epoch``'s order of all
        ranks (rule 1 of :mod:`detaug.epochs`, before padding); ``None`` when that is the
        position itself (no shuffle)."""
        if not self.shuffle:
            return None
        order = shard_order(self.n, epoch, shard_id=0, num_shards=1, shuffle=True, seed=self.seed,
                            drop_last=False, groups=self.groups)
        places = np.empty(self.n, dtype=np.int64)
        places[order] = np.arange(self.n, dtype=np.int64)
        return places

    def holder(self, place: int) -> tuple[int, int] | None:
        """``(shard_id, step)`` of the batch that holds the sample at ``place`` of the epoch's
        order of all ranks (:meth:`first_places`), or ``None`` when no batch holds it (left out
        by ``drop_last``). Rule 3 of :mod:`detaug.epochs`: place ``g`` is rank ``g % W``'s
        ``g // W``-th sample."""
        w = self.num_shards
        per_rank = shard_size(self.n, w, drop_last=self.drop_last)
        if place >= per_rank * w:
            return None
        within = place // w
        if within >= min(per_rank, len(self) * self.batch_size):
            return None
        return place % w, within // self.batch_size


def source_groups(source: Any) -> tuple[int, ...] | None:
    """The sizes of the groups of consecutive samples ``source`` stores together (a
    :class:`~detaug.shards.ShardSource`'s tar files), for :class:`EpochSpec`; ``None`` for others."""
    sizes = getattr(source, "shard_sizes", None)
    return None if sizes is None else tuple(int(k) for k in sizes)
