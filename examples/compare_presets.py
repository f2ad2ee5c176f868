"""Compare detaug's presets with torchvision's detection reference policies on real photos.

For each preset (``hflip``, ``lsj``, ``multiscale``, ``ssd``, ``ssdlite``), the same photos and boxes
go through detaug's ``DetectionLoader`` (``detaug.transforms.preset(name)``) and through torchvision's
``transforms.v2`` policy of ``references/detection/presets.py`` (followed by
``SanitizeBoundingBoxes``, as there), ``--repeats`` times each. Printed side by side: boxes kept per
sample, the share of samples keeping all their boxes, the median box area (output pixels) and the
median output height and width, with detaug's relative difference to torchvision.

    python examples/compare_presets.py --voc ../shared/realdata/raccoon --voc ../shared/realdata/bccd \
        --repeats 20 --json presets.json

torchvision must import next to the installed torch (it does on the GPU machine); detaug runs on
the GPU when there is one; torchvision's draws are spread over DataLoader workers (``--workers``,
default: every CPU). The figures are statistics of random draws: with ~2,000 samples per preset
their standard error is about 1% for the shares; the median box area of ``lsj`` (scales drawn in
[0.1, 2]) needs ~10,000 (``--repeats 120`` over ~85 photos).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

PRESET_NAMES = ("hflip", "lsj", "multiscale", "ssd", "ssdlite")
MEAN = (123.0, 117.0, 104.0)


def torchvision_policy(name: str):  # noqa: ANN201 - torchvision objects
    """torchvision's ``DetectionPresetTrain(data_augmentation=name, use_v2=True)`` transforms."""
    import torchvision.transforms.v2 as T

    policies = {
        "hflip": [T.RandomHorizontalFlip(p=0.5)],
        "lsj": [T.ScaleJitter(target_size=(1024, 1024), antialias=True),
                T.RandomCrop(size=(1024, 1024), pad_if_needed=True, fill=MEAN), T.RandomHorizontalFlip(p=0.5)],
        "multiscale": [T.RandomShortestSize(min_size=(480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800),
                                            max_size=1333), T.RandomHorizontalFlip(p=0.5)],
        "ssd": [T.RandomPhotometricDistort(), T.RandomZoomOut(fill=MEAN), T.RandomIoUCrop(),
                T.RandomHorizontalFlip(p=0.5)],
        "ssdlite": [T.RandomIoUCrop(), T.RandomHorizontalFlip(p=0.5)],
    }
    return T.Compose([*policies[name], T.SanitizeBoundingBoxes()])


def statistics(kept: list[int], given: list[int], areas: list[float], sizes: list[tuple[int, int]]) -> dict:
    kept_a, given_a = np.asarray(kept), np.asarray(given)
    return {
        "samples": len(kept),
        "boxes_kept_per_sample": float(kept_a.mean()),
        "share_keeping_all_boxes": float((kept_a == given_a).mean()),
        "median_box_area": float(np.median(areas)) if areas else 0.0,
        "median_height": float(np.median([s[0] for s in sizes])),
        "median_width": float(np.median([s[1] for s in sizes])),
    }


class TorchvisionDraws:
    """Draw ``k`` (of ``repeats * len(samples)``): photo ``k % len(samples)`` through the
    preset's torchvision policy; ``(boxes kept, boxes given, box areas, output (h, w))``.
    A map-style dataset, so that DataLoader workers spread the draws over the cores."""

    def __init__(self, name: str, samples: list, repeats: int) -> None:
        self.name, self.repeats = name, repeats
        self.files = [str(s.image) for s in samples]
        self.boxes = [np.asarray(s.boxes, np.float32).reshape(-1, 4) for s in samples]
        self.labels = [np.asarray(s.labels, np.int64).reshape(-1) for s in samples]
        self.policy = None

    def __len__(self) -> int:
        return self.repeats * len(self.files)

    def __getitem__(self, k: int) -> tuple[int, int, list[float], tuple[int, int]]:
        import torch
        from torchvision import tv_tensors
        from torchvision.io import ImageReadMode, decode_image

        if self.policy is None:
            self.policy = torchvision_policy(self.name)
        i = k % len(self.files)
        image = decode_image(self.files[i], mode=ImageReadMode.RGB)  # 3 channels, as detaug decodes
        boxes = tv_tensors.BoundingBoxes(torch.as_tensor(self.boxes[i]), format="XYXY", canvas_size=tuple(image.shape[-2:]))
        out_image, out = self.policy(tv_tensors.Image(image), {"boxes": boxes, "labels": torch.as_tensor(self.labels[i])})
        b = out["boxes"]
        return len(b), len(self.boxes[i]), ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])).tolist(), tuple(out_image.shape[-2:])


