"""The hand-over of a batch to PyTorch: DALI's images and the planner's targets as tensors on the
images' device.

Images: a DALI ``TensorList`` becomes one tensor ``[B, ...]`` (uniform shapes) or a list of
tensors (:func:`dali_images_to_torch`).

Targets: the batch's columns (``boxes`` float32 ``[N, 4]`` xyxy, ``labels`` int64 ``[N]`` class
indices, per-box fields ``[N, ...]``, in sample order) are written into one host buffer (pinned
memory for a CUDA device), copied to the device in **one** non-blocking copy, and every target
tensor is a view of that one device buffer (:func:`columns_to_device`). The batches of one run
(:mod:`detaug.pipeline_runs`) share one buffer and one copy (:func:`host_targets`, then
:func:`targets_to_device` for all of them): the loader's feed thread then makes a few tensor
calls a run, not a dozen a batch (each call lets the training thread take the interpreter lock,
and the feed thread waits to get it back). Three forms (:data:`TARGET_FORMS`,
:func:`build_targets`):

- ``"dict"``: torchvision's list of per-image dicts ``{"boxes": [N_i, 4], "labels": [N_i],
  "image_id": int, **fields}`` (views of the batch's columns);
- ``"padded"``: one dict ``{"boxes": float32 [B, M, 4], "labels": int64 [B, M], "num_boxes":
  int64 [B], "image_id": int64 [B], **fields [B, M, ...]}``, rows past an image's boxes
  :data:`PAD_VALUE` (as Keras' targets), ``M`` = ``max_boxes`` or the batch's largest count;
- ``"concat"``: one dict ``{"boxes": float32 [N, 4], "labels": int64 [N], "batch_index": int64
  [N], "num_boxes": int64 [B], "image_id": int64 [B], **fields [N, ...]}``, the form YOLO-style
  losses take (``batch_index[j]``: the image of box ``j``).

Nothing here knows transforms, sources or pipelines: it is the bottom of the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["PAD_VALUE", "TARGET_FORMS", "HostTargets", "build_targets", "columns_to_device", "dali_images_to_torch",
           "host_targets", "image_dicts", "targets_to_device"]

#: The forms of :func:`build_targets` (``DetectionLoader(targets=...)``, besides ``"tv_tensors"``).
TARGET_FORMS = ("dict", "padded", "concat")

#: The value of padded rows of the ``"padded"`` form (boxes, labels and fields), as in Keras' targets.
PAD_VALUE = -1

#: Byte alignment of each column in the packed buffer (any dtype's element size divides it).
_ALIGN = 16


def columns_to_device(arrays: dict[str, np.ndarray], device: torch.device, *,
                      pack: bool | None = None) -> dict[str, torch.Tensor]:
    """``{name: array}`` as tensors on ``device``, of the arrays' dtypes and shapes.

    On the CPU the tensors share the arrays' memory (no copy). On a CUDA device the arrays are
    packed into one pinned host buffer (each column at a 16-byte aligned offset) and copied in
    one ``non_blocking`` copy on the current stream, so the host never waits for the GPU; each
    tensor is a view of that one device buffer, made by one ``as_strided`` call on a view of the
    buffer in its dtype (one such view a dtype). (Pinned buffers come from PyTorch's caching host
    allocator, which reuses one only once its copy has run.) ``pack=True`` packs on the CPU
    too (into one plain host buffer: how the tests check the packing without a GPU).
    """
    arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    if not (device.type == "cuda" if pack is None else pack):
        return {name: torch.from_numpy(a) for name, a in arrays.items()}
    offsets, total = {}, 0
    for name, a in arrays.items():
        total = -(-total // _ALIGN) * _ALIGN
        offsets[name] = total
        total += a.nbytes
    total = max(-(-total // _ALIGN) * _ALIGN, _ALIGN)  # a whole number of elements of any dtype
    host = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    raw = host.numpy()
    for name, a in arrays.items():
        raw[offsets[name] : offsets[name] + a.nbytes] = a.reshape(-1).view(np.uint8)
    on_device = host.to(device, non_blocking=True)
    typed: dict[np.dtype, torch.Tensor] = {}
    out = {}
    for name, a in arrays.items():
        base = typed.get(a.dtype)
        if base is None:
            base = typed[a.dtype] = on_device.view(_torch_dtype(a.dtype))
        strides = [stride // a.itemsize for stride in a.strides]  # C-contiguous: NumPy's, in elements
        out[name] = base.as_strided(a.shape, strides, offsets[name] // a.itemsize)
    return out


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """PyTorch's dtype for a NumPy one (as ``torch.from_numpy`` maps it)."""
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.zeros(0, dtype)).dtype
    return found


