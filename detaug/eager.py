"""Eager calls: one recipe on one sample, as albumentations and torchvision users call them.

``recipe(image=..., boxes=..., labels=..., **fields)`` (and ``transform(...)``) runs
:func:`apply`: the sample is planned by the loaders' own planner (:class:`detaug.planning.BatchPlanner`
on a one-sample source: the same checks, EXIF rule and seed contract) and its pixels made by the
same DALI pipeline (:func:`detaug.pipeline.build_pipeline`, built once per recipe, device and
input kind in each process, batch size 1). With ``seed``, ``epoch`` and ``image_id`` the result is
exactly what ``DetectionLoader`` / ``DetectionSequence`` give that sample on the same device.

A recipe that mixes images (``Mosaic``, ``MixUp``) draws its partners from the one-sample
source of the call: the image is its own partner. Per-box fields (``iscrowd``, ``difficult``, a track id, ...: any array of length ``N``) follow
their boxes through every transform and filter; ``area``, when given, is recomputed in output
pixels; ``keypoints`` (``[N, K, 3]`` ``(x, y, v)`` pixels, :mod:`detaug.keypoints`) are moved
with their boxes, as the loaders move them, and so are ``rotated_boxes`` (:mod:`detaug.rotated`) and
``masks`` (uint8 ``[N, H, W]``, :mod:`detaug.masks`). Boxes come back in the ``box_format`` they
were given in, and every array in the type it was given as: torch tensors (on their device) for
tensors, NumPy arrays for anything else.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from detaug.boxes import box_area
from detaug.formats.box_formats import check_box_format, from_xyxy, to_xyxy
from detaug.keypoints import KEYPOINTS
from detaug.masks import MASKS
from detaug.rotated import ROTATED_BOXES

__all__ = ["apply"]

_PIPELINES: "OrderedDict[tuple, Any]" = OrderedDict()
_LOCK = threading.Lock()
_CACHE_SIZE = 8


def _image_kind(image: Any) -> tuple[str, Any, bool]:
    """``(kind, array or bytes for detaug, on_cuda)``: kind is "numpy", "pil", "torch" or "encoded"."""
    if isinstance(image, np.ndarray):
        return ("encoded" if image.ndim == 1 else "numpy"), image, False
    if isinstance(image, (bytes, bytearray, memoryview, str)) or hasattr(image, "__fspath__"):
        return "encoded", image, False
    try:
        from PIL import Image

        if isinstance(image, Image.Image):
            return "pil", np.asarray(image.convert("RGB")), False
    except ImportError:  # pragma: no cover - PIL ships with detaug's dependencies
        pass
    try:
        import torch

        if isinstance(image, torch.Tensor):
            on_cuda = image.is_cuda
            t = image.detach().cpu()
            if t.ndim == 3 and t.shape[0] in (1, 3) and t.shape[-1] not in (1, 3):
                t = t.permute(1, 2, 0)  # CHW -> HWC
            return "torch", t.contiguous().numpy(), on_cuda
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"image must be a NumPy uint8 [H, W, 3] array, a PIL image, a torch tensor, a path or bytes; "
                    f"got {type(image).__name__}")


def _pipeline(recipe: Any, source: Any, device: str, layout: str) -> Any:
    from detaug.pipeline import build_pipeline

    key = (recipe.to_json(), device, bool(source.decoded), source.orientation, layout, threading.get_ident())
    with _LOCK:
        pipe = _PIPELINES.get(key)
        if pipe is not None:
            _PIPELINES.move_to_end(key)
            return pipe
    pipe = build_pipeline(source, recipe, batch_size=1, device=device, num_threads=1, layout=layout,
                          prefetch_queue_depth=1)
    pipe.build()
    with _LOCK:
        _PIPELINES[key] = pipe
        while len(_PIPELINES) > _CACHE_SIZE:
            _PIPELINES.popitem(last=False)
    return pipe


def apply(
    recipe: Any,
    image: Any,
    boxes: Any = None,
    labels: Any = None,
    *,
    seed: int = 0,
    epoch: int = 0,
    image_id: int = 0,
    box_format: str = "xyxy",
    device: str | None = None,
    orientation: str = "auto",
    **fields: Any,
) -> dict[str, Any]:
    """Run ``recipe`` (a :class:`~detaug.transforms.Compose`) on one sample.

    Args:
        image: uint8 ``[H, W, 3]`` (or ``[H, W]``) NumPy array, a PIL image, a uint8 torch tensor
            ``[3, H, W]`` (a CUDA tensor runs on the GPU), or an encoded image (path or bytes).
        boxes: ``[N, 4]`` in ``box_format`` (``"xyxy"``, ``"xywh"``, ``"cxcywh"`` pixels, or
            ``"yolo"``: normalised cxcywh; one box may be given as ``[4]``), a NumPy array,
            a torch tensor or nested lists; none when omitted.
        labels: ``[N]`` integer labels (zeros when omitted).
        seed, epoch, image_id: the sample's key (:mod:`detaug.seeds`): the same key gives what
            the loaders give this sample. ``image_id`` 0 becomes 1, as in a one-sample list.
        device: ``"cpu"`` or ``"gpu"``; default: the GPU for a CUDA tensor, else the CPU.
        fields: per-box arrays of length ``N``, returned for the boxes kept, in order;
            ``keypoints``: ``[N, K, 3]`` ``(x, y, visibility)`` in pixels (continuous
            coordinates, whatever ``box_format``), returned moved to the output image
            (:mod:`detaug.keypoints`; the recipe's ``keypoint_flip_pairs`` apply);
            ``rotated_boxes``: ``[N, 5]`` cxcywhr (angle in degrees) or ``[N, 8]`` corners in
            pixels, returned as the minimum-area rectangle of their visible part, in the
            format given (:mod:`detaug.rotated`); ``masks``: uint8 (or bool) ``[N, H, W]`` 0/1,
            the image's size, returned uint8 ``[M, H', W']`` on the output image
            (:mod:`detaug.masks`).

    Returns:
        ``{"image", "boxes", "labels", **fields}``: the image as given (NumPy ``[H, W, 3]``,
        PIL for PIL input when uint8, torch ``[3, H, W]`` for tensors; float32 after
        ``Normalize``), float32 ``[M, 4]`` boxes in ``box_format`` on the output image, int64
        ``[M]`` labels, and each field's kept rows (``area`` recomputed in output pixels). Boxes,
        labels and each field come back as torch tensors (on the input's device) where they were
        given as tensors, else as NumPy arrays; labels omitted follow the boxes.

    Raises:
        ValueError: boxes that are not ``[N, 4]`` (the message gives the shape found), as many
            labels or field rows as boxes, an unknown ``box_format``.
    """
    from detaug.epochs import EpochSpec
    from detaug.planning import BatchPlanner
    from detaug.sources import Sample, SampleListSource

    check_box_format(box_format)
    kind, data, on_cuda = _image_kind(image)
    device = device or ("gpu" if on_cuda else "cpu")
    box_in = np.zeros((0, 4)) if boxes is None else _box_rows(boxes, box_format)
    n = len(box_in)
    label_in = np.zeros(n, np.int64) if labels is None else np.asarray(_numpy(labels)).reshape(-1)
    if len(label_in) != n:
        raise ValueError(f"{n} boxes but {len(label_in)} labels")
    extra = {}
    for name, values in fields.items():
        arr = np.asarray(_numpy(values))
        if arr.shape[:1] != (n,):
            raise ValueError(f"field {name!r} has {arr.shape[0] if arr.ndim else 'no'} rows, expected one per box ({n})")
        extra[name] = arr
    hw = (int(data.shape[0]), int(data.shape[1])) if kind != "encoded" else None
    if box_format == "yolo" and hw is None:
        from detaug.formats.images import probe_file

        hw = probe_file(data).displayed_hw if isinstance(data, str) else None
    xyxy = to_xyxy(box_in, box_format, hw).astype(np.float32)
    # Labels become row indices for planning: the kept rows then index labels and every field.
    rows = np.arange(n, dtype=np.int64)
    moved = {name: extra[name] for name in (KEYPOINTS, ROTATED_BOXES, MASKS) if name in extra}  # planned, checked as in a source
    source = SampleListSource([Sample(data, xyxy, rows, image_id=int(image_id), fields=moved)], orientation=orientation)
    planner = BatchPlanner(source, recipe, EpochSpec(n=1, batch_size=1, seed=int(seed)), on_error="raise")
    planned = planner.plan(int(epoch), 0)
    if planned.data is None or planned.partners is None:
        planner.fill_data(planned)
    layout = "CHW" if kind == "torch" else "HWC"
    from detaug.pipeline import feed, pick_device, take_outputs

    pipe = _pipeline(recipe, source, pick_device(device), layout)
    feed(pipe, planned.data, planned.params, planned.partners)
    out = take_outputs(pipe)[0]
    kept = planned.labels[0].astype(np.int64)
    out_image = _image_out(out, kind, image)
    out_hw = tuple(int(v) for v in (out_image.shape[-2:] if kind == "torch" else np.asarray(out_image).shape[:2]))
    result: dict[str, Any] = {
        "image": out_image,
        "boxes": _like(from_xyxy(planned.boxes[0], box_format, out_hw), boxes),
        "labels": _like(label_in[kept].astype(np.int64), boxes if labels is None else labels),
    }
    for name, arr in extra.items():
        result[name] = _like(planned.fields[0][name] if name in moved else arr[kept], fields[name])
    if "area" in extra:
        b = planned.boxes[0]
        result["area"] = _like(box_area(b, np.float32), fields["area"])
    return result


def _box_rows(boxes: Any, box_format: str) -> np.ndarray:
    """float64 ``[N, 4]`` of ``boxes`` (``[N, 4]``, one box ``[4]``, or empty), else a
    ``ValueError`` naming the shape expected and the one given."""
    try:
        arr = np.asarray(_numpy(boxes), dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"boxes must be an [N, 4] array of numbers ({box_format!r}), got {type(boxes).__name__}: "
                         f"{err}") from None
    if arr.size == 0:
        return np.zeros((0, 4))
    if arr.shape == (4,):
        return arr.reshape(1, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"boxes must be [N, 4] (N boxes in {box_format!r}, or one box as [4]), "
                         f"got shape {list(arr.shape)}")
    return arr


def _like(values: np.ndarray, given: Any) -> Any:
    """``values`` as a torch tensor on ``given``'s device when ``given`` is a tensor (a
    torchvision ``BoundingBoxes`` gives a plain tensor), else as they are (NumPy)."""
    if not hasattr(given, "detach"):
        return values
    import torch

    return torch.from_numpy(np.ascontiguousarray(values)).to(given.device)


def _numpy(values: Any) -> Any:
    """Torch tensors (and torchvision ``BoundingBoxes``) to NumPy; anything else as is."""
    if hasattr(values, "detach"):
        return values.detach().cpu().numpy()
    return values


def _image_out(out: Any, kind: str, original: Any) -> Any:
    if kind == "torch":
        import torch

        from detaug.handover import dali_images_to_torch

        device = original.device if hasattr(original, "device") else torch.device("cpu")
        images = dali_images_to_torch(out, device)
        return images[0]
    tensor = out.as_cpu() if hasattr(out, "as_cpu") else out
    array = np.array(tensor.at(0))
    if kind == "pil" and array.dtype == np.uint8:
        from PIL import Image

        return Image.fromarray(array)
    return array
