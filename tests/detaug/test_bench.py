"""Plumbing of ``detaug bench`` on the CPU: no timing is asserted anywhere.

The variants' outputs are checked for shape, dtype and box geometry on synthetic images: objects
are saturated colours on a grey background, so after augmentation every output box must lie on
coloured pixels, and the pixels inside the boxes must be mostly coloured.
"""

from __future__ import annotations

import importlib.util
import json
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

from detaug.bench import machine, runner
from detaug.bench.checks import _evaluate
from detaug.bench.dataset import BenchDataset, load_records, prepare_dataset
from detaug.bench.harness import (
    BenchSettings,
    Measurement,
    VariantUnavailable,
    count_images,
    measure,
)
from detaug.bench.recipe import RecipeSpec
from detaug.bench.runner import CHECKS, VARIANTS, Variant, main, run_bench
from detaug.bench.session import _planned
from detaug.bench.variant_runs import _cores, _describe, _fill_ratios, _run_variant
from detaug.bench.variants import _variant as bench_variant
from detaug.synthetic import write_coco_dataset
from tests.detaug.bench.json_doc import check_documented

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


def _check_batches(batches, n: int) -> None:
    """:func:`_check_batch` on the first ``n`` batches of a variant's iterator, closed after."""
    try:
        for images, targets in islice(batches, n):
            _check_batch(images, targets)
    finally:
        batches.close()


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

    _check_batches(iter_raw_dali(dataset, _settings()), 3)
    m = measure(iter_raw_dali(dataset, _settings()), images=8, warmup_batches=1, device="cpu")
    assert m.images == 8 and m.images_per_second > 0


@pytest.mark.skipif(not _installed("torchvision"), reason="torchvision is not installed")
def test_torchvision_peer(dataset):
    from detaug.bench.torchvision_peers import iter_torchvision

    _check_batches(iter_torchvision(dataset, _settings()), 2)


@pytest.mark.skipif(not _installed("albumentations", "cv2"), reason="albumentations is not installed")
def test_albumentations_peer(dataset):
    from detaug.bench.albumentations_peers import iter_albumentations

    _check_batches(iter_albumentations(dataset, _settings()), 2)


@pytest.mark.skipif(not _installed("torchvision"), reason="torchvision is not installed")
def test_peer_with_workers_in_whole_waves(dataset):
    m = _run_variant(
        _variant("torchvision"), dataset, _settings(workers=2), images=4, warmup=1, log=print
    ).measurement
    assert m is not None and m.batches % 2 == 0 and m.images_per_second > 0


@pytest.mark.skipif(not _installed("detaug.torch"), reason="detaug.torch is not there yet")
def test_detaug_iterator_cpu(dataset):
    from detaug.bench.detaug_variants import iter_detaug

    _check_batches(iter_detaug(dataset, _settings()), 5)  # crosses the end of the 4-batch epoch