@dataclass
class HostTargets:
    """One batch's targets on the host, ready to go to the device (:func:`host_targets`):
    ``columns`` as :func:`targets_to_device` copies them (the ``"dict"`` form: the per-box
    columns, split per image on the device; the others: the form's tensors themselves),
    ``counts`` int64 ``[B]`` boxes per image, ``image_ids`` int64 ``[B]``."""

    form: str
    columns: dict[str, np.ndarray]
    counts: np.ndarray
    image_ids: np.ndarray


def host_targets(
    counts: list[int] | np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    fields: dict[str, np.ndarray],
    image_ids: np.ndarray,
    form: str = "dict",
    max_boxes: int | None = None,
) -> HostTargets:
    """A batch's targets in ``form``, on the host (the arguments as :func:`build_targets`'s);
    errors here (``max_boxes`` too small, an unknown form), before anything is copied."""
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    image_ids = np.asarray(image_ids, dtype=np.int64).reshape(-1)
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if form == "dict":
        return HostTargets(form, {"boxes": boxes, "labels": labels, **fields}, counts, image_ids)
    if form == "concat":
        batch_index = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        return HostTargets(form, {"boxes": boxes, "labels": labels, "batch_index": batch_index,
                                  "num_boxes": counts, "image_id": image_ids, **fields}, counts, image_ids)
    if form == "padded":
        most = int(counts.max()) if counts.size else 0
        rows_per_image = most if max_boxes is None else int(max_boxes)
        if most > rows_per_image:
            k = int(np.argmax(counts))
            raise ValueError(f"image {int(image_ids[k])} has {most} boxes, more than max_boxes={rows_per_image} "
                             "of the padded targets: raise max_boxes (or leave it None for the batch's largest count)")
        rows = np.repeat(np.arange(len(counts)), counts)
        slots = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)

        def padded(values: np.ndarray) -> np.ndarray:
            if values.dtype == np.uint8:  # masks (0/1, detaug.masks): int8, to hold the -1 rows
                values = values.astype(np.int8)
            out = np.full((len(counts), rows_per_image, *values.shape[1:]), PAD_VALUE, dtype=values.dtype)
            out[rows, slots] = values
            return out

        return HostTargets(form, {"boxes": padded(boxes), "labels": padded(labels), "num_boxes": counts,
                                  "image_id": image_ids, **{name: padded(np.asarray(v)) for name, v in fields.items()}},
                           counts, image_ids)
    raise ValueError(f"form must be one of {', '.join(map(repr, TARGET_FORMS))}, got {form!r}")


def targets_to_device(batches: Sequence[HostTargets],
                      device: torch.device) -> list[list[dict[str, Any]] | dict[str, torch.Tensor]]:
    """The targets of ``batches`` (one form) on ``device``, from **one** copy for all of them:
    per batch what :func:`build_targets` gives (every tensor a view of one device buffer, which
    lives while any of them does). The ``"dict"`` form's per-image tensors come from one split a
    column over all the batches' images (a column whose trailing shape differs between batches,
    such as masks padded to each batch's largest image, is split batch by batch)."""
    if not batches:
        return []
    form = batches[0].form
    if any(b.form != form for b in batches):
        raise ValueError("targets_to_device takes batches of one form")
    if form != "dict":
        on_device = columns_to_device({f"{k}/{name}": a for k, b in enumerate(batches) for name, a in b.columns.items()},
                                      device)
        return [{name: on_device[f"{k}/{name}"] for name in b.columns} for k, b in enumerate(batches)]
    names = list(batches[0].columns)
    if any(list(b.columns) != names for b in batches):
        raise ValueError("targets_to_device takes batches of the same columns")
    joined = [name for name in names
              if len({(b.columns[name].dtype, b.columns[name].shape[1:]) for b in batches}) == 1]
    def join(arrays: list[np.ndarray]) -> np.ndarray:  # one batch's as it is: no copy
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    host = {name: join([b.columns[name] for b in batches]) for name in joined}
    host.update((f"{k}/{name}", b.columns[name]) for k, b in enumerate(batches) for name in names if name not in joined)
    on_device = columns_to_device(host, device)
    every = join([b.counts for b in batches]).tolist()
    split = {name: on_device[name].split_with_sizes(every) for name in joined}
    out, first = [], 0
    for k, b in enumerate(batches):
        mine = {name: split[name][first : first + len(b.counts)] for name in joined}
        mine.update((name, on_device[f"{k}/{name}"].split_with_sizes(b.counts.tolist()))
                    for name in names if name not in joined)
        out.append(image_dicts({name: mine[name] for name in names}, b.image_ids.tolist()))
        first += len(b.counts)
    return out


