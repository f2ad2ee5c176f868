"""Plumbing of ``detaug bench`` on the CPU: no timing is asserted anywhere.

The variants' outputs are checked for shape, dtype and box geometry on synthetic images: objects
are saturated colours on a grey background, so after augmentation every output box must lie on
coloured pixels, and the pixels inside the boxes must be mostly coloured.
"""

from __future__ import annotations

import importlib.util
import json
from itertools import islice

import numpy as np
import pytest
import torch

from detaug.bench import runner
from detaug.bench.dataset import BenchDataset, load_records, prepare_dataset
from detaug.bench.harness import (
    BenchSettings,
    Measurement,
    VariantUnavailable,
    count_images,
    measure,
)
from detaug.bench.recipe import RecipeSpec
from detaug.bench.runner import CHECKS, VARIANTS, Variant, _run_variant, main, run_bench
from detaug.synthetic import write_coco_dataset

SIZE = 512
BATCH = 4


def _installed(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except (ImportError, ValueError):
        return False


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> BenchDataset:
    root = tmp_path_factory.mktemp("bench_data")
    write_coco_dataset(
        root, num_images=16, size=(600, 420), min_objects=1, max_objects=11, seed=0, progress=False
    )
    return prepare_dataset(root)


def _settings(**kw) -> BenchSettings:
    base = {"device": "cpu", "batch_size": BATCH, "workers": 0, "threads": 2, "size": SIZE, "seed": 0}
    return BenchSettings(**{**base, **kw})


def _check_batch(images: torch.Tensor, targets: list[dict], batch_size: int = BATCH) -> None:
    """Shapes, dtypes, boxes inside the image, and boxes on the coloured objects."""
    assert images.shape == (batch_size, 3, SIZE, SIZE)
    assert images.dtype == torch.float32
    assert len(targets) == batch_size
    spec = RecipeSpec()
    mean = torch.tensor(spec.mean).view(3, 1, 1)
    std = torch.tensor(spec.std).view(3, 1, 1)
    rgb = (images.cpu() * std + mean) * 255.0
    coloured = (rgb.max(1).values - rgb.min(1).values) > 60  # [B, H, W]
    inside = torch.zeros_like(coloured)
    for k, target in enumerate(targets):
        boxes, labels = target["boxes"], target["labels"]
        assert boxes.dtype == torch.float32 and boxes.ndim == 2 and boxes.shape[1] == 4
        assert labels.dtype == torch.int64 and labels.shape == (boxes.shape[0],)
        assert (boxes >= -1e-3).all() and (boxes <= SIZE + 1e-3).all()  # inside the image
        assert (boxes[:, 2:] - boxes[:, :2] >= 1.0).all()
        for x0, y0, x1, y1 in boxes.round().int().tolist():
            inside[k, y0:y1, x0:x1] = True
            # every box of 8+ pixels is on an object (slivers at the border, and the empty corner
            # of the box of a rotated object almost out of the image, may show no colour)
            if min(x1 - x0, y1 - y0) >= 8:
                assert coloured[k, y0:y1, x0:x1].float().mean() > 0.05
    # over the batch, the boxes hold mostly object pixels (about 0.8; 0.68 the lowest seen)
    assert coloured[inside].float().mean() > 0.5


# ------------------------------------------------------------------------------------------
# harness
# ------------------------------------------------------------------------------------------


class TestMeasure:
    @staticmethod
    def _batches(log: list[str], size: int = 3):
        try:
            while True:
                yield torch.zeros(size, 2), [{}] * size
        finally:
            log.append("closed")

    def test_counts_whole_quanta_and_closes(self):
        log: list[str] = []
        ticks = iter(range(100))
        m = measure(
            self._batches(log),
            images=10,
            warmup_batches=2,
            batch_quantum=5,
            device="cpu",
            clock=lambda: float(next(ticks)),
        )
        # 4 batches reach 10 images; the quantum rounds up to 5 batches
        assert (m.batches, m.images) == (5, 15)
        assert m.seconds == 1.0 and m.images_per_second == 15.0
        assert m.gpu_mem_mib is None and m.torch_peak_mib is None
        assert log == ["closed"]

    def test_closes_on_error(self):
        log: list[str] = []

        def failing():
            try:
                yield torch.zeros(2, 1)
                raise RuntimeError("boom")
            finally:
                log.append("closed")

        with pytest.raises(RuntimeError, match="boom"):
            measure(failing(), images=5, warmup_batches=1)
        assert log == ["closed"]

    @pytest.mark.parametrize(
        "batch, expected",
        [
            ((torch.zeros(4, 3), [{}] * 4), 4),
            ([np.zeros((2, 5)), None], 2),
            ({"images": np.zeros((7, 1))}, 7),
            (torch.zeros(3), 3),
        ],
    )
    def test_count_images(self, batch, expected):
        assert count_images(batch) == expected

    def test_count_images_rejects_scalars(self):
        with pytest.raises(TypeError):
            count_images(5)

    def test_settings_validation(self):
        with pytest.raises(ValueError, match="device"):
            BenchSettings(device="tpu")
        with pytest.raises(ValueError, match="batch_size"):
            BenchSettings(batch_size=0)


# ------------------------------------------------------------------------------------------
# dataset
# ------------------------------------------------------------------------------------------


class TestDataset:
    def test_generates_once_into_the_cache(self, tmp_path):
        first = prepare_dataset(None, num_images=3, cache_dir=tmp_path, progress=False)
        assert first.generated and first.num_images == 3
        assert first.min_size == first.max_size == (600, 420)
        assert 1 <= first.max_boxes <= 11
        stamp = first.annotations_file.stat().st_mtime_ns
        again = prepare_dataset(None, num_images=3, cache_dir=tmp_path, progress=False)
        assert again.root == first.root and again.annotations_file.stat().st_mtime_ns == stamp
        assert "3 COCO-style JPEGs, 600x420" in again.describe()

    def test_rejects_a_folder_without_the_layout(self, tmp_path):
        with pytest.raises(ValueError, match="annotations.json and images/"):
            prepare_dataset(tmp_path)

    def test_records_are_absolute_xyxy(self, dataset):
        records = load_records(dataset)
        assert len(records) == dataset.num_images
        boxes = np.concatenate([r.boxes_xyxy for r in records])
        assert boxes.shape == (dataset.num_boxes, 4)
        assert (boxes[:, 2:] > boxes[:, :2]).all() and boxes[:, 2].max() <= 600


# ------------------------------------------------------------------------------------------
# variants
# ------------------------------------------------------------------------------------------


def test_raw_dali_cpu(dataset):
    from detaug.bench.raw_dali import iter_raw_dali

    batches = iter_raw_dali(dataset, _settings())
    try:
        for images, targets in islice(batches, 3):
            _check_batch(images, targets)
    finally:
        batches.close()
    m = measure(iter_raw_dali(dataset, _settings()), images=8, warmup_batches=1, device="cpu")
    assert m.images == 8 and m.images_per_second > 0


@pytest.mark.skipif(not _installed("torchvision"), reason="torchvision is not installed")
def test_torchvision_peer(dataset):
    from detaug.bench.peers import iter_torchvision

    batches = iter_torchvision(dataset, _settings())
    try:
        for images, targets in islice(batches, 2):
            _check_batch(images, targets)
    finally:
        batches.close()


@pytest.mark.skipif(not _installed("albumentations", "cv2"), reason="albumentations is not installed")
def test_albumentations_peer(dataset):
    from detaug.bench.peers import iter_albumentations

    batches = iter_albumentations(dataset, _settings())
    try:
        for images, targets in islice(batches, 2):
            _check_batch(images, targets)
    finally:
        batches.close()


@pytest.mark.skipif(not _installed("torchvision"), reason="torchvision is not installed")
def test_peer_with_workers_in_whole_waves(dataset):
    m = _run_variant(
        _variant("torchvision"), dataset, _settings(workers=2), images=4, warmup=1, log=print
    ).measurement
    assert m is not None and m.batches % 2 == 0 and m.images_per_second > 0


@pytest.mark.skipif(not _installed("detaug.torch"), reason="detaug.torch is not there yet")
def test_detaug_iterator_cpu(dataset):
    from detaug.bench.detaug_variants import iter_detaug

    batches = iter_detaug(dataset, _settings())
    try:
        for images, targets in islice(batches, 5):  # crosses the end of the 4-batch epoch
            _check_batch(images, targets)
    finally:
        batches.close()


@pytest.mark.skipif(not _installed("detaug.keras", "keras"), reason="Keras is not installed")
@pytest.mark.parametrize("mode", ["fit", "numpy", "serial"])
def test_sequence_cpu(dataset, mode):
    """Every Sequence variant crosses an epoch's end (4 batches) with whole batches; through
    Keras' adapter (``fit``) the batches arrive as tensors, as fit receives them."""
    import torch

    from detaug.bench.detaug_variants import iter_sequence

    batches = iter_sequence(dataset, _settings(), mode=mode)
    try:
        for images, targets in islice(batches, 5):
            assert count_images((images, targets)) == BATCH
            assert isinstance(images, torch.Tensor if mode == "fit" else np.ndarray)
            assert targets["boxes"].shape[:2] == targets["labels"].shape and targets["boxes"].shape[0] == BATCH
    finally:
        batches.close()


# ------------------------------------------------------------------------------------------
# runner and command line
# ------------------------------------------------------------------------------------------


def _variant(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def _unavailable(dataset, settings):
    raise VariantUnavailable("not installed (pip install nothing)")
    yield  # pragma: no cover


def _broken(dataset, settings):
    yield torch.zeros(BATCH, 1)
    raise RuntimeError("broken on purpose")


@pytest.mark.parametrize(
    "factory, status, message",
    [("_unavailable", "unavailable", "pip install nothing"), ("_broken", "error", "broken on purpose")],
)
def test_a_failing_variant_becomes_a_row(dataset, factory, status, message):
    variant = Variant("x", "x", "detaug", f"{__name__}:{factory}")
    result = _run_variant(variant, dataset, _settings(), images=8, warmup=1, log=lambda msg: None)
    assert result.status == status and message in result.message and result.measurement is None


def test_run_bench_raw_dali_report(dataset, tmp_path):
    report = run_bench(
        data=dataset.root,
        device="cpu",
        only=["raw-dali", "torchvision"],
        images=8,
        batch_size=BATCH,
        workers=0,
        threads=2,
        warmup=1,
        log=lambda msg: None,
    )
    raw = report.result("raw-dali")
    assert raw.status == "ok" and raw.images_per_second > 0 and raw.vs_raw_dali == pytest.approx(1.0)
    tv = report.result("torchvision")
    if not _installed("torchvision"):
        assert tv.status == "unavailable" and "pip install torchvision" in tv.message
    text = report.format()
    assert "raw DALI" in text and "img/s" in text and "CPUs:" in text
    lines = [c.line() for c in report.checks]
    assert len(lines) == len(CHECKS)
    assert lines[0].startswith("detaug (COCO reader) / raw DALI: n/a (detaug not run)")
    json.dumps(report.to_dict())  # serialisable


def test_main_writes_json(dataset, tmp_path, capsys):
    out = tmp_path / "bench.json"
    status = main(
        [
            "--data",
            str(dataset.root),
            "--device",
            "cpu",
            "--only",
            "raw-dali",
            "--images",
            "4",
            "--batch-size",
            "4",
            "--threads",
            "1",
            "--warmup",
            "1",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "detaug (sample list) / raw DALI" in printed and "Sequence in fit / iterator (COCO reader)" in printed
    results = json.loads(out.read_text())
    assert results["settings"]["batch_size"] == 4
    assert [r["variant"] for r in results["results"]] == ["raw-dali"]
    assert results["results"][0]["images_per_second"] > 0


def test_main_rejects_unknown_variants(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--only", "bogus", "--device", "cpu"])
    assert exc.value.code == 2
    assert "unknown variant" in capsys.readouterr().err


def test_gpu_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(runner, "cuda_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        run_bench(device="gpu", only=["raw-dali"])


def test_measure_needs_a_warmup_batch():
    with pytest.raises(ValueError, match="warmup_batches"):
        measure(iter([torch.zeros(1)]), images=1, warmup_batches=0)


def test_measurement_rate_is_images_over_seconds():
    assert Measurement(images=10, batches=2, seconds=2.0, warmup_seconds=0.0).images_per_second == 5.0
