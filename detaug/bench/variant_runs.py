"""Each variant of ``detaug bench`` run into its :class:`~detaug.bench.variants.VariantResult`
row: warmed up and timed by :func:`detaug.bench.harness.measure` (:class:`_Runner`), the decode
sweep kept at its best settings, the rows of one batch size given their ratios."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator

from detaug.bench.checks import _best_cpu_peer
from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, VariantUnavailable, adapter_cpu_use, available_cpus, measure
from detaug.bench.machine import Defaults
from detaug.bench.recipe import peer_recipe
from detaug.bench.variants import Variant, VariantResult


class _Runner:
    """Runs variants on one dataset with the run's image counts and warm-up."""

    def __init__(self, dataset: BenchDataset, defaults: Defaults, images: int | None, warmup: int,
                 log: Callable[[str], None], peer_images: int | None = None) -> None:
        self.dataset, self.defaults, self.images, self.warmup, self.log = dataset, defaults, images, warmup, log
        self.peer_images = peer_images
        if images is not None:
            self.per_variant = f"{images} images" + (f", peers {peer_images}" if peer_images else "")
        elif defaults.images is not None:
            self.per_variant = f"{defaults.images} images"
        else:
            self.per_variant = (f"{defaults.epochs[0]} epochs ({defaults.epochs[0] * dataset.num_images} images), "
                                f"peers {defaults.epochs[1]}")

    def count(self, variant: Variant, dataset: BenchDataset | None = None) -> int:
        if self.peer_images is not None and variant.kind in ("cpu-peer", "gpu-peer"):
            return self.peer_images
        if self.images is not None:
            return self.images
        return _default_images(variant, self.defaults, dataset or self.dataset)

    def run(self, variant: Variant, settings: BenchSettings, dataset: BenchDataset | None = None,
            decode_configs: list | None = None) -> VariantResult:
        dataset = dataset or self.dataset
        count = self.count(variant, dataset)
        self.log(f"running {variant.label}, batch {settings.batch_size} ({count} images) ...")
        if variant.name == "decode":
            result = _run_decode(variant, dataset, settings, count, self.warmup, self.log, decode_configs)
        else:
            result = _run_variant(variant, dataset, settings, count, self.warmup, self.log)
        if result.measurement is not None:
            self.log(f"  {result.measurement.images_per_second:,.1f} img/s")
        else:
            self.log(f"  {result.status}: {result.message}")
        return result


def _cores(variant: Variant, settings: BenchSettings, threads: int | None = None) -> int | None:
    """CPU cores of a variant that makes its images on the CPU: its DataLoader workers (the main
    process with none), or its DALI threads; at most the CPUs available."""
    if not variant.on_cpu(settings.device):
        return None
    if variant.kind == "cpu-peer":
        used = max(settings.workers, 1)
    elif variant.kind == "detaug" and not threads:
        used, _ = adapter_cpu_use(variant.name, settings)
    else:
        used = threads or settings.threads
    return max(1, min(used, available_cpus()))


def _describe(variant: Variant, settings: BenchSettings) -> str:
    """What ``variant`` runs with ``settings`` (the peers: loader, decoder, recipe; the DALI
    variants: threads and decoder options); ``""`` for a GPU-only peer in a CPU run."""
    if variant.runs_on == "gpu" and settings.device != "gpu":
        return ""
    if variant.kind in ("cpu-peer", "gpu-peer"):
        from detaug.bench.peers import peer_description

        return peer_description(variant.name, settings)
    if variant.kind == "limit":
        return "DALI readers.coco + decoders.image / image_slice; the sweep's best setting"
    from detaug.decoding import decoder_options

    on_gpu = not variant.on_cpu(settings.device)
    try:
        options = decoder_options(on_gpu)
    except ValueError as exc:
        options = {"error": str(exc)}
    decoder = ", ".join(f"{k}={v}" for k, v in options.items()) or "DALI's CPU decoder"
    if variant.kind == "detaug":
        threads, workers = adapter_cpu_use(variant.name, settings)
        return f"{threads} DALI threads beside {workers} planning workers; decoder {decoder}"
    return f"{settings.threads} DALI threads; decoder {decoder}"


def _default_images(variant: Variant, defaults: Defaults, dataset: BenchDataset) -> int:
    if defaults.images is not None:
        return defaults.images
    peer = variant.kind in ("cpu-peer", "gpu-peer")
    epochs = defaults.epochs[1] if peer else defaults.epochs[0]
    return epochs * dataset.num_images


