"""The background feed: items in order, errors at their place, clean-up in the feed's thread."""

from __future__ import annotations

import threading

import pytest
import torch

from detaug.feeder import BackgroundFeed, FeedStats

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


def test_an_exit_while_a_loaders_feed_runs_is_clean(tmp_path):
    """The feeds are stopped at exit before DALI shuts its pipelines down (the exit hook is
    registered with the first feed, after DALI's, so it runs first): no DALI assertion."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import detaug.transforms as T\n"
        "from detaug.synthetic import write_voc_dataset\n"
        "from detaug.sources import VocSource\n"
        "from detaug.torch import DetectionLoader\n"
        f"write_voc_dataset({str(tmp_path)!r}, num_images=24, size=((480, 640), (400, 560)), image_format='png',\n"
        "                  splits={'train': 1.0})\n"
        f"loader = DetectionLoader(VocSource({str(tmp_path)!r}, 'train'), T.Compose([T.Resize((256, 256))]), 4,\n"
        "                         device='cpu', num_threads=1)\n"
        "print(tuple(next(iter(loader))[0].shape))\n"
    )
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert run.returncode == 0 and run.stdout.split("\n")[0] == "(4, 3, 256, 256)", run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr[-3000:]


def test_the_takes_that_found_no_item_ready_are_counted_with_their_wait():
    release = threading.Event()

    def produce():
        yield "ready"
        release.wait()  # the second item comes only once the caller has asked for it
        yield "late"

    stats = FeedStats()
    feed = BackgroundFeed(produce, 2, CPU, stats=stats)
    threading.Event().wait(0.2)  # the first item is queued
    assert feed.take() == "ready"
    assert (stats.taken, stats.not_ready, stats.waited_s) == (1, 0, 0.0)
    threading.Timer(0.2, release.set).start()
    assert feed.take() == "late"
    assert stats.taken == 2 and stats.not_ready == 1 and 0.15 <= stats.waited_s < 5
    with pytest.raises(StopIteration):
        feed.take()
    assert stats.taken == 2  # the end is not an item
    feed.stop()
    own = BackgroundFeed(lambda: iter(()), 1, CPU)
    assert own.stats == FeedStats()  # a feed of its own counts from zero
    own.stop()


def test_what_the_caller_retires_is_freed_in_the_feeds_thread_unless_it_still_holds_it():
    import weakref

    freed_in: dict[str, str] = {}

    class Batch:  # stands for a batch's targets
        pass

    def retired(name: str, keep: bool) -> Batch | None:
        item = Batch()
        weakref.finalize(item, lambda: freed_in.setdefault(name, threading.current_thread().name))
        feed.retire(item)
        return item if keep else None

    feed = BackgroundFeed(lambda: iter(range(1000)), 1, CPU)
    assert feed.take() == 0
    retired("let go", keep=False)
    held = retired("held", keep=True)
    assert feed.take() == 1  # frees a slot: the feed's thread wakes
    for _ in range(100):
        if "let go" in freed_in:
            break
        threading.Event().wait(0.02)
    assert freed_in == {"let go": "detaug-feed"}  # the one the caller still holds lives on
    del held
    assert freed_in["held"] == threading.current_thread().name  # freed where its last reference went
    feed.stop()
