"""The Keras rows of ``detaug bench --train``: the same network in Keras (torch backend,
:func:`~detaug.bench.train_model.keras_dense_detector`) in ``model.fit`` on one cached batch
(``keras-ceiling``) and on the bench's ``DetectionSequence`` (``sequence``), timed by a callback."""

from __future__ import annotations

import math
import os
import time
from typing import Any

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, VariantUnavailable, count_images
from detaug.bench.train_context import _Context, _Probe, _Timed, process_tree_cpu_seconds
from detaug.bench.train_model import keras_dense_detector


def _keras() -> Any:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except ImportError as exc:
        raise VariantUnavailable(f'Keras not installed (python3 -m pip install -e ".[keras]"): {exc}') from exc
    if keras.backend.backend() != "torch":
        raise VariantUnavailable(f"needs Keras' torch backend (KERAS_BACKEND=torch), this one is "
                                 f"{keras.backend.backend()}")
    return keras


def _sequence(dataset: BenchDataset, settings: BenchSettings) -> Any:
    """The bench's ``DetectionSequence`` (:func:`detaug.bench.detaug_variants.iter_sequence`'s
    settings), its planning workers started."""
    from detaug.bench.recipe import detaug_recipe
    from detaug.keras import DetectionSequence
    from detaug.sources import CocoSource

    source = CocoSource(str(dataset.annotations_file), str(dataset.images_dir), shuffle=True, seed=settings.seed)
    sequence = DetectionSequence(source, detaug_recipe("default", settings.size), batch_size=settings.batch_size,
                                 max_boxes=max(dataset.max_boxes, 1), device=settings.device, shuffle=True,
                                 seed=settings.seed, num_threads=settings.adapter_threads)
    sequence.start_workers()
    return sequence


def _timed_dataset(keras: Any, inner: Any, length: int | None = None) -> Any:
    """A Keras ``PyDataset`` that hands over ``inner[i]`` (``workers=1``: Keras asks for the
    batches in order, in its training thread), adding the time each took to ``.wait`` and its
    images to ``.images``."""

    class Timed(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(workers=1, use_multiprocessing=False)
            self.wait = 0.0
            self.images = 0

        def __len__(self) -> int:
            return len(inner) if length is None else length

        def __getitem__(self, index: int):
            before = time.perf_counter()
            batch = inner[index]
            self.wait += time.perf_counter() - before
            self.images += count_images(batch[0])
            return batch

        def on_epoch_end(self) -> None:
            end = getattr(inner, "on_epoch_end", None)
            if end is not None:
                end()

    return Timed()


class _Repeat:
    """One batch at every index."""

    def __init__(self, batch: tuple) -> None:
        self.batch = batch

    def __getitem__(self, index: int) -> tuple:
        return self.batch


def _time_keras(keras: Any, data: Any, ctx: _Context, size: int, warmup: int, steps: int, seed: int) -> _Timed:
    """``model.fit(data)`` of :func:`keras_dense_detector` for ``warmup + steps`` steps; the last
    ``steps`` timed by a callback (CUDA synchronised at both ends)."""
    probe = _Probe(ctx)
    try:
        keras.utils.set_random_seed(seed)
        model = keras_dense_detector(size, dtype="mixed_bfloat16" if ctx.cuda else None)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9))
        clock: dict[str, float] = {}

        class Timer(keras.callbacks.Callback):
            done = 0

            def on_train_batch_end(self, batch, logs=None):
                self.done += 1
                if self.done == warmup:
                    ctx.sync()
                    clock.update(start=time.perf_counter(), wait=data.wait, images=data.images,
                                 cpu=process_tree_cpu_seconds())
                elif self.done == warmup + steps:
                    ctx.sync()
                    clock.update(stop=time.perf_counter(), wait=data.wait - clock["wait"],
                                 images=data.images - clock["images"], cpu=process_tree_cpu_seconds() - clock["cpu"])
                    self.model.stop_training = True

        timer = Timer()
        epochs = math.ceil((warmup + steps) / len(data))
        # on CUDA's default stream whatever --train-stream says: the Sequence hands its device
        # batches over to that stream (detaug.keras.pipeline_queue)
        model.fit(data, epochs=epochs, shuffle=False, verbose=0, callbacks=[timer])
        if "stop" not in clock:
            raise RuntimeError(f"fit stopped after {timer.done} of {warmup + steps} steps")
        seconds = clock["stop"] - clock["start"]
        return probe.finish(_Timed(int(clock["images"]), steps, seconds, clock["wait"], clock["cpu"]))
    finally:
        probe.sampler.stop()