def _run_variant(
    variant: Variant,
    dataset: BenchDataset,
    settings: BenchSettings,
    images: int,
    warmup: int,
    log: Callable[[str], None],
    batches: Iterator | None = None,
    threads: int | None = None,
) -> VariantResult:
    peer = variant.kind == "cpu-peer"
    quantum = max(settings.workers, 1) if peer else 1
    warmup_batches = max(warmup, quantum) if peer else warmup
    common = {
        "batch_size": settings.batch_size,
        "cpu_cores": _cores(variant, settings, threads),
        "description": _describe(variant, settings),
    }
    try:
        m = measure(
            batches if batches is not None else variant.batches(dataset, settings),
            images=images,
            warmup_batches=warmup_batches,
            batch_quantum=quantum,
            device=settings.device,
        )
    except VariantUnavailable as exc:
        return VariantResult(variant, "unavailable", message=str(exc), **common)
    except Exception as exc:  # noqa: BLE001 - one broken variant must not end the whole run
        log("".join(traceback.format_exception(exc)).rstrip())
        return VariantResult(variant, "error", message=f"{type(exc).__name__}: {exc}".splitlines()[0], **common)
    return VariantResult(variant, "ok", measurement=m, **common)


def _run_decode(
    variant: Variant,
    dataset: BenchDataset,
    settings: BenchSettings,
    images: int,
    warmup: int,
    log: Callable[[str], None],
    configs: list | None = None,
) -> VariantResult:
    """The decode variant: every setting of the sweep (or ``configs``) timed; the row is the
    best, with ``extra = {"settings": ..., "sweep": [...]}``."""
    from detaug.bench.decode import iter_decode, recipe_crops_first, sweep_configs

    if configs is None:
        configs = sweep_configs(settings.device, settings.threads, window=recipe_crops_first())
    sweep, best, best_config = [], None, None
    for config in configs:
        r = _run_variant(variant, dataset, settings, images, warmup, log,
                         batches=iter_decode(dataset, settings, config=config), threads=config.num_threads)
        entry = {"settings": config.to_dict(), "img_per_s": r.images_per_second, "status": r.status,
                 "message": r.message}
        sweep.append(entry)
        log(f"  {config.label()}: " + (f"{r.images_per_second:,.1f} img/s" if r.measurement else f"{r.status}: {r.message}"))
        if r.measurement is not None and (best is None or r.images_per_second > best.images_per_second):
            best, best_config = r, config
    if best is None:
        failed = sweep[0] if sweep else {"status": "error", "message": "no decoder setting to try"}
        return VariantResult(variant, failed["status"], message=failed["message"], batch_size=settings.batch_size,
                             extra={"settings": None, "sweep": sweep})
    best.extra = {"settings": {**best_config.to_dict(), "device": "mixed" if settings.device == "gpu" else "cpu"},
                  "sweep": sweep}
    return best


def _best_decode_config(earlier: list[VariantResult]) -> list | None:
    """The decode setting a later round times: the best of the first round's sweep (``None``:
    sweep, in the first round or where it found none)."""
    from detaug.bench.decode import DecodeConfig

    chosen = earlier[0].extra.get("settings") if earlier else None
    return [DecodeConfig.from_dict(chosen)] if chosen else None


def _median_round(runs: list[VariantResult]) -> VariantResult:
    """The row of a variant timed ``len(runs)`` times: the round with the median img/s (the lower
    middle one of an even count), with every round's img/s in ``extra["rounds"]``; a decode row
    keeps the first round's ``settings`` and ``sweep``. One round: that row, as it is."""
    if len(runs) == 1:
        return runs[0]
    timed = sorted((r for r in runs if r.measurement is not None), key=lambda r: r.images_per_second)
    if not timed:
        return runs[0]
    row = timed[(len(timed) - 1) // 2]
    row.extra = {**runs[0].extra, "rounds": [r.images_per_second if r.measurement is not None else None for r in runs]}
    return row


def _fill_ratios(results: list[VariantResult]) -> None:
    """Each row's ratios (same batch size): to the decode limit (img/s, and source images per
    second), to raw DALI (rows of the default recipe, which raw DALI runs), to the best CPU peer
    of the row's recipe, and a YOLO row's to its counterpart in the default recipe."""
    raw = next((r.images_per_second for r in results if r.variant.name == "raw-dali" and r.measurement), None)
    limit = next((r.images_per_second for r in results if r.variant.name == "decode" and r.measurement), None)
    default_rates = {r.variant.name: r.images_per_second for r in results if r.recipe == "default" and r.measurement}
    for r in results:
        ips = r.images_per_second
        if ips is None:
            continue
        best_peer = _best_cpu_peer(results, peer_recipe(r.recipe or "default"))
        r.vs_raw_dali = ips / raw if raw and r.recipe in ("default", None) else None
        r.vs_decode = ips / limit if limit else None
        r.sources_vs_decode = r.source_images_per_second / limit if limit else None
        r.vs_cpu_peer = ips / best_peer if best_peer else None
        if r.recipe not in ("default", None):
            counterpart = default_rates.get(r.variant.counterpart or r.variant.name)
            r.vs_default_recipe = ips / counterpart if counterpart else None
