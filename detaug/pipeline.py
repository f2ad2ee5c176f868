"""The DALI pipeline: one definition, read top to bottom, that runs a ``Compose`` on a source.

Outputs, per sample:

* ``images``: the augmented image, ``[3, H, W]`` (``layout="CHW"``) or ``[H, W, 3]`` (``"HWC"``),
  float32 when the recipe ends with ``Normalize``, else uint8; on the GPU with ``device="gpu"``.
* ``boxes``: float32 ``[M, 4]`` absolute ``xyxy`` boxes on the output image (CPU).
* ``labels``: int32 ``[M]`` category ids of those boxes (CPU).
* ``image_ids``: int32 ``[1]``.
"""

from __future__ import annotations

from typing import Any, Callable

from detaug.feeding import FEED_COLUMNS
from detaug.sources import CocoSource, SampleListSource
from detaug.transforms import Compose

__all__ = ["build_pipeline", "resolve_device"]


def resolve_device(device: str, device_id: int | None) -> int | None:
    """DALI's ``device_id`` for ``device`` (``"gpu"``/``"cuda"`` or ``"cpu"``)."""
    if device not in ("gpu", "cuda", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
    if device == "cpu":
        return None
    return 0 if device_id is None else int(device_id)


def build_pipeline(
    source: CocoSource | SampleListSource,
    transforms: Compose,
    *,
    batch_size: int,
    device: str = "gpu",
    device_id: int | None = None,
    num_threads: int = 4,
    seed: int = 0,
    shard_id: int = 0,
    num_shards: int = 1,
    layout: str = "CHW",
    feed: Callable[[Any], tuple[list[Any], ...]] | None = None,
    num_workers: int = 0,
    prefetch_queue_depth: int = 2,
    targets: bool = True,
) -> Any:
    """Build (not yet run) the DALI pipeline of ``transforms`` over ``source``.

    Args:
        source: a :class:`CocoSource` (fed by a :class:`~detaug.feeding.ReaderFeeder`) or a
            :class:`SampleListSource` (fed by a :class:`~detaug.feeding.BatchFeeder`).
        transforms: the recipe.
        batch_size: the maximal batch size.
        device: ``"gpu"`` (nvJPEG decoding, image ops on the GPU) or ``"cpu"``.
        feed: a feeder from :mod:`detaug.feeding` (or any callable taking DALI's ``BatchInfo``)
            returning one planned batch as the
            :data:`~detaug.feeding.FEED_COLUMNS` lists; ``None`` creates external sources named
            after those columns, to fill with ``pipe.feed_input``.
        num_workers: worker processes that run ``feed`` ahead of the pipeline (DALI's parallel
            external source, started with ``spawn``); 0 runs it in this process.
        layout: ``"CHW"`` (PyTorch) or ``"HWC"`` (Keras) for the images.
        targets: pass the planned boxes, labels and image ids through to the outputs; ``False``:
            the images are the only output, and with ``feed=None`` only ``"data"`` and
            ``"params"`` are fed (for a caller that holds the plan).
    """
    from nvidia.dali import fn, pipeline_def, types

    dali_device_id = resolve_device(device, device_id)
    on_gpu = dali_device_id is not None
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    decoded_input = isinstance(source, SampleListSource) and source.decoded
    parallel = feed is not None and num_workers > 0 and isinstance(source, SampleListSource)
    workers = {"py_num_workers": num_workers, "py_start_method": "spawn"} if parallel else {}

    @pipeline_def(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=dali_device_id,
        seed=seed,
        prefetch_queue_depth=prefetch_queue_depth,
        **workers,
    )
    def detection_pipeline():
        # 1-2. Read and plan: images (encoded, or decoded arrays), each sample's parameter vector
        #      (decode ROI, warp matrices and sizes, photometric parameters; see
        #      Compose.param_slices), and the output boxes (xyxy pixels) and labels.
        if feed is not None:  # planned by the feeder, in worker processes when parallel
            queue = {"prefetch_queue_depth": max(2, num_workers)} if parallel else {}
            data, params, out_boxes, out_labels, image_ids = fn.external_source(
                source=feed, num_outputs=5, batch=True, batch_info=True, parallel=parallel,
                layout=["HWC" if decoded_input else None, None, None, None, None], **queue,
            )
        else:
            data, params, *passed = (
                fn.external_source(name=name, layout="HWC" if (name == "data" and decoded_input) else None)
                for name in (FEED_COLUMNS if targets else FEED_COLUMNS[:2])
            )
            out_boxes, out_labels, image_ids = passed if targets else (None, None, None)
        layout_of = transforms.param_slices()
        roi_anchor, roi_shape = params[0:2], params[2:4]

        # 3. Decode only the region the first warp reads (ROI decoding), on the GPU if asked.
        if decoded_input:
            images = fn.slice(
                data, roi_anchor, roi_shape, axis_names="WH", normalized_anchor=False, normalized_shape=False
            )
            images = images.gpu() if on_gpu else images
        else:
            images = fn.decoders.image_slice(
                data, roi_anchor, roi_shape,
                normalized_anchor=False, normalized_shape=False,
                device="mixed" if on_gpu else "cpu", output_type=types.RGB,
            )

        # 4. Geometry: one affine warp per segment (forward matrices, DALI pixel space).
        for (matrix, size), fill in zip(layout_of["warps"], transforms.segment_fills):
            images = fn.warp_affine(
                images, matrix=fn.reshape(params[matrix], shape=[2, 3]), size=params[size], inverse_map=False,
                fill_value=fill, interp_type=types.INTERP_LINEAR,
            )

        # 5. Photometric transforms, in recipe order, with the planned per-sample parameters.
        for t, where in zip(transforms.photometric, layout_of["photometric"]):
            images = t.dali(images, [params[i] for i in range(where.start, where.stop)])

        # 6. Normalize and lay out.
        if transforms.normalize is not None:
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout=layout,
                mean=[m * 255 for m in transforms.normalize.mean],
                std=[s * 255 for s in transforms.normalize.std],
            )
        elif layout == "CHW":
            images = fn.transpose(images, perm=[2, 0, 1])
        if not targets:
            return images
        return images, out_boxes, out_labels, image_ids

    return detection_pipeline()