@pytest.mark.skipif(not _installed("detaug.keras", "keras"), reason="Keras is not installed")
@pytest.mark.parametrize("mode", ["fit", "shuffled", "numpy"])
def test_sequence_cpu(dataset, mode):
    """Every Sequence variant crosses an epoch's end (4 batches) with whole batches; through
    Keras' adapter (``fit``, ``shuffled``) the batches arrive as tensors, as fit receives them."""
    import torch

    from detaug.bench.detaug_variants import iter_sequence

    batches = iter_sequence(dataset, _settings(), mode=mode)
    try:
        for images, targets in islice(batches, 5):
            assert count_images((images, targets)) == BATCH
            assert isinstance(images, np.ndarray if mode == "numpy" else torch.Tensor)
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
    assert len(lines) == len([c for c in CHECKS if not c.memory_mib])  # GPU memory: in a GPU run only
    assert lines[0].startswith("detaug (COCO reader) / decode limit: n/a (detaug not run)")
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
    assert "detaug (sample list) / decode limit" in printed and "Sequence in fit / iterator (COCO reader)" in printed
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
    monkeypatch.setattr(machine, "cuda_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        run_bench(device="gpu", only=["raw-dali"])


def test_measure_needs_a_warmup_batch():
    with pytest.raises(ValueError, match="warmup_batches"):
        measure(iter([torch.zeros(1)]), images=1, warmup_batches=0)


def test_this_torch_has_a_call_that_frees_its_page_locked_host_cache():
    """The harness frees torch's cache of pinned host memory between variants (the CPU peers
    pin every batch; left cached, it slowed the Keras Sequence timed after them by a quarter on
    an H100). The call is private: a torch that renames it fails here, not silently there."""
    from detaug.bench.harness import HOST_CACHE_EMPTIERS

    assert any(callable(getattr(torch._C, name, None)) for name in HOST_CACHE_EMPTIERS), torch.__version__


def test_measurement_rate_is_images_over_seconds():
    assert Measurement(images=10, batches=2, seconds=2.0, warmup_seconds=0.0).images_per_second == 5.0


# ------------------------------------------------------------------------------------------
# --data as users have it, the decode limit, ratios, per-core and memory figures (issue 16)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def coco_elsewhere(tmp_path_factory, voc_folder) -> tuple[Path, Path]:
    """A COCO JSON in one folder, its images in another (the VOC folder's JPEGImages/)."""
    from converters.voc2coco import convert

    result = convert(voc_folder)
    json_file = tmp_path_factory.mktemp("coco_json") / "instances.json"
    json_file.write_text(json.dumps(result.coco), encoding="utf-8")
    return json_file, Path(result.image_root)


def _bench_json(tmp_path: Path, *args: str) -> dict:
    """``detaug bench ARGS --json FILE`` through the command line's entry point; its JSON."""
    from detaug import cli

    out = tmp_path / "bench.json"
    status = cli.main(["bench", "--device", "cpu", "--quiet", "--json", str(out), *args])
    assert status == 0
    return json.loads(out.read_text(encoding="utf-8"))


def _check_figures(results: dict, batch_sizes: list[int]) -> None:
    """The decode limit with its settings, ratios that are img/s over img/s, per-core figures of
    the CPU paths, memory fields (no GPU figure, with a reason, on the CPU)."""
    assert results["schema"] == "detaug-bench/3"
    assert results["settings"]["batch_sizes"] == batch_sizes
    decode = results["decode"]
    assert decode["status"] == "ok" and decode["img_per_s"] > 0
    assert set(decode["settings"]) >= {"hw_decoder_load", "num_threads", "window"}
    assert decode["settings"]["hw_decoder_load"] is None  # the CPU decoder has no hardware share
    assert isinstance(decode["settings"]["window"], bool) and decode["settings"]["num_threads"] in (1, 2)
    assert decode["img_per_s"] == max(e["img_per_s"] for e in decode["sweep"] if e["img_per_s"] is not None)
    assert {e["settings"]["window"] for e in decode["sweep"]} == {False, True}  # the recipe crops first
    assert len(results["runs"]) == len(batch_sizes)
    for run in results["runs"]:
        rows = {r["variant"]: r for r in run["results"]}
        limit = rows["decode"]["img_per_s"]
        assert rows["decode"]["settings"] == run["decode"]["settings"]
        assert rows["detaug"]["status"] == "ok"
        assert "detaug-cpu" not in rows  # on the CPU the same loader as detaug: one row (issue 38, 9)
        assert rows["torchvision-gpu"]["status"] == "unavailable"
        for row in run["results"]:
            assert row["batch_size"] == run["batch_size"]
            assert row["memory"]["gpu_peak_mib"] is None and row["memory"]["gpu_note"] == "no GPU in this run"
            if row["status"] != "ok":
                assert row["img_per_s"] is None and row["message"]
                continue
            assert row["vs_decode"] == pytest.approx(row["img_per_s"] / limit)
            assert row["device"] == "cpu" and row["cpu_cores"] >= 1
            assert row["img_per_s_per_core"] == pytest.approx(row["img_per_s"] / row["cpu_cores"])
            assert row["memory"]["host_peak_rss_mib"] > 0
            assert row["images"] >= 8
        peers = [r["img_per_s"] for r in run["results"] if r["kind"] == "cpu-peer" and r["status"] == "ok"]
        for row in run["results"]:
            if row["status"] == "ok":
                expected = row["img_per_s"] / max(peers) if peers else None
                assert row["vs_best_cpu_peer"] == (pytest.approx(expected) if peers else None)
        for peer in ("torchvision", "albumentations"):
            assert "1 thread" in rows[peer]["runs"] and "decode" in rows[peer]["runs"]
    assert {c["batch_size"] for c in results["checks"]} == set(batch_sizes)


def test_bench_on_a_voc_folder(voc_folder, tmp_path):
    results = _bench_json(tmp_path, "--data", str(voc_folder), "--repeat-to", "12", "--batch-sizes", "4,8",
                          "--images", "8", "--warmup", "1", "--threads", "2", "--workers", "1", "--size", "128",
                          "--only", "decode,detaug,detaug-list,detaug-cpu,raw-dali,torchvision,albumentations,"
                          "torchvision-gpu")
    _check_figures(results, [4, 8])
    check_documented(results, "alone")  # every field named in docs/bench-json.md
    dataset = results["dataset"]
    assert dataset["num_images"] == 12 and dataset["source"] == str(voc_folder)
    assert not Path(dataset["root"]).exists()  # the links folder is gone with the run


def test_bench_on_a_coco_json_with_its_images_elsewhere(coco_elsewhere, tmp_path):
    json_file, images = coco_elsewhere
    results = _bench_json(tmp_path, "--data", str(json_file), "--images-dir", str(images), "--batch-sizes", "4",
                          "--images", "8", "--warmup", "1", "--threads", "2", "--workers", "1", "--size", "128")
    _check_figures(results, [4])
    assert results["dataset"]["source"].startswith(str(json_file))
    rows = {r["variant"]: r for r in results["results"]}
    assert rows["sequence"]["status"] == "ok" or not _installed("keras")


def test_the_dataset_links_the_original_files(coco_elsewhere, tmp_path):
    json_file, images = coco_elsewhere
    dataset = prepare_dataset(json_file, images_dir=images, repeat_to=25, work_dir=tmp_path)
    files = sorted(dataset.images_dir.iterdir())
    assert len(files) == dataset.num_images == 25
    assert all(f.is_symlink() and f.resolve().parent == images.resolve() for f in files)
    assert dataset.unique_images < 25 and dataset.root == tmp_path / "bench-data"
    records = load_records(dataset)
    first, again = records[0], records[dataset.unique_images]
    assert Path(first.path).resolve() == Path(again.path).resolve()
    np.testing.assert_array_equal(first.boxes_xyxy, again.boxes_xyxy)
    cut = prepare_dataset(json_file, images_dir=images, repeat_to=3, work_dir=tmp_path)
    assert cut.num_images == cut.unique_images == 3


REALDATA = Path(__file__).resolve().parents[3] / "shared" / "realdata"


@pytest.mark.skipif(not REALDATA.is_dir(), reason="../shared/realdata is not here")
def test_realdata_leaves_out_what_would_break_a_peer(tmp_path):
    """The truncated JPEG and the tiny images are left out and counted; the rest is merged."""
    from detaug.bench.dataset import MIN_SIDE, realdata_folders

    dataset = prepare_dataset(realdata_folders(REALDATA), work_dir=tmp_path)
    assert dataset.left_out.get("not readable JPEGs", 0) >= 1
    assert dataset.left_out.get(f"under {MIN_SIDE} px a side", 0) >= 1
    assert min(dataset.min_size) >= MIN_SIDE and dataset.num_images >= 100
    with open(dataset.annotations_file, encoding="utf-8") as f:
        names = [c["name"] for c in json.load(f)["categories"]]
    assert len(names) == len(set(names)) and "raccoon" in names and "RBC" in names


def test_bad_data_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="Pascal VOC folder .* or a COCO JSON file"):
        prepare_dataset(tmp_path)
    with pytest.raises(ValueError, match="--images-dir goes with"):
        prepare_dataset(None, images_dir=tmp_path)
    with pytest.raises(ValueError, match="--repeat-to"):
        prepare_dataset(tmp_path, repeat_to=0)


