"""One run of ``detaug bench`` (:func:`run_bench`): the dataset prepared, the variants planned and
run at every batch size (peers first), the ``--scaling`` rows, the checks evaluated into a
:class:`~detaug.bench.report.BenchReport`. The order and the variants: :mod:`detaug.bench.runner`."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from detaug.bench.checks import _evaluate, checks_for
from detaug.bench.dataset import BenchDataset, prepare_dataset, write_resized_dataset
from detaug.bench.harness import BenchSettings, default_threads, default_workers
from detaug.bench.machine import DEFAULTS, Defaults, _environment, _warn_about_shared_memory, pick_bench_device
from detaug.bench.recipe import DEFAULT_SIZES, RECIPES
from detaug.bench.report import BenchReport
from detaug.bench.variant_runs import (
    _Runner, _best_decode_config, _fill_ratios, _median_round, _run_decode, _run_variant,
)
from detaug.bench.variants import (
    PEER_ORDER, RUN_ORDER, SCALING_VARIANTS, Variant, VariantResult, _all_variants, _select, _variant, same_row,
)

if TYPE_CHECKING:
    from detaug.bench.train_report import TrainReport


DEFAULT_MEGAPIXELS = (0.3, 1.0, 4.0, 12.0)
DEFAULT_SCALING_BATCHES = (8, 32, 128, 256)


def run_bench(
    *,
    data: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    images_dir: str | os.PathLike[str] | None = None,
    allow_paths_outside: bool = False,
    repeat_to: int | None = None,
    num_images: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    device: Literal["auto", "gpu", "cpu"] | None = None,
    batch_size: int | None = None,
    batch_sizes: Sequence[int] | None = None,
    workers: int | None = None,
    threads: int | None = None,
    size: int | None = None,
    seed: int = 0,
    only: Sequence[str] | None = None,
    recipes: Sequence[str] | None = None,
    images: int | None = None,
    peer_images: int | None = None,
    warmup: int | None = None,
    rounds: int = 1,
    scaling: bool = False,
    megapixels: Sequence[float] | None = None,
    scaling_batch_sizes: Sequence[int] | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    train: bool = False,
    steps: int | None = None,
    train_stream: str = "default",
    train_step: str = "eager",
) -> BenchReport | TrainReport:
    """Run the selected variants on one dataset at each batch size and return the report.

    Every ``None`` takes the default of the device (:data:`DEFAULTS`) or of the machine.

    Args:
        data: what :func:`detaug.bench.dataset.prepare_dataset` takes: a folder with
            ``annotations.json`` + ``images/``, a Pascal VOC folder, a COCO JSON file (its images
            in ``images_dir``) or a list of VOC folders; ``None`` generates (once, cached)
            ``num_images`` synthetic JPEGs.
        images_dir: the images folder of a COCO JSON ``data``.
        allow_paths_outside: accept ``file_name`` entries of a COCO JSON ``data`` that leave
            ``images_dir`` (``--allow-paths-outside``; docs/security.md).
        repeat_to: repeat the images of ``data`` to this many (written as links in a temporary
            folder, removed at the end).
        device: ``"gpu"``, ``"cpu"``, or ``None``/``"auto"``: the GPU when CUDA is available.
        batch_size: one batch size (the same as ``batch_sizes=[batch_size]``).
        batch_sizes: every variant runs at each; default 64 and 256 on a GPU, 16 on the CPU.
        workers, threads: DataLoader workers of the peers, DALI threads; by default from the
            CPUs available (:func:`~detaug.bench.harness.default_workers`, ``default_threads``).
        size: output side of every recipe; ``None``: each recipe's own
            (:data:`~detaug.bench.recipe.DEFAULT_SIZES`: 512 for the default recipe, 640 for YOLO).
        only: variant names (:data:`VARIANT_NAMES`), applied to every recipe; all by default.
        recipes: the recipes measured side by side (:data:`~detaug.bench.recipe.RECIPES`; default
            ``["default"]``): each runs its variants (:data:`VARIANTS`, :data:`YOLO_VARIANTS`); the
            decode limit runs once for all.
        images: images timed per variant (and per sweep setting of ``decode``). ``None``: on the
            GPU 10 epochs for the DALI-based variants and 2 for the peers; on the CPU 192 images.
            DataLoader peers round up to whole waves of ``workers`` batches.
        peer_images: images timed per peer (CPU DataLoaders, torchvision on the GPU) instead of
            ``images``: the peers are 20 to 300 times slower, so fewer of their images time as well.
        warmup: warm-up batches (the DataLoader peers take at least one wave, ``workers``).
        rounds: every variant but the peers is timed this many times, the variants taking turns
            (all of them once per round, at every batch size); each row is the round with the
            median img/s (the lower of the middle two for an even count), and lists every
            round's img/s (``rounds`` in the JSON row). Machines whose pace drifts (shared hosts)
            then give ratios that a single slow or fast moment does not decide. The decode
            limit sweeps its settings in the first round and times the best one in the others.
        scaling: add the megapixel rows (``megapixels``, default 0.3, 1, 4, 12) and batch rows
            (``scaling_batch_sizes``, default 8, 32, 128, 256) for :data:`SCALING_VARIANTS`.
        log: progress messages (default: stderr).
        train: time a detector's training loop on each loader instead
            (:func:`detaug.bench.train.run_train_bench`: a :class:`~detaug.bench.train.TrainReport`;
            ``warmup`` and ``steps`` are its steps, ``only`` its rows, ``size`` its input side,
            ``train_stream`` the CUDA stream its steps run on: ``"default"`` or ``"high"`` priority,
            ``train_step`` how they run: ``"eager"`` or ``"graph"``, replayed from a CUDA graph).

    Raises:
        ValueError: bad arguments or dataset, or ``device="gpu"`` without CUDA.
    """
    log = log if log is not None else (lambda msg: print(msg, file=sys.stderr, flush=True))
    device = pick_bench_device(device)
    if train:
        from detaug.bench.train import run_train_bench

        ignored = [flag for flag, given in (
            ("--recipes", recipes is not None and list(_recipes(recipes)) != ["default"]), ("--images", images),
            ("--peer-images", peer_images), ("--rounds", rounds != 1), ("--scaling", scaling),
            ("--megapixels", megapixels), ("--scaling-batch-sizes", scaling_batch_sizes)) if given]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: not for --train (its rows: the default recipe, --warmup and "
                             "--steps steps)")

        return run_train_bench(
            data=data, images_dir=images_dir, allow_paths_outside=allow_paths_outside, repeat_to=repeat_to, num_images=num_images, cache_dir=cache_dir,
            device=device, batch_sizes=_batch_sizes(batch_size, batch_sizes, DEFAULTS[device]) if (
                batch_size is not None or batch_sizes is not None) else None,
            workers=workers, threads=threads, size=size, seed=seed, only=only, warmup=warmup, steps=steps,
            stream=train_stream, step=train_step, progress=progress, log=log)
    if steps is not None:
        raise ValueError("--steps is a number of training steps: give it with --train")
    if train_stream != "default":
        raise ValueError("--train-stream is where training steps run: give it with --train")
    if train_step != "eager":
        raise ValueError("--train-step is how training steps run: give it with --train")
    defaults = DEFAULTS[device]
    sizes = _batch_sizes(batch_size, batch_sizes, defaults)
    recipes = _recipes(recipes)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"--size should be a positive int, got {size!r}")
    recipe_sizes = {name: DEFAULT_SIZES[name] if size is None else size for name in RECIPES}
    base = BenchSettings(
        device=device,
        batch_size=sizes[0],
        workers=default_workers() if workers is None else workers,
        threads=default_threads() if threads is None else threads,
        adapter_threads=threads,
        size=recipe_sizes["default"],
        seed=seed,
    )
    selected = _select(only)
    planned = _planned(selected, recipes, device)
    if not planned:
        raise ValueError(f"--only {','.join(sorted(selected))}: none of them runs the recipes {','.join(recipes)}")
    if images is not None and (isinstance(images, bool) or not isinstance(images, int) or images < 1):
        raise ValueError(f"--images should be a positive int, got {images!r}")
    warmup = defaults.warmup if warmup is None else warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"--warmup should be an int >= 1, got {warmup!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"--rounds should be an int >= 1, got {rounds!r}")
    num_images = defaults.num_images if num_images is None else num_images
    megapixels = tuple(DEFAULT_MEGAPIXELS if megapixels is None else megapixels)
    scaling_sizes = tuple(DEFAULT_SCALING_BATCHES if scaling_batch_sizes is None else scaling_batch_sizes)
    if any(mp <= 0 for mp in megapixels) or any(b < 1 for b in scaling_sizes):
        raise ValueError("--megapixels should be > 0 and --scaling-batch-sizes >= 1")

    work = tempfile.mkdtemp(prefix="detaug-bench-")
    try:
        dataset = prepare_dataset(
            data, images_dir=images_dir, allow_paths_outside=allow_paths_outside, repeat_to=repeat_to, work_dir=work,
            num_images=num_images, cache_dir=cache_dir, seed=seed, progress=progress,
        )
        log(f"dataset: {dataset.describe()}")
        runner = _Runner(dataset, defaults, images, warmup, log, peer_images)
        if any(v.kind in ("cpu-peer", "gpu-peer") for v in planned):
            _warn_about_shared_memory(replace(base, batch_size=max(sizes), size=max(recipe_sizes.values())), log)
        trials: dict[int, dict[tuple[str | None, str], list[VariantResult]]] = {b: {} for b in sizes}
        peers = [v for v in planned if v.name in PEER_ORDER]
        others = [v for v in planned if v.name not in PEER_ORDER]
        for phase, times in ((peers, 1), (others, rounds)):
            for round_ in range(times):
                if times > 1:
                    log(f"round {round_ + 1} of {times}")
                for b in sizes:
                    for variant in phase:
                        settings = replace(base, batch_size=b, recipe=variant.recipe or "default",
                                           size=recipe_sizes[variant.recipe or "default"])
                        earlier = trials[b].setdefault((variant.recipe, variant.name), [])
                        result = runner.run(variant, settings, decode_configs=_best_decode_config(earlier))
                        result.size = settings.size if variant.recipe is not None else None
                        earlier.append(result)
        results = {b: {key: _median_round(runs) for key, runs in by_key.items()} for b, by_key in trials.items()}
        reports = []
        environment = _environment(device)
        for b in sizes:
            ordered = [results[b][(v.recipe, v.name)] for v in _all_variants() if (v.recipe, v.name) in results[b]]
            _fill_ratios(ordered)
            report = BenchReport(
                rounds=rounds,
                settings=replace(base, batch_size=b),
                dataset=dataset,
                environment=environment,
                results=ordered,
                images_requested=images,
                images_per_variant=runner.per_variant,
                warmup=warmup,
                recipes=recipes,
                sizes={name: recipe_sizes[name] for name in recipes},
            )
            report.checks = [_evaluate(c, report) for c in checks_for(recipes, device)]
            reports.append(report)
        main_report = reports[0]
        main_report.more_runs = reports[1:]
        if scaling:  # the default recipe's detaug iterator and the decode limit
            main_report.scaling = _run_scaling(runner, base, main_report, megapixels, scaling_sizes, Path(work))
        return main_report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _batch_sizes(batch_size: int | None, batch_sizes: Sequence[int] | None, defaults: Defaults) -> tuple[int, ...]:
    if batch_size is not None and batch_sizes is not None:
        raise ValueError("give --batch-size or --batch-sizes, not both")
    sizes = tuple(batch_sizes) if batch_sizes is not None else (batch_size,) if batch_size is not None else (
        defaults.batch_sizes or (defaults.batch_size,))
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch sizes should be positive ints, got {list(sizes)}")
    return tuple(dict.fromkeys(sizes))


def _recipes(recipes: Sequence[str] | None) -> tuple[str, ...]:
    """The recipes asked for, in :data:`RECIPES` order, without repeats; ``None``: the default."""
    if recipes is None:
        return ("default",)
    if isinstance(recipes, str):
        recipes = [recipes]
    names = {n.strip() for n in recipes if n and n.strip()}
    unknown = names - set(RECIPES)
    if unknown or not names:
        raise ValueError(f"unknown recipe(s) {sorted(unknown)}; choose from {', '.join(RECIPES)}")
    return tuple(n for n in RECIPES if n in names)


def _planned(selected: set[str], recipes: Sequence[str], device: str = "gpu") -> list[Variant]:
    """The variants to run, in :data:`RUN_ORDER` (peers first), each recipe's after the other's:
    the selected names among the variants of ``recipes``, the decode limit once for all; no
    two that measure the same loader on ``device`` (:func:`same_row`)."""
    selected = {same_row(name, device) for name in selected}
    chosen = [v for v in _all_variants() if v.name in selected and (v.recipe is None or v.recipe in recipes)]
    rank = {name: k for k, name in enumerate(RUN_ORDER)}
    return sorted(chosen, key=lambda v: (rank[v.name], RECIPES.index(v.recipe or "default")))


def _run_scaling(
    runner: _Runner,
    base: BenchSettings,
    report: BenchReport,
    megapixels: Sequence[float],
    batch_sizes: Sequence[int],
    work: Path,
) -> dict:
    """The ``--scaling`` rows: :data:`SCALING_VARIANTS` on the photos resized to each of
    ``megapixels`` (at the first batch size), and on the bench dataset at each of ``batch_sizes``.
    The decode variant runs at the best setting of the main sweep (no new sweep)."""
    from detaug.bench.decode import DecodeConfig

    decode = report.decode()
    best = [DecodeConfig.from_dict(decode["settings"])] if decode and decode.get("settings") else None
    defaults = runner.defaults
    count = runner.images if runner.images is not None else defaults.scaling_images

    def row(variant: Variant, settings: BenchSettings, dataset: BenchDataset) -> VariantResult:
        if variant.name == "decode" and best is None:
            return VariantResult(variant, "unavailable", message="the decode variant did not run")
        runner.log(f"scaling: {variant.label}, batch {settings.batch_size}, {dataset.max_size[0]}x{dataset.max_size[1]} ...")
        if variant.name == "decode":
            return _run_decode(variant, dataset, settings, count, runner.warmup, runner.log, best)
        return _run_variant(variant, dataset, settings, count, runner.warmup, runner.log)

    mp_rows, batch_rows = [], []
    for mp in megapixels:
        try:
            resized = write_resized_dataset(report.dataset, mp, work / f"mp-{mp:g}",
                                            max_unique=defaults.scaling_unique,
                                            num_images=max(report.dataset.num_images, base.batch_size))
        except Exception as exc:  # noqa: BLE001 - a row that says why
            mp_rows += [{"megapixels": mp, "size_wh": [0, 0], "batch_size": base.batch_size, "variant": name,
                         "img_per_s": None, "status": "error", "message": f"{type(exc).__name__}: {exc}"}
                        for name in SCALING_VARIANTS]
            continue
        for name in SCALING_VARIANTS:
            r = row(_variant(name), base, resized)
            mp_rows.append({"megapixels": mp, "size_wh": list(resized.max_size), "batch_size": base.batch_size,
                            "variant": name, "img_per_s": r.images_per_second, "status": r.status,
                            "message": r.message})
    for b in batch_sizes:
        for name in SCALING_VARIANTS:
            r = row(_variant(name), replace(base, batch_size=b), report.dataset)
            batch_rows.append({"batch_size": b, "variant": name, "img_per_s": r.images_per_second,
                               "status": r.status, "message": r.message})
    return {"variants": list(SCALING_VARIANTS), "images_per_row": count, "megapixels": mp_rows, "batch": batch_rows}
