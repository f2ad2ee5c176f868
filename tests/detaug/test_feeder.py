"""The background feed: items in order, errors at their place, clean-up in the feed's thread."""

from __future__ import annotations

import threading

import pytest
import torch

from detaug.feeder import BackgroundFeed

CPU = torch.device("cpu")


def test_items_come_in_order_then_the_end():
    feed = BackgroundFeed(lambda: iter(range(5)), 2, CPU)
    assert [feed.take() for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(StopIteration):
        feed.take()
    with pytest.raises(StopIteration):  # and again: the feed has ended
        feed.take()
    feed.stop()
    assert not feed.alive


def test_an_error_comes_after_the_items_made_before_it():
    def produce():
        yield "a"
        yield "b"
        raise ValueError("broken at the third")

    feed = BackgroundFeed(produce, 1, CPU)
    assert feed.take() == "a" and feed.take() == "b"
    with pytest.raises(ValueError, match="broken at the third"):
        feed.take()
    feed.stop()


def test_stop_closes_the_generator_in_the_feeds_thread_and_keeps_depth_items_at_most():
    made, closed_in = [], []

    def produce():
        try:
            for k in range(1000):
                made.append(k)
                yield k
        finally:
            closed_in.append(threading.current_thread().name)

    feed = BackgroundFeed(produce, 2, CPU)
    assert feed.take() == 0
    deadline = threading.Event()
    deadline.wait(0.3)  # the thread fills the queue, then waits
    assert len(made) <= 1 + 2 + 1  # taken, queued, and one waiting to be queued
    feed.stop()
    assert not feed.alive and closed_in == ["detaug-feed"]


def test_depth_is_checked():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        BackgroundFeed(lambda: iter(()), 0, CPU)