def test_scaling_rows(dataset, tmp_path):
    results = _bench_json(tmp_path, "--data", str(dataset.root), "--only", "decode,detaug", "--batch-sizes", "4",
                          "--images", "4", "--warmup", "1", "--threads", "1", "--size", "64", "--scaling",
                          "--megapixels", "0.02,0.08", "--scaling-batch-sizes", "2,4")
    scaling = results["scaling"]
    mp = {(r["megapixels"], r["variant"]): r for r in scaling["megapixels"]}
    assert set(mp) == {(m, v) for m in (0.02, 0.08) for v in ("decode", "detaug")}
    for (megapixels, _), row in mp.items():
        w, h = row["size_wh"]
        assert row["status"] == "ok" and row["img_per_s"] > 0
        assert abs(w * h / 1e6 - megapixels) / megapixels < 0.05
    assert [(r["batch_size"], r["variant"]) for r in scaling["batch"]] == [
        (2, "decode"), (2, "detaug"), (4, "decode"), (4, "detaug")]
    assert all(r["status"] == "ok" for r in scaling["batch"])


def test_decode_sweep_grid(monkeypatch):
    from detaug.bench.decode import GPU_LOADS, recipe_crops_first, sweep_configs
    from detaug.decoding import HW_DECODER_ENV, decoder_options
    from detaug.transforms import Compose, RandomHorizontalFlip, RandomIoUCrop, Resize

    gpu = sweep_configs("gpu", 16, window=True)
    assert len(gpu) == len(GPU_LOADS) * 2 * 2
    assert {c.hw_decoder_load for c in gpu} == {0.0, 0.65, 0.8, 0.99} and {c.num_threads for c in gpu} == {8, 16}
    monkeypatch.delenv(HW_DECODER_ENV, raising=False)
    assert decoder_options(True)["hw_decoder_load"] in GPU_LOADS  # the loaders' own setting is swept
    cpu = sweep_configs("cpu", 1, window=False)
    assert [(c.num_threads, c.window, c.hw_decoder_load) for c in cpu] == [(1, False, None)]
    assert recipe_crops_first()
    assert not recipe_crops_first(Compose([RandomHorizontalFlip(), RandomIoUCrop(), Resize((64, 64))]))


