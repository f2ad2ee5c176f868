"""``detaug`` command line: ``demo``, ``preview``, ``recipe`` and ``bench``.

Errors: a user error (a file or folder that is not there, a recipe that does not parse, an option
value that cannot work, a dataset that cannot be read) is one line on stderr,
``detaug COMMAND: error: ...``, naming the file, folder, line or option at fault, and exit status
2. ``--debug`` (anywhere on the command line) also prints the traceback. Anything else is one line
too, with exit status 1 and a pointer to ``--debug``; Ctrl-C gives 130. ``detaug --version``
prints the version.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from detaug.cli_support import (
    CliError, OneLineParser, add_voc_options, error_line, log_to_stderr, positive_int, run_guarded,
)

__all__ = ["RECIPE_SUFFIXES", "CliError", "OneLineParser", "error_line", "main", "read_recipe"]

#: Recipe files by extension: YAML or JSON; anything else is named in the error.
RECIPE_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}


# -- the pieces the commands share (and detaug.cli_support) ----------------------------------------


def pick_device(device: str) -> str:
    """``"gpu"`` or ``"cpu"`` for ``--device`` (``auto``: the GPU where DALI can use one); a
    :class:`~detaug.errors.DeviceError` (one line, exit 2) for ``gpu`` without one."""
    from detaug.errors import DeviceError
    from detaug.pipeline import pick_device as pick

    try:
        return pick(device)
    except DeviceError as err:
        raise CliError(f"--device {device}: {err}") from err


def read_recipe(path: str | os.PathLike[str]) -> Any:
    """The :class:`~detaug.transforms.Compose` of a recipe file (``.yaml``/``.yml``: YAML,
    ``.json``: JSON, as ``Compose.save`` writes them), or a :class:`CliError` naming the file
    and, for a syntax error, its line and column."""
    import json

    import yaml

    from detaug.errors import RecipeError
    from detaug.transforms import Compose
    from detaug.transforms.recipe_dict import recipe_lines

    p = Path(path)
    kind = RECIPE_SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise CliError(
            f"--recipe {p}: a recipe file ends in .yaml, .yml or .json (this one "
            + (f"ends in {p.suffix})" if p.suffix else "has no extension)")
        )
    if not p.exists():
        raise CliError(f"--recipe {p}: file not found")
    if p.is_dir():
        raise CliError(f"--recipe {p}: is a folder, not a recipe file")
    from detaug.transforms.recipe_file import MAX_RECIPE_BYTES

    try:
        if p.stat().st_size > MAX_RECIPE_BYTES:
            raise CliError(f"{p}: {p.stat().st_size} bytes: a recipe file is at most {MAX_RECIPE_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{p}: not UTF-8 text (byte {err.start}); a recipe is YAML or JSON text") from err
    except OSError as err:
        raise CliError(f"{p}: cannot read the recipe: {err.strerror or err}") from err
    if kind == "yaml":
        from detaug.transforms.recipe_file import safe_yaml_load

        try:
            data = safe_yaml_load(text, file=str(p))  # plain YAML, size and alias expansion bounded
        except RecipeError as err:
            raise CliError(" ".join(str(err).split())) from err
        except yaml.MarkedYAMLError as err:
            raise CliError(f"{p}: {_yaml_problem(err)}") from err
        except yaml.YAMLError as err:
            raise CliError(f"{p}: YAML error: {' '.join(str(err).split())}") from err
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CliError(f"{p}: line {err.lineno}, column {err.colno}: JSON syntax error: {err.msg}") from err
    if data is None:
        raise CliError(f"{p}: the recipe file is empty (see `detaug recipe` for one)")
    if not isinstance(data, (dict, list)):
        raise CliError(
            f"{p}: a recipe is a mapping with a 'transforms' list (see `detaug recipe`), "
            f"got a {type(data).__name__}"
        )
    try:
        return Compose.from_dict(data, lines=recipe_lines(text), file=str(p))
    except RecipeError as err:
        raise CliError(" ".join(str(err).split())) from err
    except (ValueError, TypeError) as err:
        raise CliError(f"{p}: {' '.join(str(err).split())}") from err


def _yaml_problem(err: Any) -> str:
    """``line L, column C: YAML syntax error: PROBLEM (CONTEXT at line L2)`` (1-based)."""
    mark = err.problem_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    text = f"{where}YAML syntax error: {err.problem or err.context or 'cannot parse'}"
    if err.context and err.problem and err.context_mark is not None:
        text += f" ({err.context} at line {err.context_mark.line + 1}, column {err.context_mark.column + 1})"
    return text


def load_recipe(path: str | None, size: int) -> Any:
    """The recipe of ``--recipe``, or the default detection recipe of output side ``size``."""
    from detaug.transforms import default_detection_recipe

    return default_detection_recipe(size=size) if path is None else read_recipe(path)


def make_source(args: argparse.Namespace) -> Any:
    """A source from ``--coco FILE --images DIR`` or ``--voc ROOT [--split NAME]``
    (:func:`detaug.source_args.source_from_args`; each error names its option); a VOC folder's
    report goes to stderr."""
    from detaug.source_args import source_from_args

    source = source_from_args(args, shuffle=True)
    if args.voc:
        print(source.report.summary(), file=sys.stderr)
    return source


def write_preview(loader: Any, recipe: Any, path: Path, count: int) -> Path:
    """Draw the first ``count`` samples of ``loader`` with their boxes into a PNG grid."""
    from detaug.preview import save_preview

    images, targets = next(iter(loader))
    if not isinstance(images, list):
        images = list(images)
    images, targets = images[:count], targets[:count]
    mean = std = None
    if recipe.normalize is not None:
        mean = [m * 255 for m in recipe.normalize.mean]
        std = [s * 255 for s in recipe.normalize.std]
    return save_preview(path, [i.cpu() for i in images], targets, loader.categories, mean=mean, std=std)


def _output_file(option: str, path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        raise CliError(f"{option} {p}: is a folder; give a file name (e.g. {p / 'preview.png'})")
    return p


# -- commands --------------------------------------------------------------------------------------


def cmd_preview(args: argparse.Namespace) -> int:
    from detaug.torch import DetectionLoader

    out = _output_file("--out", args.out)
    recipe = load_recipe(args.recipe, args.size)
    if args.device == "gpu":
        pick_device("gpu")  # no GPU: said before the dataset is read
    source = make_source(args)
    device = pick_device(args.device)
    loader = DetectionLoader(source, recipe, args.num, device=device, seed=args.seed, shuffle=True)
    path = write_preview(loader, recipe, out, args.num)
    print(f"wrote {path} ({args.num} samples, {device})")
    return 0


def cmd_recipe(args: argparse.Namespace) -> int:
    if args.preset and args.recipe:
        raise CliError("give --recipe or --preset, not both")
    if args.preset:
        from detaug.errors import RecipeError
        from detaug.transforms.presets import preset

        try:
            recipe = preset(args.preset)
        except RecipeError as err:
            raise CliError(f"--preset {err.problem}") from err
    else:
        recipe = load_recipe(args.recipe, args.size)
    sys.stdout.write(recipe.to_json() + "\n" if args.json else recipe.to_yaml())
    return 0


DEMO_SPLITS = {"train": 0.75, "val": 0.25}


def cmd_demo(args: argparse.Namespace) -> int:
    """Generate a VOC dataset, convert its train split to COCO, augment it, draw a preview, time it."""
    from converters.voc2coco import convert, write_coco_json
    from detaug.sources import CocoSource
    from detaug.synthetic import write_voc_dataset
    from detaug.torch import DetectionLoader

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out}: is a file; the demo writes a folder")
    recipe = load_recipe(args.recipe, args.size)
    device = pick_device(args.device)
    print(f"1/4 generating a demo Pascal VOC dataset of {args.num_images} images in {out / 'voc'}")
    write_voc_dataset(out / "voc", num_images=args.num_images, seed=args.seed, splits=DEMO_SPLITS)
    counts = {split: _split_size(out / "voc", split) for split in DEMO_SPLITS}
    print(
        f"2/4 converting the train split to COCO with voc2coco: {counts['train']} of the {args.num_images} "
        f"images (the generator splits them 75/25 into train and val; the {counts['val']} val images are "
        "held out, as a training run would)"
    )
    result = convert(out / "voc", split="train")
    print("    " + result.report.summary().replace("\n", "\n    "))
    annotations = out / "coco" / "train.json"
    write_coco_json(result.coco, annotations)
    print(f"    wrote {annotations}")
    print(f"3/4 augmenting the train split on the {device.upper()} with DALI: "
          f"{', '.join(type(t).__name__ for t in recipe.transforms)}")
    source = CocoSource(annotations, result.image_root, shuffle=True, seed=args.seed)
    loader = DetectionLoader(source, recipe, args.batch_size, device=device, seed=args.seed, num_threads=args.threads)
    preview = write_preview(loader, recipe, out / "preview.png", 16)
    count, start = 0, time.perf_counter()
    images: Any = None
    for _ in range(args.epochs):
        for images, targets in loader:
            count += len(targets)
    if device == "gpu":
        import torch

        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(f"4/4 wrote {preview}")
    shape = tuple(images.shape[1:]) if hasattr(images, "shape") else "ragged"
    print(
        f"throughput: {count / elapsed:.0f} img/s ({count} images in {elapsed:.2f} s, batch {args.batch_size}, "
        f"{args.epochs} epoch{'s' if args.epochs != 1 else ''} of the train split, device {device}, output {shape})"
    )
    return 0


def _split_size(root: Path, split: str) -> int:
    """Image ids listed in ``root/ImageSets/Main/<split>.txt``."""
    path = root / "ImageSets" / "Main" / f"{split}.txt"
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def cmd_bench(argv: Sequence[str], debug: bool = False) -> int:
    from detaug.bench.runner import main as bench_main

    return int(bench_main(list(argv), debug=debug) or 0)


# -- parser and entry point ------------------------------------------------------------------------


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--voc", metavar="ROOT", help="a Pascal VOC folder (Annotations/, JPEGImages/, ImageSets/Main/)")
    add_voc_options(parser)
    parser.add_argument("--coco", metavar="FILE", help="a COCO annotations JSON")
    parser.add_argument("--images", metavar="DIR", help="images folder of --coco")
    parser.add_argument("--allow-paths-outside", action="store_true",
                        help="accept --coco file_name entries that are absolute or leave --images (default: an error "
                             "naming them; docs/security.md)")


def build_parser() -> argparse.ArgumentParser:
    from detaug import __version__
    from detaug.bench.harness import available_cpus

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser = OneLineParser(prog="detaug", description="Detection-aware data augmentation on the GPU with DALI.",
                           parents=[common])
    parser.add_argument("--version", action="version", version=f"detaug {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,preview,recipe,shards,bench}")

    demo = sub.add_parser("demo", parents=[common],
                          help="generate a VOC dataset, convert its train split, augment it, write a preview, print img/s")
    demo.add_argument("--out", default="detaug-demo", help="output folder (default: %(default)s)")
    demo.add_argument("--num-images", type=positive_int, default=96)
    demo.add_argument("--batch-size", type=positive_int, default=16)
    demo.add_argument("--epochs", type=positive_int, default=3)
    demo.add_argument("--threads", type=positive_int, default=min(4, available_cpus()),
                      help="DALI CPU threads (default: %(default)s, from the CPUs here)")
    demo.add_argument("--size", type=positive_int, default=320, help="output size of the default recipe")
    demo.add_argument("--recipe", help="a recipe file (.yaml/.yml/.json, see `detaug recipe`) instead of the default")
    demo.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=cmd_demo)

    preview = sub.add_parser("preview", parents=[common], help="draw augmented samples with their boxes into a PNG grid")
    add_dataset_arguments(preview)
    preview.add_argument("--recipe", help="recipe file (.yaml/.yml/.json); default: the default detection recipe")
    preview.add_argument("--size", type=positive_int, default=512, help="output size of the default recipe")
    preview.add_argument("--out", default="preview.png", help="PNG file to write (default: %(default)s)")
    preview.add_argument("--num", type=positive_int, default=16, help="samples to draw")
    preview.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    preview.add_argument("--seed", type=int, default=0)
    preview.set_defaults(run=cmd_preview)

    recipe = sub.add_parser("recipe", parents=[common], help="print a recipe (default: the default detection recipe) as YAML")
    recipe.add_argument("--recipe", help="a recipe file (.yaml/.yml/.json) to check, normalise and print")
    recipe.add_argument("--preset", help="a named recipe: hflip, lsj, multiscale, ssd, ssdlite (torchvision's "
                        "detection references) or yolo")
    recipe.add_argument("--size", type=positive_int, default=512)
    recipe.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    recipe.set_defaults(run=cmd_recipe)

    from detaug.shards_cli import add_shards_parser

    add_shards_parser(sub, parents=[common])
    sub.add_parser("bench", help="benchmark: the decode limit, raw DALI, the loaders and the peers; --train: a detector's training "
                   "loop fed by each; --startup: start-up time (see `detaug bench --help`)",
                   add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    log_to_stderr()
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:], debug)
    args = build_parser().parse_args(argv)
    return run_guarded(f"detaug {args.command}", lambda: args.run(args), debug)


if __name__ == "__main__":
    sys.exit(main())
