"""``detaug`` command line: ``demo``, ``preview``, ``recipe`` and ``bench``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["main"]


def auto_device(device: str) -> str:
    """``"gpu"`` when asked, or when ``"auto"`` and CUDA is available; else ``"cpu"``."""
    if device != "auto":
        return device
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def load_recipe(path: str | None, size: int):
    from detaug.transforms import Compose, default_detection_recipe

    return default_detection_recipe(size=size) if path is None else Compose.load(path)


def make_source(args: argparse.Namespace):
    """A source from ``--coco/--images`` or ``--voc [--split]``."""
    from detaug.sources import CocoSource, VocSource

    if args.voc:
        source = VocSource(args.voc, args.split, labels=args.labels)
        print(source.report.summary(), file=sys.stderr)
        return source
    if args.coco:
        if not args.images:
            raise SystemExit("detaug: --coco needs --images (the folder the file_name entries are relative to)")
        return CocoSource(args.coco, args.images, shuffle=True, seed=args.seed)
    raise SystemExit("detaug: give a dataset: --voc ROOT or --coco FILE --images DIR")


def write_preview(loader, recipe, path: Path, count: int) -> Path:
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


def cmd_preview(args: argparse.Namespace) -> int:
    from detaug.torch import DetectionLoader

    recipe = load_recipe(args.recipe, args.size)
    device = auto_device(args.device)
    loader = DetectionLoader(make_source(args), recipe, args.num, device=device, seed=args.seed, shuffle=True)
    path = write_preview(loader, recipe, Path(args.out), args.num)
    print(f"wrote {path} ({args.num} samples, {device})")
    return 0


def cmd_recipe(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe, args.size)
    sys.stdout.write(recipe.to_json() + "\n" if args.json else recipe.to_yaml())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Generate a VOC dataset, convert it to COCO, augment it, draw a preview, time it."""
    from converters.voc2coco import convert, write_coco_json
    from detaug.sources import CocoSource
    from detaug.synthetic import write_voc_dataset
    from detaug.torch import DetectionLoader

    out = Path(args.out)
    device = auto_device(args.device)
    recipe = load_recipe(args.recipe, args.size)
    print(f"1/4 generating a demo Pascal VOC dataset of {args.num_images} images in {out / 'voc'}")
    write_voc_dataset(out / "voc", num_images=args.num_images, seed=args.seed, splits={"train": 0.75, "val": 0.25})
    print("2/4 converting it to COCO with voc2coco")
    result = convert(out / "voc", split="train")
    print("    " + result.report.summary().replace("\n", "\n    "))
    annotations = out / "coco" / "train.json"
    write_coco_json(result.coco, annotations)
    print(f"    wrote {annotations}")
    print(f"3/4 augmenting on the {device.upper()} with DALI: {', '.join(type(t).__name__ for t in recipe.transforms)}")
    source = CocoSource(annotations, result.image_root, shuffle=True, seed=args.seed)
    loader = DetectionLoader(source, recipe, args.batch_size, device=device, seed=args.seed, num_threads=args.threads)
    preview = write_preview(loader, recipe, out / "preview.png", 16)
    count, start = 0, time.perf_counter()
    for _ in range(args.epochs):
        for images, targets in loader:
            count += len(targets)
    if device == "gpu":
        import torch

        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print(f"4/4 wrote {preview}")
    print(
        f"throughput: {count / elapsed:.0f} img/s ({count} images in {elapsed:.2f} s, batch {args.batch_size}, "
        f"{args.epochs} epochs, device {device}, output {tuple(images.shape[1:]) if hasattr(images, 'shape') else 'ragged'})"
    )
    return 0


def cmd_bench(argv: Sequence[str]) -> int:
    from detaug.bench import main as bench_main

    return int(bench_main(list(argv)) or 0)


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--voc", help="a Pascal VOC folder (Annotations/, JPEGImages/, ImageSets/Main/)")
    parser.add_argument("--split", help="VOC split (ImageSets/Main/<split>.txt); default: every XML")
    parser.add_argument("--labels", default="discover", help="VOC labels: voc, discover or a labels file")
    parser.add_argument("--coco", help="a COCO annotations JSON")
    parser.add_argument("--images", help="images folder of --coco")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="detaug", description="Detection-aware data augmentation on the GPU with DALI.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="generate a VOC dataset, convert it, augment it, write a preview, print img/s")
    demo.add_argument("--out", default="detaug-demo", help="output folder (default: %(default)s)")
    demo.add_argument("--num-images", type=int, default=96)
    demo.add_argument("--batch-size", type=int, default=16)
    demo.add_argument("--epochs", type=int, default=3)
    demo.add_argument("--threads", type=int, default=4, help="DALI CPU threads")
    demo.add_argument("--size", type=int, default=320, help="output size of the default recipe")
    demo.add_argument("--recipe", help="a recipe file (YAML/JSON, see `detaug recipe`) instead of the default")
    demo.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=cmd_demo)

    preview = sub.add_parser("preview", help="draw augmented samples with their boxes into a PNG grid")
    add_dataset_arguments(preview)
    preview.add_argument("--recipe", help="recipe file (YAML/JSON); default: the default detection recipe")
    preview.add_argument("--size", type=int, default=512, help="output size of the default recipe")
    preview.add_argument("--out", default="preview.png")
    preview.add_argument("--num", type=int, default=16, help="samples to draw")
    preview.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    preview.add_argument("--seed", type=int, default=0)
    preview.set_defaults(run=cmd_preview)

    recipe = sub.add_parser("recipe", help="print a recipe (default: the default detection recipe) as YAML")
    recipe.add_argument("--recipe", help="a recipe file to normalise and print")
    recipe.add_argument("--size", type=int, default=512)
    recipe.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    recipe.set_defaults(run=cmd_recipe)

    sub.add_parser("bench", help="GPU benchmark against raw DALI, torchvision and albumentations (see `detaug bench --help`)", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"detaug {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