def test_per_core_check_and_ratios_of_a_made_up_run():
    """detaug on the CPU against albumentations per core; ratios to the decode limit."""
    def row(name, ips, cores):
        m = Measurement(images=int(ips), batches=1, seconds=1.0, warmup_seconds=0.0)
        return runner.VariantResult(_variant(name), "ok", measurement=m, batch_size=8, cpu_cores=cores)

    results = [row("decode", 1000, 2), row("detaug-cpu", 120, 2), row("albumentations", 100, 4),
               row("torchvision", 80, 4)]
    _fill_ratios(results)
    assert results[1].vs_decode == pytest.approx(0.12) and results[1].vs_cpu_peer == pytest.approx(1.2)
    report = runner.BenchReport(BenchSettings(device="cpu", batch_size=8, workers=4, threads=2), None, {}, results)
    check = next(c for c in CHECKS if c.per_core)
    result = _evaluate(check, report)
    assert result.value == pytest.approx((120 / 2) / (100 / 4)) and result.passed


def _made_up_report(device: str) -> runner.BenchReport:
    """Rows far below every GPU target; detaug 0.25x albumentations per core."""
    def row(name, ips, cores=None):
        m = Measurement(images=int(ips), batches=1, seconds=1.0, warmup_seconds=0.0)
        return runner.VariantResult(_variant(name), "ok", measurement=m, batch_size=8, cpu_cores=cores)

    names = [n for n in ("decode", "detaug", "detaug-list", "detaug-cpu", "sequence", "albumentations", "torchvision")
             if device == "gpu" or n != "detaug-cpu"]
    rates = {"decode": (1000, 2), "detaug": (100, 2), "detaug-list": (100, 2), "detaug-cpu": (100, 2),
             "sequence": (10, None), "albumentations": (400, 2), "torchvision": (300, 2)}
    results = [row(n, *rates[n]) for n in names]
    _fill_ratios(results)
    report = runner.BenchReport(BenchSettings(device=device, batch_size=8, workers=2, threads=2), None, {}, results)
    report.checks = [_evaluate(c, report) for c in runner.checks_for(("default",), device)]
    return report


def test_a_cpu_run_prints_na_for_gpu_targets():
    """Issue 38, item 9: a CPU run shows a GPU target's value with "n/a", never FAIL, and
    ``--check`` ignores it; the per-core target, whose rows run on the CPU in every run, still
    passes or fails. The same rows on a GPU run fail."""
    cpu, gpu = _made_up_report("cpu"), _made_up_report("gpu")
    cpu_checks = {c.check.name: c for c in cpu.checks}
    gpu_checks = {c.check.name: c for c in gpu.checks}
    for name, check in cpu_checks.items():
        if check.check.gpu_only:
            assert check.passed is None and check.applies is False and check.to_dict()["applies"] is False
            assert "FAIL" not in check.line()
            if check.value is not None:
                assert check.line().endswith(": n/a on the CPU")
        else:
            assert check.passed is False and check.line().endswith(": FAIL")  # 0.25x per core
    coco = "detaug (COCO reader) / decode limit"
    assert cpu_checks[coco].value == pytest.approx(0.1) and cpu_checks[coco].line() == (
        "detaug (COCO reader) / decode limit = 0.10 (target >= 0.85): n/a on the CPU")
    assert gpu_checks[coco].passed is False and gpu_checks[coco].line().endswith(": FAIL")
    assert all(c.passed is False for c in gpu.checks if c.value is not None)
    assert [c.check.name for c in cpu.checks if not c.check.gpu_only] == [
        "detaug on the CPU / albumentations, per core"]
    # the CPU run's per-core check reads the detaug row, which is detaug-cpu there
    assert cpu.result("detaug-cpu") is cpu.result("detaug") is not None
    assert gpu.result("detaug-cpu").variant.name == "detaug-cpu"


def test_a_cpu_run_has_no_two_rows_of_one_loader():
    """Issue 38, item 9: in a CPU run ``detaug`` already is ``DetectionLoader(CocoSource,
    device="cpu")``, what ``detaug-cpu`` runs: one row for both (``detaug``); a GPU run keeps both."""
    def planned(device, only=runner.VARIANT_NAMES, recipes=("default", "yolo")):
        return [(v.recipe, v.name) for v in _planned(set(only), recipes, device)]

    cpu, gpu = planned("cpu"), planned("gpu")
    assert ("default", "detaug-cpu") in gpu and ("yolo", "detaug-cpu") in gpu and ("default", "detaug") in gpu
    assert [pair for pair in gpu if pair[1] != "detaug-cpu"] == cpu
    assert ("default", "detaug") in cpu and ("yolo", "detaug") in cpu
    assert planned("cpu", ["detaug-cpu"], ("default",)) == [("default", "detaug")]
    labels = [(v.recipe, v.label) for v in _planned(set(runner.VARIANT_NAMES), ("default", "yolo"), "cpu")]
    assert len(labels) == len(set(labels))
    assert "also the detaug-cpu row" in _variant("detaug").note_for("cpu")


