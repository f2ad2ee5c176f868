"""detaug.shared_arrays: arrays written by one process, read as views by another."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import detaug.shared_arrays as shared
from detaug.shared_arrays import file_prefix, share, sweep


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """A stand-in for /dev/shm: the same calls work on any directory."""
    monkeypatch.setattr(shared, "SHM_DIR", str(tmp_path))
    return tmp_path


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.integers(0, 256, 1001, dtype=np.uint8),  # an odd length: the next array is aligned anyway
        rng.random((5, 4), dtype=np.float32),
        np.zeros((0, 4), np.float32),
        rng.integers(-9, 9, (3, 2), dtype=np.int64)[:, ::-1],  # not contiguous
        rng.integers(0, 256, (7, 6, 3), dtype=np.uint8),
    ]


def test_arrays_come_back_equal_as_read_only_views_and_the_file_goes(shm_dir):
    arrays = _arrays()
    handle = share(arrays, file_prefix("t_"))
    assert handle is not None and os.path.exists(handle.path)
    assert all(offset % 64 == 0 for offset in handle.offsets)
    received = pickle.loads(pickle.dumps(handle)).open()  # as the parent gets it
    assert not os.path.exists(handle.path)  # removed once mapped
    assert len(received) == len(arrays)
    for sent, got in zip(arrays, received):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        np.testing.assert_array_equal(got, sent)
        assert not got.flags.writeable


def test_open_is_idempotent_and_views_never_travel(shm_dir):
    handle = share(_arrays(), file_prefix("t_"))
    first = handle.open()
    assert handle.open() is first
    assert pickle.loads(pickle.dumps(handle))._arrays is None


def test_without_room_or_a_directory_nothing_is_shared_or_left(shm_dir, monkeypatch):
    assert share([], file_prefix("t_")) is None
    assert share([np.zeros(0, np.uint8)], file_prefix("t_")) is None

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    monkeypatch.setattr(os, "writev", full)
    assert share(_arrays(), file_prefix("t_")) is None
    assert list(shm_dir.iterdir()) == []
    monkeypatch.setattr(shared, "SHM_DIR", str(shm_dir / "missing"))
    assert share(_arrays(), file_prefix("t_")) is None


def test_sweep_removes_the_files_of_one_prefix_only(shm_dir):
    mine = [share(_arrays(), file_prefix("a_")) for _ in range(3)]
    other = share(_arrays(), file_prefix("b_"))
    assert sweep(file_prefix("a_")) == 3
    assert not any(os.path.exists(h.path) for h in mine)
    assert os.path.exists(other.path)
    assert sweep(file_prefix("b_")) == 1


def test_a_file_is_registered_for_cleanup_before_it_exists(shm_dir, monkeypatch):
    """A worker killed between creating its file and registering it would leave the file for
    good: the registration comes first (and is withdrawn when the file cannot be made)."""
    registered = []
    real_track = shared._track

    def track(path):
        registered.append((path, os.path.exists(path)))
        return real_track(path)

    monkeypatch.setattr(shared, "_track", track)
    result = share([np.arange(10, dtype=np.uint8)], file_prefix("order_"))
    assert registered and registered[0] == (result.path, False)
    result.open()
    assert not os.path.exists(result.path)