def image_dicts(columns: dict[str, Sequence[torch.Tensor]], image_ids: list[int]) -> list[dict[str, Any]]:
    """The ``"dict"`` form from each per-box column already split per image (``columns``:
    ``boxes``, ``labels``, then the fields, in order): ``{"boxes", "labels", "image_id": int,
    **fields}`` per image."""
    targets = [{"boxes": box, "labels": lab, "image_id": i}
               for box, lab, i in zip(columns["boxes"], columns["labels"], image_ids)]
    for name in list(columns)[2:]:
        for target, value in zip(targets, columns[name]):
            target[name] = value
    return targets


def build_targets(
    counts: list[int] | np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    fields: dict[str, np.ndarray],
    image_ids: np.ndarray,
    device: torch.device,
    form: str = "dict",
    max_boxes: int | None = None,
) -> list[dict[str, Any]] | dict[str, torch.Tensor]:
    """A batch's targets on ``device`` in one copy, in ``form`` (:data:`TARGET_FORMS`).

    Args:
        counts: ``counts[i]``, image ``i``'s boxes (``B`` entries).
        boxes: float32 ``[N, 4]`` xyxy output-image pixels, images in order (``N = sum(counts)``).
        labels: int64 ``[N]`` class indices.
        fields: ``{name: [N, ...]}`` per-box fields, in their dtypes.
        image_ids: int ``[B]``.
        device: where the tensors go (the images' device).
        form: ``"dict"``, ``"padded"`` or ``"concat"`` (see the module docstring).
        max_boxes: ``"padded"`` only: rows per image (``None``: the batch's largest count). An
            image with more boxes is a ``ValueError`` naming it.

    Returns:
        ``"dict"``: a list of ``B`` dicts; else one dict of batched tensors.
    """
    return targets_to_device([host_targets(counts, boxes, labels, fields, image_ids, form, max_boxes)], device)[0]


def dali_images_to_torch(images: Any, device: torch.device, *, copy: bool = True) -> torch.Tensor | list[torch.Tensor]:
    """A DALI ``TensorList`` as one ``torch`` tensor (uniform shapes) or a list of tensors, on
    ``device`` (the pipeline's: the GPU's outputs stay there, the CPU's on the host).

    GPU outputs are always copied into tensors of PyTorch's, on PyTorch's current stream
    (non-blocking): PyTorch reuses the memory of a freed tensor only in that stream's order,
    while a DALI buffer handed over through DLPack goes back to DALI's pool when the last tensor
    on it is freed, whatever the GPU still has queued that reads it. Host outputs are copied too
    unless ``copy=False``: then the tensors are DALI's own output buffers, handed over through
    DLPack (no copy, no new memory), which only a pipeline whose outputs outlive their run allows
    (:func:`detaug.pipeline.outputs_outlive_runs`: DALI's default executor)."""
    from nvidia.dali.backend import TensorListGPU

    if isinstance(images, TensorListGPU):
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        stream = torch.cuda.current_stream(device)
        if images.is_dense_tensor():
            tensor = images.as_tensor()
            out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=device)
            feed_ndarray(tensor, out, cuda_stream=stream)
            return out
        result = []
        for i in range(len(images)):
            t = images[i]
            out = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=device)
            feed_ndarray(t, out, cuda_stream=stream)
            result.append(out)
        return result
    host = (lambda t: torch.from_numpy(np.array(t))) if copy else torch.from_dlpack
    if images.is_dense_tensor():
        return host(images.as_tensor())
    return [host(images[i]) for i in range(len(images))]