def test_the_sequence_memory_check_passes_at_4_gib_and_needs_a_gpu_figure():
    """Issue 16: the Sequence in fit holds at most 4 GB of GPU memory: its row's peak above the
    start, in MiB; a CPU row has no figure and is n/a, not a pass."""
    check = next(c for c in CHECKS if c.memory_mib)

    def report(peak):
        m = Measurement(images=64, batches=1, seconds=1.0, warmup_seconds=0.0, gpu_peak_mib=peak)
        row = runner.VariantResult(_variant("sequence"), "ok", measurement=m, batch_size=64)
        return runner.BenchReport(BenchSettings(device="gpu", batch_size=64, workers=4, threads=2), None, {}, [row])

    results = [_evaluate(check, report(peak)) for peak in (2356.0, 4096.0, 7730.0, None)]
    assert [(r.value, r.passed) for r in results] == [(2356.0, True), (4096.0, True), (7730.0, False), (None, None)]
    assert results[2].line().endswith("= 7,730 (target <= 4096): FAIL") and "no GPU memory figure" in results[3].line()
    assert results[0].to_dict()["memory_mib"] is True


def test_a_gpu_report_says_when_the_loaders_ran_under_mps():
    """Under NVIDIA MPS the detaug loaders' default is a process of their own: a GPU report's
    settings line says so where the environment names a daemon; otherwise it says nothing."""
    data = BenchDataset(Path("d"), Path("d/i"), Path("d/a.json"), 2, 3, 2, (8, 8), (8, 8), 100, True)
    env = {"gpu": "a GPU", "cpus": 16, "versions": {}}
    said = {}
    for device, pipe in (("gpu", "/tmp/mps/control"), ("gpu", None), ("cpu", "/tmp/mps/control")):
        report = runner.BenchReport(BenchSettings(device=device, batch_size=8, workers=2, threads=2), data,
                                    {**env, "mps_control_pipe": pipe}, [])
        said[device, pipe] = "under NVIDIA MPS" in report.format().splitlines()[2]
    assert said == {("gpu", "/tmp/mps/control"): True, ("gpu", None): False, ("cpu", "/tmp/mps/control"): False}


def test_startup_is_routed(capsys):
    """``detaug bench --startup ...`` is the start-up benchmark's command line (its own options)."""
    with pytest.raises(SystemExit) as stop:
        main(["--startup", "--help"])
    assert stop.value.code == 0
    assert "--sizes" in capsys.readouterr().out


