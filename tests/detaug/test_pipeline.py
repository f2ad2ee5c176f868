"""detaug.pipeline: feeding planned batches to the real DALI pipeline (CPU here; GPU with
``DETAUG_TEST_DEVICE=gpu``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import detaug.pipeline as pipeline
import detaug.transforms as T
from detaug.pipeline import build_pipeline, feed, feed_first_run
from detaug.seeds import sample_keys

DEVICE = os.environ.get("DETAUG_TEST_DEVICE", "cpu")


class DecodedSource:
    """What ``build_pipeline`` reads of a source: decoded HWC arrays, no EXIF."""

    decoded = True
    orientation = "ignore"


class _Batch:
    """What ``feed_first_run`` reads of a planned batch."""

    def __init__(self, data, params):
        self.data, self.params, self.partners = data, params, None


def _batches(recipe, count: int, n: int = 3) -> list[_Batch]:
    rng = np.random.default_rng(7)
    out = []
    for b in range(count):
        images = [rng.integers(0, 256, (10 + 3 * i, 14 + b, 3), dtype=np.uint8) for i in range(n)]
        boxes = [np.array([[1, 1, 6, 5]], np.float32)] * n
        labels = [np.array([1], np.int32)] * n
        params, _, _ = recipe.plan_batch([np.array(im.shape) for im in images], boxes, labels,
                                         sample_keys(0, b, np.arange(1, n + 1)))
        out.append(_Batch(images, np.stack(params)))
    return out


def _run(recipe, batches: list[_Batch]) -> list[list[np.ndarray]]:
    """The outputs of ``batches`` through a fresh pipeline of depth 2, as the loader feeds it."""
    pipe = build_pipeline(DecodedSource(), recipe, batch_size=3, device=DEVICE, num_threads=1, layout="HWC",
                          prefetch_queue_depth=2)
    pipe.build()
    fillers = feed_first_run(pipe, batches[:2], 2)
    assert fillers == 0
    outputs = []
    for planned in batches[2:] + [None, None]:
        (out,) = pipeline.take_outputs(pipe)
        out = out.as_cpu() if DEVICE == "gpu" else out
        outputs.append([np.array(out[i]) for i in range(len(out))])
        if planned is not None:
            feed(pipe, planned.data, planned.params)
    return outputs


@pytest.fixture
def direct_run():
    before = pipeline._direct_run
    yield
    pipeline._direct_run = before


def test_the_direct_run_gives_what_the_public_calls_give(direct_run, monkeypatch):
    """After a pipeline's first ``schedule_run``, runs start and outputs come without DALI's
    public calls (each defines a class: garbage for the cycle collector), with the same outputs."""
    from nvidia.dali import Pipeline

    public: list[str] = []
    for name in ("schedule_run", "outputs"):
        def counted(self, *args, _call=getattr(Pipeline, name), _name=name, **kwargs):
            public.append(_name)
            return _call(self, *args, **kwargs)
        monkeypatch.setattr(Pipeline, name, counted)
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((12, 16)), T.ColorJitter(0.4, 0.4, 0.4, 0.1)])
    batches = _batches(recipe, 5)
    pipeline._direct_run = True
    direct = _run(recipe, batches)
    assert public == ["schedule_run"]  # the first run's: every later run and every output directly
    assert pipeline._direct_run
    public.clear()
    pipeline._direct_run = False
    public_outputs = _run(recipe, batches)
    assert public.count("schedule_run") == 4 and public.count("outputs") == 5
    assert_same_outputs(direct, public_outputs, 5)


def assert_same_outputs(got: list[list[np.ndarray]], want: list[list[np.ndarray]], batches: int) -> None:
    assert len(got) == len(want) == batches
    for got_batch, want_batch in zip(got, want):
        assert len(got_batch) == len(want_batch) == 3
        for a, b in zip(got_batch, want_batch):
            np.testing.assert_array_equal(a, b)


def _pipe_of_depth_1(recipe):
    pipe = build_pipeline(DecodedSource(), recipe, batch_size=3, device=DEVICE, num_threads=1, layout="HWC",
                          prefetch_queue_depth=1)
    pipe.build()
    return pipe


def test_outputs_past_the_runs_scheduled_stop_as_dalis_do(direct_run):
    recipe = T.Compose([T.Resize((12, 16))])
    batches = _batches(recipe, 2)
    pipe = _pipe_of_depth_1(recipe)
    feed_first_run(pipe, batches[:1], 1)
    pipeline.take_outputs(pipe)
    feed(pipe, batches[1].data, batches[1].params)  # a direct run
    pipeline.take_outputs(pipe)
    with pytest.raises(StopIteration):
        pipeline.take_outputs(pipe)  # nothing scheduled


@pytest.fixture
def direct_feed():
    before = pipeline._direct_feed
    yield
    pipeline._direct_feed = before


def test_the_direct_feed_gives_what_feed_input_gives(direct_feed):
    recipe = T.Compose([T.RandomHorizontalFlip(), T.Resize((12, 16)), T.ColorJitter(0.4, 0.4, 0.4, 0.1)])
    batches = _batches(recipe, 5)
    pipeline._direct_feed = True
    direct = _run(recipe, batches)
    assert pipeline._direct_feed  # the backend took the arrays: the direct path ran
    pipeline._direct_feed = False
    public = _run(recipe, batches)
    assert_same_outputs(direct, public, 5)


def test_a_backend_without_the_call_falls_back_to_feed_input(direct_feed):
    """Another DALI whose backend lacks (or changed) the call: feed_input feeds, from then on."""
    recipe = T.Compose([T.Resize((12, 16))])
    batches = _batches(recipe, 2)
    pipe = _pipe_of_depth_1(recipe)

    class OtherBackend:
        """The real backend, but the first feeding call refuses its arguments (as another
        DALI's might); feed_input's own calls then go through."""

        def __init__(self, real):
            self._real, self.refused = real, 0

        def __getattr__(self, name):
            call = getattr(self._real, name)
            if name == "SetExternalTLInput" and not self.refused:
                def refuse(*args):
                    self.refused += 1
                    raise TypeError("incompatible function arguments")
                return refuse
            return call

    real = pipe._pipe
    pipeline._direct_feed = True
    pipe._pipe = backend = OtherBackend(real)
    try:
        pipeline.feed_inputs(pipe, batches[0].data, batches[0].params)
    finally:
        pipe._pipe = real
    assert backend.refused == 1 and pipeline._direct_feed is False
    pipe.schedule_run()
    (out,) = pipe.outputs()
    assert len(out) == 3
