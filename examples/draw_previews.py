"""Draw the preview pictures of docs/mixing.md: the YOLO recipe, and RandomPerspective with
RandomRotation(expand=True), through ``detaug preview`` on detaug's own synthetic scenes.

The repository keeps no pictures (they are outputs; ``../shared/realdata``'s photos are not ours
to copy): this script makes them. Each synthetic image gets a tint and a grid, so that the
mosaic's tiles and the warps show; boxes are drawn from the same plan as the pixels.

    python examples/draw_previews.py                 # writes docs/img/mosaic-yolo.png, perspective-rotation.png
    python examples/draw_previews.py --out /tmp/img --num 4

On real photos instead: ``detaug recipe --preset yolo > yolo.yaml`` then
``detaug preview --recipe yolo.yaml --voc ../shared/realdata/raccoon --out mosaic-yolo.png``.
"""

from __future__ import annotations

import argparse
import colorsys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import detaug.transforms as T
from detaug.cli import main as detaug_cli
from detaug.synthetic import write_voc_dataset

GRID = 24  # pixels between grid lines
PICTURES = {  # file name -> (recipe, preview seed)
    "mosaic-yolo.png": (lambda: T.yolo_recipe(320, mixup=0.3), 3),
    "perspective-rotation.png": (lambda: T.Compose([
        T.RandomPerspective(distortion_scale=0.5, p=1, fill=114),
        T.RandomRotation(degrees=20, expand=True, fill=114),
        T.LetterBox(256, fill=114),
    ]), 1),
}


def make_scenes(root: Path, num_images: int = 24) -> None:
    """A VOC folder of synthetic scenes, each image tinted (its own hue) and gridded."""
    write_voc_dataset(root, num_images=num_images, max_objects=5)
    for k, path in enumerate(sorted((root / "JPEGImages").glob("*.jpg"))):
        image = np.asarray(Image.open(path).convert("RGB")).astype(np.float32)
        image *= np.array(colorsys.hsv_to_rgb(k / num_images, 0.35, 1.0), np.float32)
        image[::GRID] *= 0.55
        image[:, ::GRID] *= 0.55
        Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(path, quality=95)


def draw(out: Path, num: int = 6, device: str = "cpu") -> list[Path]:
    """Write every picture of :data:`PICTURES` into ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as work:
        scenes = Path(work) / "scenes"
        make_scenes(scenes)
        for name, (recipe, seed) in PICTURES.items():
            recipe_file = Path(work) / f"{Path(name).stem}.yaml"
            recipe_file.write_text(recipe().to_yaml())
            code = detaug_cli(["preview", "--recipe", str(recipe_file), "--voc", str(scenes), "--labels", "discover",
                               "--out", str(out / name), "--device", device, "--num", str(num), "--seed", str(seed)])
            if code != 0:
                raise SystemExit(code)
            written.append(out / name)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "img")
    parser.add_argument("--num", type=int, default=6, help="samples per picture")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "auto"))
    args = parser.parse_args()
    for path in draw(args.out, args.num, args.device):
        print("wrote", path)