class _WorkerThreads(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        import os

        return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS")


def test_peer_workers_run_one_thread_each():
    from detaug.bench.peer_loader import pin_worker_threads

    # from a fork server, as the peers' workers are (a forked worker hangs in OpenCV when this process used it)
    loader = torch.utils.data.DataLoader(_WorkerThreads(), batch_size=None, num_workers=1,
                                         worker_init_fn=pin_worker_threads, multiprocessing_context="forkserver")
    assert [tuple(item) for item in loader] == [(1, "1", "1")] * 2


# ------------------------------------------------------------------------------------------
# --recipes default,yolo: the YOLO-style recipe beside the default one (issue 11)
# ------------------------------------------------------------------------------------------

YOLO_ROWS = ("decode", "detaug", "detaug-list", "detaug-cpu", "raw-dali", "albumentations", "albumentations-mosaic")


def test_yolo_recipe_beside_the_default_one(voc_folder, tmp_path, capsys):
    """Both recipes in one run: rows labelled by recipe, the YOLO rows' ratios to the default
    recipe and source images per second, the two YOLO checks; albumentations' Mosaic row is there
    (unavailable with its install line where albumentations is missing)."""
    from detaug.bench.albumentations_peers import PEERS_PIP

    results = _bench_json(tmp_path, "--data", str(voc_folder), "--repeat-to", "8", "--batch-sizes", "4",
                          "--recipes", "default,yolo", "--images", "8", "--warmup", "1", "--threads", "2",
                          "--workers", "1", "--size", "128", "--only", ",".join(YOLO_ROWS))
    printed = capsys.readouterr().out
    assert results["settings"]["recipes"] == ["default", "yolo"]
    assert results["settings"]["sizes"] == {"default": 128, "yolo": 128}
    rows = {(r["recipe"], r["variant"]): r for r in results["results"]}
    # detaug-cpu is the detaug row in a CPU run (the same loader)
    assert set(rows) == {(None, "decode"), *(("default", n) for n in YOLO_ROWS[1:6] if n != "detaug-cpu"),
                         *(("yolo", n) for n in ("detaug", "detaug-list", "albumentations-mosaic"))}
    limit = rows[None, "decode"]["img_per_s"]
    for name in ("detaug", "detaug-list"):
        yolo, default = rows["yolo", name], rows["default", name]
        assert yolo["status"] == default["status"] == "ok", (yolo["message"], default["message"])
        assert yolo["size"] == 128 and yolo["images"] >= 8
        assert yolo["vs_default_recipe"] == pytest.approx(yolo["img_per_s"] / default["img_per_s"])
        assert yolo["source_images_per_sample"] == pytest.approx(4.1)  # 4 tiles + 10% MixUp partners
        assert yolo["source_img_per_s"] == pytest.approx(4.1 * yolo["img_per_s"])
        assert yolo["sources_vs_decode"] == pytest.approx(yolo["source_img_per_s"] / limit)
        assert yolo["vs_decode"] == pytest.approx(yolo["img_per_s"] / limit)
        assert yolo["vs_raw_dali"] is None  # raw DALI runs the default recipe
        assert default["vs_default_recipe"] is None and default["source_img_per_s"] == default["img_per_s"]
    mosaic = rows["yolo", "albumentations-mosaic"]
    assert mosaic["kind"] == "cpu-peer" and "no MixUp" in mosaic["note"] and "Mosaic" in mosaic["runs"]
    if _installed("albumentations", "cv2"):
        assert mosaic["status"] == "ok" and mosaic["source_images_per_sample"] == 4.0
        assert rows["yolo", "detaug"]["vs_best_cpu_peer"] == pytest.approx(
            rows["yolo", "detaug"]["img_per_s"] / mosaic["img_per_s"])
    else:
        assert mosaic["status"] == "unavailable" and PEERS_PIP in mosaic["message"]
        assert f"albumentations missing: {PEERS_PIP}" in printed
        assert rows["yolo", "detaug"]["vs_best_cpu_peer"] is None  # the default recipe's peers do not count
    checks = {c["name"]: c for c in results["checks"]}
    assert len(checks) == len([c for c in CHECKS if not c.memory_mib]) + len(runner.YOLO_CHECKS)
    versus_default = checks["YOLO recipe / default recipe, detaug (COCO reader)"]
    assert (versus_default["numerator_recipe"], versus_default["denominator_recipe"], versus_default["target"]) == (
        "yolo", "default", 0.5)
    assert versus_default["value"] == pytest.approx(rows["yolo", "detaug"]["vs_default_recipe"])
    assert versus_default["passed"] is None and versus_default["applies"] is False  # a GPU target
    versus_peer = checks["YOLO recipe: detaug (COCO reader) / albumentations Mosaic"]
    assert versus_peer["target"] == 20.0 and versus_peer["denominator"] == "albumentations-mosaic"
    if mosaic["status"] == "ok":
        assert versus_peer["value"] == pytest.approx(rows["yolo", "detaug"]["img_per_s"] / mosaic["img_per_s"])
    else:
        assert versus_peer["value"] is None and "albumentations-mosaic (yolo recipe) unavailable" in versus_peer["reason"]
    assert "recipe" in printed and "src img/s" in printed and "YOLO recipe / default recipe" in printed


def test_recipe_sizes_and_options(tmp_path, dataset, capsys):
    """Without --size each recipe has its own side (512, 640); --recipe is repeatable; a YOLO-only
    run leaves out the default recipe's checks; unknown recipes are one line, exit 2."""
    results = _bench_json(tmp_path, "--data", str(dataset.root), "--recipe", "yolo", "--recipe", "yolo",
                          "--only", "decode,raw-dali", "--batch-sizes", "2", "--images", "2", "--warmup", "1",
                          "--threads", "1")
    assert results["settings"]["recipes"] == ["yolo"] and results["settings"]["sizes"] == {"yolo": 640}
    assert [(r["recipe"], r["variant"]) for r in results["results"]] == [(None, "decode")]  # raw DALI: default only
    assert [c["name"] for c in results["checks"]] == [c.name for c in runner.YOLO_CHECKS]
    assert runner.run_bench.__kwdefaults__["size"] is None
    from detaug.bench.recipe import DEFAULT_SIZES

    assert DEFAULT_SIZES == {"default": 512, "yolo": 640, "yolo-batch": 640, "masks": 512}
    with pytest.raises(SystemExit) as stop:
        main(["--recipes", "default,bogus", "--device", "cpu"])
    assert stop.value.code == 2 and "unknown recipe(s) ['bogus']" in capsys.readouterr().err
    with pytest.raises(ValueError, match="none of them runs the recipes default"):
        run_bench(data=dataset.root, device="cpu", only=["albumentations-mosaic"], log=lambda m: None)


def test_yolo_spec_is_the_recipe_detaug_runs():
    """The numbers the albumentations peer reads are those of detaug's yolo_recipe."""
    from detaug.bench.recipe import YoloSpec, detaug_recipe
    from detaug.transforms import ColorJitter, MixUp, Mosaic, RandomAffine, RandomHorizontalFlip, RandomPerspective

    spec = YoloSpec(size=320)
    recipe = detaug_recipe("yolo", 320)
    by_type = {type(t): t for t in recipe.transforms}
    assert tuple(by_type[Mosaic].size) == (320, 320) and by_type[Mosaic].fill == spec.fill
    assert by_type[RandomPerspective].distortion_scale == spec.perspective
    affine = by_type[RandomAffine]
    assert tuple(affine.translate) == (spec.translate, spec.translate)
    # the affine about the 2x canvas before halving it: ultralytics' 1 -/+ scale
    assert tuple(affine.scale) == pytest.approx((2 * (1 - spec.scale), 2 * (1 + spec.scale)))
    assert by_type[RandomHorizontalFlip].p == spec.flip_p and by_type[MixUp].p == spec.mixup
    jitter = by_type[ColorJitter]
    assert tuple(jitter.hue) == pytest.approx((-spec.hsv_h, spec.hsv_h))
    assert tuple(jitter.saturation) == pytest.approx((1 - spec.hsv_s, 1 + spec.hsv_s))
    assert tuple(jitter.brightness) == pytest.approx((1 - spec.hsv_v, 1 + spec.hsv_v))
    assert (recipe.min_size, recipe.min_visibility) == (spec.min_box_size, spec.min_visibility)
    assert Mosaic.partners + 1 == spec.mosaic_images


def test_mosaic_sampler_draws_partners_over_the_whole_dataset():
    from detaug.bench.albumentations_peers import MosaicSampler

    first = list(islice(iter(MosaicSampler(5, seed=3)), 10))
    assert first == list(islice(iter(MosaicSampler(5, seed=3)), 10))  # seeded
    assert sorted(t[0] for t in first[:5]) == list(range(5)) == sorted(t[0] for t in first[5:])  # permutations
    assert all(len(t) == 4 and all(0 <= i < 5 for i in t) for t in first)
    partners = {i for t in islice(iter(MosaicSampler(5, seed=0)), 200) for i in t[1:]}
    assert partners == set(range(5))


@pytest.mark.skipif(not _installed("albumentations", "cv2"), reason="albumentations is not installed")
def test_albumentations_mosaic_peer(dataset):
    """uint8 batches of the output size, boxes inside the image and on object pixels (the
    synthetic objects are saturated colours on grey; the fill is grey too)."""
    from detaug.bench.albumentations_peers import iter_albumentations_mosaic

    size = 256
    batches = iter_albumentations_mosaic(dataset, _settings(recipe="yolo", size=size))
    try:
        for images, targets in islice(batches, 2):
            assert images.shape == (BATCH, 3, size, size) and images.dtype == torch.uint8
            rgb = images.float()
            # HSV value and saturation shifts leave dark objects ~40 apart in their channels;
            # the grey fill and background stay a few apart
            coloured = (rgb.max(1).values - rgb.min(1).values) > 20
            for k, target in enumerate(targets):
                boxes = target["boxes"]
                assert boxes.dtype == torch.float32 and target["labels"].dtype == torch.int64
                assert (boxes >= -1e-3).all() and (boxes <= size + 1e-3).all()
                for x0, y0, x1, y1 in boxes.round().int().tolist():
                    if min(x1 - x0, y1 - y0) >= 8:
                        assert coloured[k, y0:y1, x0:x1].float().mean() > 0.05
    finally:
        batches.close()


@pytest.mark.skipif(not _installed("albumentations", "cv2"), reason="albumentations is not installed")
@pytest.mark.parametrize("workers", [0, 2])
def test_albumentations_peers_follow_the_seed(dataset, workers):
    """albumentations keeps a random state of its own: the peers seed it from the run's seed
    (each DataLoader worker from its own), so one seed gives the same batches."""
    from detaug.bench.albumentations_peers import iter_albumentations, iter_albumentations_mosaic

    def first_batch(iterate, seed, **kw):
        batches = iterate(dataset, _settings(seed=seed, workers=workers, **kw))
        try:
            return next(batches)
        finally:
            batches.close()

    for iterate, kw in ((iter_albumentations, {}), (iter_albumentations_mosaic, {"recipe": "yolo", "size": 256})):
        (a, ta), (b, tb), (c, _) = (first_batch(iterate, seed, **kw) for seed in (1, 1, 2))
        assert torch.equal(a, b) and all(torch.equal(x["boxes"], y["boxes"]) for x, y in zip(ta, tb))
        assert not torch.equal(a, c)


def test_ratios_and_checks_of_a_made_up_yolo_run():
    """The YOLO rows: ratio to the same variant of the default recipe, the best CPU peer of their
    own recipe, source images per second; the two YOLO checks."""
    def row(name, recipe, ips):
        variant = bench_variant(name, recipe)
        m = Measurement(images=int(ips), batches=1, seconds=1.0, warmup_seconds=0.0)
        return runner.VariantResult(variant, "ok", measurement=m, batch_size=8)

    results = [row("decode", "default", 4000), row("detaug", "default", 3000), row("albumentations", "default", 200),
               row("detaug", "yolo", 1800), row("albumentations-mosaic", "yolo", 60)]
    _fill_ratios(results)
    yolo = results[3]
    assert yolo.vs_default_recipe == pytest.approx(0.6) and yolo.vs_cpu_peer == pytest.approx(30.0)
    assert yolo.source_images_per_second == pytest.approx(1800 * 4.1)
    assert yolo.sources_vs_decode == pytest.approx(1800 * 4.1 / 4000)
    assert results[4].vs_default_recipe == pytest.approx(60 / 200)  # against albumentations' default recipe
    assert results[1].vs_cpu_peer == pytest.approx(15.0)  # the default recipe's peers only
    report = runner.BenchReport(BenchSettings(device="gpu", batch_size=8, workers=4, threads=2), None, {}, results,
                                recipes=("default", "yolo"))
    values = {c.name: _evaluate(c, report) for c in runner.YOLO_CHECKS}
    assert [(v.value, v.passed) for v in values.values()] == [(pytest.approx(0.6), True), (pytest.approx(30.0), True)]


def test_peer_images_time_the_peers_only(dataset):
    """``--peer-images``: the peers time their own count, every other variant ``--images``."""
    from detaug.bench.machine import DEFAULTS
    from detaug.bench.variant_runs import _Runner

    runner = _Runner(dataset, DEFAULTS["cpu"], 64, 1, print, peer_images=8)
    assert runner.count(bench_variant("albumentations", "default")) == 8
    assert runner.count(bench_variant("albumentations-mosaic", "yolo")) == 8
    assert runner.count(bench_variant("torchvision-gpu", "default")) == 8
    assert runner.count(bench_variant("detaug", "default")) == 64 == runner.count(bench_variant("decode", "default"))


def test_rounds_take_turns_and_each_row_is_its_median_round(dataset):
    """--rounds N: every variant but the peers timed N times; the row is the median round, every
    round's img/s listed; the decode limit sweeps in the first round only and times its best
    setting again in the others."""
    logged = []
    report = run_bench(data=dataset.root, device="cpu", only=["decode", "detaug", "raw-dali"], images=8,
                       batch_size=BATCH, workers=0, threads=2, warmup=1, rounds=3, log=logged.append)
    order = [m.split(",")[0].removeprefix("running ") for m in logged if m.startswith("running ")]
    assert len(order) == 9 and order[:3] == order[3:6] == order[6:]  # the variants take turns
    assert sum(m.startswith("round ") for m in logged) == 3
    row = report.to_dict()
    assert row["settings"]["rounds"] == 3
    decode = row["decode"]
    assert len(decode["sweep"]) == 4 and decode["settings"]["num_threads"] in (1, 2)  # round 1's sweep
    for r in row["results"]:
        assert len(r["rounds"]) == 3 and all(v > 0 for v in r["rounds"])
        assert r["img_per_s"] == pytest.approx(sorted(r["rounds"])[1])
    best = {(c["settings"]["num_threads"], c["settings"]["window"]) for c in decode["sweep"]
            if c["img_per_s"] == max(e["img_per_s"] for e in decode["sweep"])}
    assert (decode["settings"]["num_threads"], decode["settings"]["window"]) in best
    assert "rounds: 3" in report.format()
    with pytest.raises(ValueError, match="--rounds"):
        run_bench(data=dataset.root, device="cpu", only=["detaug"], rounds=0, log=lambda m: None)


def test_detaug_rows_run_the_adapters_thread_defaults_unless_threads_are_given(monkeypatch):
    """The detaug rows measure what a user gets: the adapters' split of the CPUs between DALI
    and the planning workers (16 cores: 8 beside 8, the Sequence's one pipeline too), not
    the decode limit's threads; ``--threads`` sets them all."""
    from detaug import decoding
    from detaug.bench.harness import adapter_cpu_use

    monkeypatch.setattr(decoding, "available_cpus", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    gpu = BenchSettings(device="gpu", threads=16, workers=16)
    assert adapter_cpu_use("detaug", gpu) == (8, 8)
    assert adapter_cpu_use("sequence", gpu) == (8, 8)
    assert adapter_cpu_use("sequence-shuffled", gpu) == (8, 8)
    assert adapter_cpu_use("detaug-cpu", gpu) == (16, 0)
    assert adapter_cpu_use("detaug", BenchSettings(device="cpu", threads=16, workers=16)) == (16, 0)
    assert adapter_cpu_use("sequence", BenchSettings(device="gpu", threads=16, workers=16, adapter_threads=3)) == (3, 8)
    described = _describe(bench_variant("sequence"), gpu)
    assert described.startswith("8 DALI threads beside 8 planning workers; decoder ")
    assert _describe(bench_variant("detaug"), gpu).startswith("8 DALI threads beside 8 planning workers")
    assert _cores(bench_variant("detaug-cpu"), gpu) == min(16, runner.available_cpus())
    with pytest.raises(ValueError, match="adapter_threads"):
        BenchSettings(adapter_threads=0)
