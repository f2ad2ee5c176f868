"""Feeding sample-list sources to DALI's ``fn.external_source``: epochs, shards, seeds."""

from __future__ import annotations

from typing import Any

import numpy as np

from detaug.sources import SampleListSource

__all__ = ["shard_range", "EpochFeeder", "collate_samples"]


def shard_range(n: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """``[begin, end)`` of shard ``shard_id`` of ``n`` samples, split as DALI's readers do."""
    return n * shard_id // num_shards, n * (shard_id + 1) // num_shards


class EpochFeeder:
    """Feeds a sample-list source to ``fn.external_source`` batch after batch, epoch after epoch.

    Each epoch visits this shard's samples once, in a permutation drawn from ``(seed, epoch)``
    when ``shuffle`` (the same on every rank, so the shards partition the dataset); the last
    batch of an epoch holds the remainder. Every sample carries the seed words
    ``(seed, epoch, index)`` that drive its random augmentation.
    """

    def __init__(self, source: SampleListSource, batch_size: int, *, shuffle: bool, seed: int, shard_id: int, num_shards: int) -> None:
        self.source = source
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.begin, self.end = shard_range(len(source), shard_id, num_shards)
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        order = np.arange(len(self.source))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(order)
        return order[self.begin : self.end]

    def __call__(self) -> tuple[list[np.ndarray], ...]:
        indices = self._order[self.position : self.position + self.batch_size]
        epoch = self.epoch
        self.position += len(indices)
        if self.position >= len(self._order):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        return collate_samples(self.source, indices, [np.array([self.seed, epoch, i], dtype=np.int64) for i in indices])


def collate_samples(source: SampleListSource, indices: Any, seeds: list[np.ndarray]) -> tuple[list[np.ndarray], ...]:
    """The five external-source lists (data, boxes, labels, ids, seeds) for ``indices``."""
    columns: tuple[list[np.ndarray], ...] = ([], [], [], [], seeds)
    for i in indices:
        for column, value in zip(columns, source.load(int(i))):
            column.append(value)
    return columns
