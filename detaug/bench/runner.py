"""``detaug bench``: every variant of the benchmarked recipes, side by side in one run.

Recipes (``--recipes default,yolo``, :data:`detaug.bench.recipe.RECIPES`): ``default`` (the default
detection recipe, every variant below) and ``yolo`` (``detaug.transforms.yolo_recipe``: Mosaic,
RandomPerspective, affine, letterbox 640, flip, MixUp, HSV; :data:`YOLO_VARIANTS`: the three
detaug iterators and ``albumentations-mosaic``). Rows carry their recipe; the decode limit is
measured once and shared; the YOLO rows also give the source images decoded per second (a mosaic
is made of 4 images, plus the MixUp partner of a blended sample).

Variants of the default recipe (``--only`` names):

* ``decode``: the decode limit: DALI reading and decoding the same files and nothing else, the
  best of a small sweep of decoder settings (:mod:`detaug.bench.decode`), its settings recorded;
* ``detaug``: ``detaug.torch.DetectionLoader`` (the PyTorch iterator) on a ``CocoSource``;
* ``detaug-list``: the same loader on the same JSON as a sample list;
* ``detaug-cpu``: the loader with ``device="cpu"`` (on a GPU run too: what a laptop gets; in a CPU
  run it is the ``detaug`` row, :func:`same_row`);
* ``sequence``: ``detaug.keras.DetectionSequence`` as ``model.fit(seq, shuffle=False)`` reads it
  (docs/keras.md): Keras' ``PyDatasetAdapter``, batches in order, the sequence's defaults (on a
  GPU with Keras' torch backend its images are torch tensors on the GPU);
* ``sequence-shuffled``: the same as ``fit(seq)`` reads it with Keras' default ``shuffle=True``
  (a random batch order: nothing is prepared ahead);
* ``sequence-numpy``: the batches in order with NumPy images on the host (Keras' own conversion of
  NumPy batches left out);
* ``raw-dali``: the same recipe hand-written in plain DALI (:mod:`detaug.bench.raw_dali`);
* ``torchvision``, ``albumentations``: the CPU peers in DataLoaders (:mod:`detaug.bench.peers`);
* ``torchvision-gpu``: torchvision.transforms.v2 on CUDA tensors, decoded by nvJPEG.

Of the YOLO recipe: ``detaug``, ``detaug-list``, ``detaug-cpu`` (the same loaders on
``yolo_recipe(size)``) and ``albumentations-mosaic`` (albumentations' Mosaic and its closest
transforms in a DataLoader, :func:`detaug.bench.peers.albumentations_mosaic_transform`).

Of the masks recipe (``--recipes masks``, :data:`MASKS_VARIANTS`): ``detaug`` and ``detaug-cpu``
on ``CocoSource(..., masks=True)`` of the same photos, each box given the ellipse inscribed in it
as its mask (:mod:`detaug.bench.mask_data`), the masks in the targets; their ratio to the decode
limit and to the default recipe's same row.

Every variant runs at each batch size (``--batch-sizes``); each row gets its ratio to the decode
limit and to the best CPU peer, img/s per CPU core for the paths on the CPU, and its peak GPU
and host memory. ``--scaling`` adds rows at 0.3, 1, 4 and 12 megapixels and at batch 8, 32, 128
and 256.

Processing order: prepare the dataset (generated, or written from ``--data`` / ``--realdata``
into a temporary folder of links); run the peers first at every batch size (their workers fork
before DALI starts threads in this process), then the decode sweep, raw DALI, detaug and the
Sequence, each warmed up and timed by :func:`detaug.bench.harness.measure`; print the tables and
the target checks. A variant that cannot run (package missing, error) gets a row that says why,
and a missing peer the line that installs it without changing torch; the others still run.

Defaults fit the machine (:data:`DEFAULTS`): DALI threads and DataLoader workers from the CPUs
this process may use (:func:`~detaug.bench.harness.available_cpus`); on a GPU 2,048 images,
batches of 64 and 256, 10 epochs per DALI variant; on the CPU a short run (256 images, batch 16,
192 images per variant), longer with ``--images`` / ``--num-images`` / ``--batch-sizes``.

Modules: this one is the command line (:func:`build_parser`, :func:`main`);
:mod:`detaug.bench.session` is one run (:func:`run_bench`), :mod:`detaug.bench.variants` the
variants and their rows, :mod:`detaug.bench.variant_runs` the timing of one variant,
:mod:`detaug.bench.checks` the targets, :mod:`detaug.bench.report` the report and its tables,
:mod:`detaug.bench.machine` the device, the defaults and the environment. Their public names are
importable from here too.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from detaug.bench.checks import CHECKS, YOLO_BATCH_CHECKS, YOLO_CHECKS, Check, CheckResult, checks_for
from detaug.bench.dataset import realdata_folders
from detaug.bench.harness import available_cpus, default_threads, default_workers
from detaug.bench.machine import DEFAULTS, Defaults, pick_bench_device
from detaug.bench.recipe import DEFAULT_SIZES, RECIPES
from detaug.bench.report import RECIPE_TITLE, SCHEMA, BenchReport
from detaug.bench.session import DEFAULT_MEGAPIXELS, DEFAULT_SCALING_BATCHES, run_bench
from detaug.bench.variants import (
    MASKS_VARIANTS, PEER_ORDER, RUN_ORDER, SCALING_VARIANTS, VARIANT_NAMES, VARIANTS, YOLO_BATCH_VARIANTS,
    YOLO_VARIANTS, Kind, Variant,
    VariantResult, same_row,
)

__all__ = [
    "CHECKS",
    "DEFAULTS",
    "VARIANTS",
    "MASKS_VARIANTS",
    "YOLO_CHECKS",
    "YOLO_VARIANTS",
    "BenchReport",
    "Check",
    "Variant",
    "VariantResult",
    "main",
    "run_bench",
]


# ------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------


def build_parser(prog: str = "detaug bench") -> argparse.ArgumentParser:
    from detaug.cli_support import OneLineParser, int_at_least, positive_int

    gpu, cpu = DEFAULTS["gpu"], DEFAULTS["cpu"]
    parser = OneLineParser(
        prog=prog,
        description=(
            "Measure the default detection recipe (IoU crop, flip, affine, resize, colour jitter, "
            "normalize; --recipes default,yolo adds the YOLO-style recipe beside it) through detaug's PyTorch iterator (GPU and CPU) and Keras Sequence, a "
            "hand-written raw DALI pipeline, torchvision.transforms.v2 / albumentations in "
            "DataLoaders and torchvision v2 on the GPU, against the decode limit (DALI decoding "
            "alone, best of a sweep of decoder settings), on one COCO-style JPEG dataset; print "
            "img/s, ratios, per-core figures, memory and the target checks. Defaults fit the "
            f"machine: {default_threads()} DALI threads and {default_workers()} DataLoader workers "
            f"here ({available_cpus()} CPUs); a GPU run times {gpu.epochs[0]} epochs of "
            f"{gpu.num_images} images at batch {' and '.join(map(str, gpu.batch_sizes))}, a CPU run "
            f"{cpu.images} images of {cpu.num_images} at batch {cpu.batch_size}. "
            "`detaug bench --startup ...` measures start-up instead (its own --help)."
        ),
    )
    parser.add_argument(
        "--data", type=Path,
        help="what you have: a folder with annotations.json + images/, a Pascal VOC folder "
        "(Annotations/, JPEGImages/), or a COCO JSON file (its images in --images-dir); default: "
        "a generated synthetic dataset",
    )
    parser.add_argument("--images-dir", type=Path,
                        help="images folder of a COCO JSON --data (default: images/ next to it, else its folder)")
    parser.add_argument("--allow-paths-outside", action="store_true",
                        help="accept file_name entries of a COCO JSON --data that are absolute or leave its images "
                             "folder (default: an error naming them; docs/security.md)")
    parser.add_argument(
        "--realdata", type=Path, metavar="DIR",
        help="every Pascal VOC folder directly under DIR, merged (e.g. ../shared/realdata); instead of --data",
    )
    parser.add_argument("--repeat-to", type=positive_int, metavar="N",
                        help="repeat the images of --data / --realdata to N (links, no copies), so small sets time well")
    parser.add_argument(
        "--num-images", type=positive_int,
        help=f"images to generate without --data (default {gpu.num_images} on a GPU, {cpu.num_images} on the CPU)",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="where generated datasets are kept (default ~/.cache/detaug/bench)"
    )
    parser.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                        help="default auto: the GPU when PyTorch and DALI see one")
    parser.add_argument("--batch-size", type=positive_int, help="one batch size (as --batch-sizes N)")
    parser.add_argument(
        "--batch-sizes", type=_int_list, metavar="B1,B2",
        help=f"every variant at each (default {','.join(map(str, gpu.batch_sizes))} on a GPU, "
        f"{','.join(map(str, cpu.batch_sizes))} on the CPU)",
    )
    parser.add_argument(
        "--workers", type=int_at_least(0),
        help=f"DataLoader workers of the peers (default: one per CPU, {default_workers()} here)",
    )
    parser.add_argument("--threads", type=positive_int,
                        help=f"DALI CPU threads (default: CPUs / LOCAL_WORLD_SIZE, at most 16: {default_threads()} here)")
    parser.add_argument(
        "--size", type=positive_int,
        help="output side in pixels of every recipe (default: " + ", ".join(
            f"{v} for {k}" for k, v in DEFAULT_SIZES.items()) + ")",
    )
    parser.add_argument(
        "--recipe", "--recipes", dest="recipes", action="append", type=_recipe_list, metavar="NAME[,NAME]",
        help=f"the recipes measured side by side in one run, repeatable or comma-separated: "
        f"{', '.join(RECIPES)} (default: default). yolo: detaug's yolo_recipe (Mosaic, RandomPerspective, "
        "affine, letterbox, flip, MixUp, HSV) through the three detaug iterators and albumentations' "
        "Mosaic in a DataLoader (albumentations-mosaic); masks: the default recipe with an instance mask "
        "per box (its inscribed ellipse) through the detaug iterators; rows and checks are labelled by recipe",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only",
        help=f"comma-separated variants (default all): {','.join(VARIANT_NAMES)}",
    )
    parser.add_argument(
        "--images",
        type=positive_int,
        help=f"images timed per variant and decoder setting (default: on a GPU {gpu.epochs[0]} epochs for the "
        f"DALI-based variants, {gpu.epochs[1]} for the peers; on the CPU {cpu.images})",
    )
    parser.add_argument(
        "--peer-images",
        type=positive_int,
        help="images timed per peer (torchvision, albumentations, their GPU and Mosaic rows) instead of --images",
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        help=f"warm-up batches (default {gpu.warmup} on a GPU, {cpu.warmup} on the CPU; DataLoaders: "
        "at least one per worker)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="time every variant but the peers N times, taking turns, and report each one's median round "
        "(default 1; 3 on machines whose pace drifts)",
    )
    parser.add_argument("--scaling", action="store_true",
                        help="add img/s rows at several megapixels and batch sizes (decode limit and detaug)")
    parser.add_argument("--megapixels", type=_float_list, metavar="MP1,MP2",
                        help=f"megapixels of --scaling (default {','.join(f'{m:g}' for m in DEFAULT_MEGAPIXELS)})")
    parser.add_argument("--scaling-batch-sizes", type=_int_list, metavar="B1,B2",
                        help=f"batch sizes of --scaling (default {','.join(map(str, DEFAULT_SCALING_BATCHES))})")
    from detaug.bench.train_context import TRAIN_STEPS, TRAIN_STREAMS
    from detaug.bench.train_rows import TRAIN_DEFAULTS, TRAIN_ROW_NAMES, TRAIN_SIZE

    tg, tc = TRAIN_DEFAULTS["gpu"], TRAIN_DEFAULTS["cpu"]
    parser.add_argument(
        "--train", action="store_true",
        help=f"instead: time a fast detector's training loop (ResNet-18 trunk, 1x1 head, {TRAIN_SIZE}x{TRAIN_SIZE}) "
        "fed by each loader, against the same steps on one cached batch (img/s, ratio, data wait, CPU cores, GPU "
        f"memory); --warmup / --steps its steps (default {tg.warmup} / {tg.steps} on a GPU at batch "
        f"{','.join(map(str, tg.batch_sizes))}, {tc.warmup} / {tc.steps} on the CPU at batch "
        f"{','.join(map(str, tc.batch_sizes))}), --only its rows ({','.join(TRAIN_ROW_NAMES)}); per rank with "
        "DDP under torchrun",
    )
    parser.add_argument("--steps", type=positive_int, help="timed training steps of --train")
    parser.add_argument(
        "--train-stream", choices=tuple(TRAIN_STREAMS), default="default",
        help="the CUDA stream of --train's PyTorch steps (the ceilings' too): CUDA's default stream (default; "
        "the detaug iterators then run their loop on their training stream by themselves, as in a user's loop), "
        "or detaug.torch.training_stream(), a high-priority stream of their own (docs/loader.md, 'Feeding a fast "
        "model'); the Keras rows stay on the default stream, which the Sequence hands its batches to",
    )
    parser.add_argument(
        "--train-step", choices=TRAIN_STEPS, default="eager",
        help="how --train's PyTorch steps run (the ceilings' too): op by op (eager, default), or captured once in "
        "a CUDA graph and replayed (graph: a GPU and one process; docs/loader.md, 'Feeding a fast model'); the "
        "Keras rows run Keras' fit either way",
    )
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the results as JSON here")
    parser.add_argument("--check", action="store_true", help="exit with status 1 when a target check fails")
    parser.add_argument("--quiet", action="store_true", help="no progress messages")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def _recipe_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in RECIPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown recipe(s) {unknown or [text]}; choose from {', '.join(RECIPES)}")
    return names


def _positive_list(convert: Callable[[str], float], noun: str) -> Callable[[str], list]:
    """An argparse ``type``: a comma-separated list of positive ``convert``-ed values (``noun``
    names them in the errors)."""
    def parse(text: str) -> list:
        try:
            values = [convert(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list of {noun}: {text!r}") from None
        if not values or any(not v > 0 for v in values):
            raise argparse.ArgumentTypeError(f"should be positive {noun}, got {text!r}")
        return values

    return parse


_int_list = _positive_list(int, "integers")
_float_list = _positive_list(float, "numbers")


def _startup(argv: list[str]) -> int:
    """``detaug bench --startup ...``: :func:`detaug.bench.startup.main` with the other arguments."""
    try:
        from detaug.bench import startup
    except ModuleNotFoundError as exc:
        if exc.name not in ("detaug.bench.startup",):
            raise
        print("detaug bench: error: --startup needs detaug/bench/startup.py, which this install does not have",
              file=sys.stderr)
        return 2
    return int(startup.main([a for a in argv if a != "--startup"]) or 0)


def main(argv: Sequence[str] | None = None, *, debug: bool = False) -> int:
    """``detaug bench``; returns the exit status: 2 for a bad option or dataset (one line naming
    it; ``--debug`` adds the traceback), 1 with ``--check`` when a target fails. With
    ``--startup``, :func:`detaug.bench.startup.main` runs instead."""
    from detaug.cli_support import log_to_stderr, run_guarded

    argv = list(sys.argv[1:] if argv is None else argv)
    log_to_stderr()  # also for python -m detaug.bench
    if "--startup" in argv:
        return _startup(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = debug or args.debug
    if args.json_path is not None and args.json_path.is_dir():
        parser.error(f"--json {args.json_path}: is a folder; give a file name")
    if args.realdata is not None and args.data is not None:
        parser.error("give --data or --realdata, not both")

    def run() -> int:
        try:
            data = realdata_folders(args.realdata) if args.realdata is not None else args.data
            report = run_bench(
                data=data,
                images_dir=args.images_dir,
                allow_paths_outside=args.allow_paths_outside,
                repeat_to=args.repeat_to,
                num_images=args.num_images,
                cache_dir=args.cache_dir,
                device=args.device,
                batch_size=args.batch_size,
                batch_sizes=args.batch_sizes,
                workers=args.workers,
                threads=args.threads,
                size=args.size,
                seed=args.seed,
                only=args.only.split(",") if args.only else None,
                recipes=[n for group in args.recipes for n in group] if args.recipes else None,
                images=args.images,
                peer_images=args.peer_images,
                warmup=args.warmup,
                rounds=args.rounds,
                scaling=args.scaling,
                megapixels=args.megapixels,
                scaling_batch_sizes=args.scaling_batch_sizes,
                progress=not args.quiet,
                log=(lambda msg: None) if args.quiet else None,
                train=args.train,
                steps=args.steps,
                train_stream=args.train_stream,
                train_step=args.train_step,
            )
        except ValueError as exc:
            if debug:
                traceback.print_exc()
            parser.error(str(exc).splitlines()[0])  # one line, exit status 2
        failed = args.check and any(c.passed is False for run in report.runs for c in run.checks)
        # Under torchrun rank 0 prints and writes for all; every rank exits with the checks'
        # status (each holds every rank's figures, so the same checks): a node whose ranks all
        # passed would otherwise wait at its launcher's exit barrier (300 s) for a node that failed.
        if getattr(report, "rank", 0) != 0:
            return 1 if failed else 0
        print(report.format(), flush=True)
        if args.json_path is not None:
            args.json_path.parent.mkdir(parents=True, exist_ok=True)
            args.json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
            print(f"\nresults written to {args.json_path}")
        return 1 if failed else 0

    return run_guarded(parser.prog, run, debug)
