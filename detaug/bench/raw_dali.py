"""The reference: the benchmarked recipe written by hand with plain DALI operators.

One ``@pipeline_def`` read top to bottom, iterated with ``pipe.run()``; the harness copies the
images into a PyTorch tensor on the same device and the boxes into a list of target dicts, the
same work the detaug iterator does. Boxes stay relative (DALI's ``readers.coco(ratio=True)``) up
to the affine step, whose box matrix also takes them to output pixels.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali import math as dmath

from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings
from detaug.bench.recipe import RecipeSpec

__all__ = ["build_pipeline", "detection_pipeline", "iter_raw_dali"]


@pipeline_def
def detection_pipeline(file_root: str, annotations_file: str, *, spec: RecipeSpec, decode_device: str,
                       decoder: dict | None = None):
    """Decode, augment and normalize one batch; returns ``images, boxes, labels``.

    ``decoder``: keyword arguments of the image decoder (:func:`detaug.decoding.decoder_options`).

    Call it with the pipeline's own arguments too: ``batch_size``, ``num_threads``, ``device_id``
    (``None`` for a CPU-only pipeline), ``seed``.

    * ``images``: float32 ``[3, size, size]`` per sample, ImageNet-normalized, on the GPU when
      ``decode_device == "mixed"``.
    * ``boxes``: float32 ``[N, 4]`` absolute xyxy in output pixels, clamped to the image (CPU).
    * ``labels``: int32 ``[N]`` COCO category ids (CPU).
    """
    size = float(spec.size)
    # 1. read: boxes are relative xyxy
    jpegs, boxes, labels = fn.readers.coco(
        file_root=file_root,
        annotations_file=annotations_file,
        ltrb=True,
        ratio=True,
        skip_empty=True,
        random_shuffle=True,
        name="Reader",
    )
    # 2. random IoU crop: the window is chosen on the boxes, then only that window is decoded;
    #    one box reaching the threshold suffices (SSD and torchvision), not all of them
    crop_anchor, crop_shape, boxes, labels = spec.dali_random_bbox_crop(boxes, labels)
    images = fn.decoders.image_slice(
        jpegs, crop_anchor, crop_shape, device=decode_device, output_type=types.RGB, **(decoder or {})
    )
    # 3. horizontal flip: one draw for the image and its boxes
    flip = fn.random.coin_flip(probability=spec.flip_p)
    images = fn.flip(images, horizontal=flip)
    boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
    # 4. random affine about the centre, as a forward matrix in pixels of the cropped image; its
    #    size comes from the JPEG header and the window, rounded as image_slice rounds (no CPU
    #    operator waits for the GPU decoder)
    full_hw = fn.cast(fn.peek_image_shape(jpegs), dtype=types.FLOAT)
    full_wh = fn.stack(full_hw[1], full_hw[0])
    wh = dmath.floor((crop_anchor + crop_shape) * full_wh + 0.5) - dmath.floor(crop_anchor * full_wh + 0.5)
    centre = wh * 0.5
    angle = fn.random.uniform(range=[-spec.rotate_deg, spec.rotate_deg])
    offset = fn.random.uniform(range=[-spec.translate_frac, spec.translate_frac], shape=[2]) * wh
    zoom = fn.random.uniform(range=list(spec.scale_range))
    shear_x = fn.random.uniform(range=[-spec.shear_x_deg, spec.shear_x_deg])
    mt = fn.transforms.shear(angles=fn.stack(shear_x, types.Constant(0.0)), center=centre)
    mt = fn.transforms.scale(mt, scale=fn.stack(zoom, zoom), center=centre)
    mt = fn.transforms.rotation(mt, angle=angle, center=centre)
    mt = fn.transforms.translation(mt, offset=offset)
    images = fn.warp_affine(
        images,
        matrix=mt,
        fill_value=float(spec.fill),
        interp_type=types.INTERP_LINEAR,
        inverse_map=False,
    )
    #    boxes: relative -> crop pixels -> affine -> output pixels, applied to all four corners
    box_mt = fn.transforms.combine(fn.transforms.scale(scale=wh), mt, fn.transforms.scale(scale=size / wh))
    x0, y0, x1, y1 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    corners = fn.reshape(fn.stack(x0, y0, x1, y0, x0, y1, x1, y1, axis=1), shape=[-1, 2])
    corners = fn.reshape(fn.coord_transform(corners, MT=box_mt), shape=[-1, 4, 2])
    boxes = fn.cat(fn.reductions.min(corners, axes=1), fn.reductions.max(corners, axes=1), axis=1)
    boxes = dmath.clamp(boxes, 0.0, size)
    # 5. resize to size x size
    images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=True)
    # 6. colour jitter (color_twist's hue is in degrees)
    images = fn.color_twist(
        images,
        brightness=fn.random.uniform(range=[1.0 - spec.brightness, 1.0 + spec.brightness]),
        contrast=fn.random.uniform(range=[1.0 - spec.contrast, 1.0 + spec.contrast]),
        saturation=fn.random.uniform(range=[1.0 - spec.saturation, 1.0 + spec.saturation]),
        hue=fn.random.uniform(range=[-360.0 * spec.hue, 360.0 * spec.hue]),
    )
    # 7. normalize to float32 CHW
    images = fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=[255.0 * m for m in spec.mean],
        std=[255.0 * s for s in spec.std],
    )
    return images, boxes, labels


def build_pipeline(dataset: BenchDataset, settings: BenchSettings, spec: RecipeSpec):
    """The built pipeline for ``settings`` (mixed decoding on the GPU, CPU decoding otherwise;
    the decoder settings detaug uses by default, :func:`detaug.decoding.decoder_options`)."""
    from detaug.decoding import decoder_options

    gpu = settings.device == "gpu"
    pipe = detection_pipeline(
        str(dataset.images_dir),
        str(dataset.annotations_file),
        spec=spec,
        decode_device="mixed" if gpu else "cpu",
        decoder=decoder_options(gpu),
        batch_size=settings.batch_size,
        num_threads=settings.threads,
        device_id=0 if gpu else None,
        seed=settings.seed,
        prefetch_queue_depth=2,
    )
    pipe.build()
    return pipe


def iter_raw_dali(dataset: BenchDataset, settings: BenchSettings) -> Iterator[tuple]:
    """The ``raw-dali`` variant: endless ``(images, targets)`` batches.

    Per batch: ``pipe.run()``; the images are copied into a new ``[B, 3, size, size]`` float32
    tensor on the device (on PyTorch's current stream); each sample's boxes (float32 ``[N, 4]``
    xyxy pixels) and labels (int64 ``[N]``) become CPU tensors in a target dict, boxes under one
    pixel wide or high dropped (as torchvision's ``SanitizeBoundingBoxes`` does).
    """
    from nvidia.dali.plugin.pytorch import feed_ndarray

    spec = RecipeSpec(size=settings.size)
    pipe = build_pipeline(dataset, settings, spec)
    gpu = settings.device == "gpu"
    device = torch.device(settings.torch_device)
    try:
        while True:
            images, boxes, labels = pipe.run()
            batch = torch.empty((len(images), 3, spec.size, spec.size), dtype=torch.float32, device=device)
            stream = torch.cuda.current_stream() if gpu else None
            feed_ndarray(images.as_tensor(), batch, cuda_stream=stream)
            targets = [
                _target(np.asarray(boxes.at(i)), np.asarray(labels.at(i)), spec.min_box_size)
                for i in range(len(boxes))
            ]
            yield batch, targets
    finally:
        del pipe


def _target(boxes: np.ndarray, labels: np.ndarray, min_size: float) -> dict:
    boxes = boxes.reshape(-1, 4)
    wh = boxes[:, 2:] - boxes[:, :2]
    keep = (wh >= min_size).all(axis=1)
    return {
        "boxes": torch.from_numpy(np.ascontiguousarray(boxes[keep])),
        "labels": torch.from_numpy(labels.reshape(-1)[keep].astype(np.int64)),
    }
