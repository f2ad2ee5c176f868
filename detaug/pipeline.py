"""The DALI pipeline: one definition, read top to bottom, that runs a ``Compose`` on a source.

It moves pixels only: what to read and how to warp it comes planned from the host
(:mod:`detaug.planning`), boxes and labels too.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from detaug.errors import DeviceError
from detaug.transforms import Compose

__all__ = ["DEVICES", "build_pipeline", "cuda_devices", "feed", "pick_device", "resolve_device"]


DEVICES = ("auto", "gpu", "cuda", "cpu")
_said: set[str] = set()


def cuda_devices() -> int:
    """How many CUDA devices DALI can use (0 without a driver, a GPU, or DALI's CUDA build)."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return int(GetCUDADeviceCount())
    except Exception:  # noqa: BLE001 - no driver library, a CPU-only DALI: no GPU for DALI
        return 0


def pick_device(device: str) -> str:
    """``"gpu"`` or ``"cpu"`` for ``device``: ``"auto"`` is the GPU where DALI can use one, else
    the CPU (said once in the ``detaug`` log); ``"gpu"`` where there is none is a
    :class:`~detaug.errors.DeviceError` saying what was looked for."""
    if device not in DEVICES:
        raise ValueError(f"device must be 'auto', 'gpu' or 'cpu', got {device!r}")
    if device == "cpu":
        return "cpu"
    count = cuda_devices()
    if device == "auto":
        picked = "gpu" if count else "cpu"
        if picked not in _said:
            _said.add(picked)
            logging.getLogger("detaug").info(
                "device='auto': %s", f"the GPU ({count} CUDA device(s) for DALI)" if count else
                "the CPU (DALI finds no CUDA device); pass device='cpu' to say so",
            )
        return picked
    if not count:
        raise DeviceError(
            "device='gpu' but DALI finds no CUDA device (looked for an NVIDIA driver and a CUDA GPU "
            "through DALI's CUDA 12 build, nvidia-dali-cuda120); use device='cpu' or device='auto'"
        )
    return "gpu"


def resolve_device(device: str, device_id: int | None) -> int | None:
    """DALI's ``device_id`` for ``device`` (``"auto"``, ``"gpu"``/``"cuda"`` or ``"cpu"``): ``None``
    for the CPU."""
    if pick_device(device) == "cpu":
        return None
    return 0 if device_id is None else int(device_id)


def build_pipeline(
    source: Any,
    transforms: Compose,
    *,
    batch_size: int,
    device: str = "gpu",
    device_id: int | None = None,
    num_threads: int = 4,
    seed: int = 0,
    layout: str = "CHW",
    prefetch_queue_depth: int = 2,
) -> Any:
    """Build (not yet run) the DALI pipeline of ``transforms`` for batches of ``source``.

    The pipeline only moves pixels: its two external sources are fed, batch by batch, with
    ``pipe.feed_input("data", ...)`` (per sample, encoded bytes uint8 ``[L]`` or a decoded
    ``uint8 [H, W, 3]`` array) and ``pipe.feed_input("params", ...)`` (float32 ``[B, P]``: the
    plan of :class:`~detaug.planning.PlannedBatch`); boxes and labels are the plan's.

    Args:
        source: a source of :mod:`detaug.sources` (its ``decoded`` flag says which data it
            feeds; its ``orientation`` says whether the decoder applies EXIF orientation:
            everything but ``"ignore"`` does).
        transforms: the recipe.
        batch_size: the maximal batch size.
        device: ``"gpu"`` (nvJPEG decoding, image ops on the GPU), ``"cpu"`` or ``"auto"``.
        layout: ``"CHW"`` (PyTorch) or ``"HWC"`` (Keras) for the images.
        prefetch_queue_depth: batches that may be fed and scheduled before their outputs are taken.

    Output: the augmented images, ``[3, H, W]`` or ``[H, W, 3]``, float32 when the recipe ends
    with ``Normalize``, else uint8; on the GPU with ``device="gpu"``.
    """
    from nvidia.dali import fn, pipeline_def, types

    dali_device_id = resolve_device(device, device_id)
    on_gpu = dali_device_id is not None
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    decoded_input = bool(getattr(source, "decoded", False))
    adjust_orientation = getattr(source, "orientation", "auto") != "ignore"

    @pipeline_def(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=dali_device_id,
        seed=seed,
        prefetch_queue_depth=prefetch_queue_depth,
    )
    def detection_pipeline():
        # 1-2. The planned batch: images (encoded, or decoded arrays) and each sample's parameter
        #      vector (decode ROI, warp matrices and sizes, photometric parameters; see
        #      Compose.param_slices), planned on the host (detaug.planning).
        data = fn.external_source(name="data", layout="HWC" if decoded_input else None)
        params = fn.external_source(name="params")
        layout_of = transforms.param_slices()
        roi_anchor, roi_shape = params[0:2], params[2:4]

        # 3. Decode only the region the first warp reads (ROI decoding), on the GPU if asked;
        #    EXIF orientation applied unless the source says "ignore" (the plan's frame).
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
                adjust_orientation=adjust_orientation,
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

        # 6. The output stage (Normalize: float32) and the layout.
        if transforms.output is not None:
            images = transforms.output.dali_output(images, layout)
        elif layout == "CHW":
            images = fn.transpose(images, perm=[2, 0, 1])
        return images

    return detection_pipeline()


def feed(pipe: Any, data: list[np.ndarray], params: np.ndarray) -> None:
    """Feed one planned batch to a pipeline of :func:`build_pipeline` and schedule its run."""
    pipe.feed_input("data", data)
    pipe.feed_input("params", params)
    pipe.schedule_run()
