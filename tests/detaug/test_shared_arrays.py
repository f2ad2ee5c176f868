"""detaug.shared_arrays: arrays written by one process into a ring of files, read as views by
another; a file is written again only once no view of it is left."""

from __future__ import annotations

import gc
import os
import pickle

import numpy as np
import pytest

import detaug.shared_arrays as shared
from detaug.shared_arrays import SlotRing, file_prefix, sweep, write_arrays


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """A stand-in for /dev/shm: the same calls work on any directory."""
    monkeypatch.setattr(shared, "SHM_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def ring(shm_dir):
    ring = SlotRing(file_prefix("t_"))
    yield ring
    ring.close()


def _arrays(seed: int = 0, scale: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 256, 1001 * scale, dtype=np.uint8),  # an odd length: the next array is aligned anyway
        rng.random((5, 4), dtype=np.float32),
        np.zeros((0, 4), np.float32),
        rng.integers(-9, 9, (3, 2), dtype=np.int64)[:, ::-1],  # not contiguous
        rng.integers(0, 256, (7, 6, 3), dtype=np.uint8),
    ]


def _same(got: list[np.ndarray], sent: list[np.ndarray]) -> None:
    assert len(got) == len(sent)
    for g, s in zip(got, sent):
        assert g.dtype == s.dtype and g.shape == s.shape and not g.flags.writeable
        np.testing.assert_array_equal(g, s)


def test_arrays_come_back_equal_as_read_only_views(ring):
    arrays = _arrays()
    slot = ring.take()
    handle = write_arrays(slot, arrays)
    assert handle is not None and handle.path == slot
    assert all(offset % 64 == 0 for offset in handle.offsets)
    _same(ring.open(pickle.loads(pickle.dumps(handle))), arrays)  # as the parent gets it


def test_a_slot_is_leased_until_the_last_view_of_it_goes_then_written_again(ring):
    """The parent writes no slot twice while something reads it: a slot taken, written and
    opened stays leased while any view (or a view of a view) lives, and the next job gets it
    only then; the file stays, mapped once, and a job larger than the file grows it."""
    slot = ring.take()
    views = ring.open(write_arrays(slot, _arrays(0)))
    kept = views[1][2:].T  # a view of a view
    del views
    gc.collect()
    assert ring.leased == 1
    other = ring.take()
    assert other != slot and len(ring) == 2  # the first is still read: a new file
    ring.give_back(slot)  # ignored while views live
    assert ring.leased == 2
    np.testing.assert_array_equal(kept, _arrays(0)[1][2:].T)
    del kept
    assert ring.leased == 1  # freed when the last view went
    ring.give_back(other)  # never opened: freed at once
    assert ring.leased == 0
    again = ring.take()
    assert again in (slot, other) and len(ring) == 2  # reused, no new file
    bigger = _arrays(1, scale=300)
    _same(ring.open(write_arrays(again, bigger)), bigger)  # grown and mapped again
    assert os.path.getsize(again) >= sum(a.nbytes for a in bigger)
    assert sorted(os.listdir(os.path.dirname(slot))) == sorted(os.path.basename(p) for p in (slot, other))


def test_opening_again_while_views_live_gives_views_of_the_same_lease(ring):
    slot = ring.take()
    handle = write_arrays(slot, _arrays())
    first = ring.open(handle)
    second = ring.open(handle)
    _same(second, _arrays())
    del first
    assert ring.leased == 1  # the second views hold it
    del second
    assert ring.leased == 0


def test_without_room_or_a_directory_nothing_is_shared_or_left(ring, shm_dir, monkeypatch):
    slot = ring.take()
    assert write_arrays(slot, []) is None
    assert write_arrays(slot, [np.zeros(0, np.uint8)]) is None

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    monkeypatch.setattr(os, "writev", full)
    assert write_arrays(slot, _arrays()) is None
    monkeypatch.undo()
    ring.close()
    assert list(shm_dir.iterdir()) == []
    with pytest.raises(FileNotFoundError):  # a slot removed is not made again by a worker
        write_arrays(slot, _arrays())
    assert ring.take() is None  # closed
    monkeypatch.setattr(shared, "SHM_DIR", str(shm_dir / "missing"))
    assert SlotRing(file_prefix("t_")).take() is None


def test_close_removes_the_files_and_views_held_stay_valid(ring, shm_dir):
    arrays = _arrays()
    held = ring.open(write_arrays(ring.take(), arrays))
    ring.take()
    ring.close()
    assert list(shm_dir.iterdir()) == []
    _same(held, arrays)


def test_sweep_removes_the_files_of_one_prefix_only(shm_dir):
    mine, other = SlotRing(file_prefix("a_")), SlotRing(file_prefix("b_"))
    paths = [mine.take() for _ in range(3)]
    theirs = other.take()
    assert sweep(file_prefix("a_")) == 3
    assert not any(os.path.exists(p) for p in paths)
    assert os.path.exists(theirs)
    assert sweep(file_prefix("b_")) == 1


def test_a_file_is_registered_for_cleanup_before_it_exists(shm_dir, monkeypatch):
    """A run killed between making a slot's file and registering it would leave the file for
    good: the registration comes first (and is withdrawn when the file cannot be made)."""
    registered, withdrawn = [], []
    real_track, real_untrack = shared._track, shared._untrack

    def track(path):
        registered.append((path, os.path.exists(path)))
        return real_track(path)

    def untrack(path):
        withdrawn.append(path)
        real_untrack(path)

    monkeypatch.setattr(shared, "_track", track)
    monkeypatch.setattr(shared, "_untrack", untrack)
    ring = SlotRing(file_prefix("order_"))
    path = ring.take()
    assert registered == [(path, False)] and os.path.exists(path)
    ring.close()
    assert withdrawn == [path] and not os.path.exists(path)