def _one_thread(_: int) -> None:
    import torch

    torch.set_num_threads(1)


def run_torchvision(name: str, samples: list, repeats: int, seed: int, workers: int = 0) -> dict:
    """The statistics of ``repeats`` passes of torchvision's policy over ``samples``, the draws
    spread over ``workers`` DataLoader processes (spawned: DALI may have run in this process)."""
    import torch

    torch.manual_seed(seed)
    draws = TorchvisionDraws(name, samples, repeats)
    loader = torch.utils.data.DataLoader(
        draws, batch_size=None, num_workers=workers, worker_init_fn=_one_thread if workers else None,
        multiprocessing_context="spawn" if workers else None)
    kept, given, areas, sizes = [], [], [], []
    for n_kept, n_given, box_areas, size in loader:
        kept.append(int(n_kept))
        given.append(int(n_given))
        areas += list(box_areas)
        sizes.append(tuple(int(x) for x in size))
    return statistics(kept, given, areas, sizes)


def run_detaug(name: str, source, repeats: int, seed: int, device: str) -> dict:
    from detaug.torch import DetectionLoader
    from detaug.transforms import preset

    given_by_id = {int(s.image_id): len(s.boxes) for s in source.samples}
    loader = DetectionLoader(source, preset(name), batch_size=16, device=device, seed=seed, shuffle=True)
    kept, given, areas, sizes = [], [], [], []
    for epoch in range(repeats):
        loader.set_epoch(epoch)
        for images, targets in loader:
            for image, t in zip(images, targets):
                b = t["boxes"].cpu().numpy()
                kept.append(len(b))
                given.append(given_by_id[int(t["image_id"])])
                areas += ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])).tolist()
                sizes.append(tuple(image.shape[-2:]))
    loader.close()
    return statistics(kept, given, areas, sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voc", action="append", required=True, help="a Pascal VOC folder (repeatable)")
    parser.add_argument("--preset", action="append", choices=PRESET_NAMES, help="default: all five")
    parser.add_argument("--repeats", type=int, default=20, help="passes over the photos per preset")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None,
                        help="processes for torchvision's draws (default: the CPUs available)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from detaug.sources import SampleListSource, VocSource

    samples = []
    for root in args.voc:
        voc = VocSource(root)
        samples += [s for s in voc.samples if len(s.boxes)]
    for i, s in enumerate(samples):  # unique ids over the folders
        s.image_id = i + 1
    source = SampleListSource(samples)
    workers = len(os.sched_getaffinity(0)) if args.workers is None else args.workers
    results = {}
    print(f"{len(samples)} photos with boxes, {args.repeats} passes per preset")
    header = f"{'preset':<11} {'statistic':<24} {'torchvision':>12} {'detaug':>12} {'rel. diff':>9}"
    print(header + "\n" + "-" * len(header))
    for name in args.preset or PRESET_NAMES:
        tv = run_torchvision(name, samples, args.repeats, args.seed, workers)
        da = run_detaug(name, source, args.repeats, args.seed, args.device)
        results[name] = {"torchvision": tv, "detaug": da}
        for key in tv:
            if key == "samples":
                continue
            diff = (da[key] - tv[key]) / tv[key] if tv[key] else float("nan")
            print(f"{name:<11} {key:<24} {tv[key]:>12.4g} {da[key]:>12.4g} {diff:>+9.2%}")
        sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
