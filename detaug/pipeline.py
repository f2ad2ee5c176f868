"""The DALI pipeline: one definition, read top to bottom, that runs a ``Compose`` on a source.

It moves pixels only: what to read and how to warp it comes planned from the host
(:mod:`detaug.planning`), boxes and labels too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from detaug.decoding import decoder_options, default_num_threads
from detaug.errors import DeviceError

if TYPE_CHECKING:  # the pipeline reads a recipe through its methods; recipes sit above it (tests/test_layers.py)
    from detaug.transforms import Compose

__all__ = ["DEVICES", "GraphParts", "build_pipeline", "cuda_devices", "feed", "feed_first_run", "feed_inputs", "input_names",
           "outputs_outlive_runs", "pick_device", "resolve_device", "schedule_run", "take_outputs"]


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
    num_threads: int | None = None,
    seed: int = 0,
    layout: str = "CHW",
    prefetch_queue_depth: int = 2,
    hw_decoder_load: float | None = None,
) -> Any:
    """Build (not yet run) the DALI pipeline of ``transforms`` for batches of ``source``.

    The pipeline only moves pixels: its external sources are fed, batch by batch, by
    :func:`feed` with ``"data"`` (per sample, encoded bytes uint8 ``[L]`` or a decoded
    ``uint8 [H, W, 3]`` array), ``"params"`` (float32 ``[B, P]``: the plan of
    :class:`~detaug.planned_batch.PlannedBatch`, laid out by ``transforms.plan_layout``) and, for a recipe with
    mixing transforms,
    ``"data_1"`` ... ``"data_J"`` (the partner images, ``PlannedBatch.partners``, but for slots
    of ``pool="batch"``, taken from the batch's own images; see :func:`input_names`); boxes and
    labels are the plan's.

    Args:
        source: a source of :mod:`detaug.sources` (its ``decoded`` flag says which data it
            feeds; its ``orientation`` says whether the decoder applies EXIF orientation:
            everything but ``"ignore"`` does).
        transforms: the recipe.
        batch_size: the maximal batch size.
        device: ``"gpu"`` (nvJPEG decoding, image ops on the GPU), ``"cpu"`` or ``"auto"``.
        layout: ``"CHW"`` (PyTorch) or ``"HWC"`` (Keras) for the images.
        prefetch_queue_depth: batches that may be fed and scheduled before their outputs are taken.
        num_threads: DALI CPU threads; ``None``: the CPUs this process may use divided by the
            ranks on the host, 1 to 16 (:func:`detaug.decoding.default_num_threads`).
        hw_decoder_load: the share of JPEGs sent to the GPU's hardware decoder where it has one
            (A100, H100, H200, ...); ``None``: ``DETAUG_HW_DECODER_LOAD`` when set, else 0.8
            (:func:`detaug.decoding.decoder_options`).

    Output: the augmented images, ``[3, H, W]`` or ``[H, W, 3]``, float32 when the recipe ends
    with ``Normalize``, else uint8; on the GPU with ``device="gpu"``.
    """
    from nvidia.dali import fn, pipeline_def, types

    dali_device_id = resolve_device(device, device_id)
    decoder = decoder_options(dali_device_id is not None, hw_decoder_load=hw_decoder_load)  # the GPU's hardware decoder
    num_threads = default_num_threads() if num_threads is None else int(num_threads)
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
        enable_conditionals=any(t.conditional for t in transforms.mixing),  # MixUp blends only where it applies
    )
    def detection_pipeline():
        # 1-2. The planned batch: images (encoded, or decoded arrays), partner images of mixing
        #      transforms, and each sample's parameter vector (decode ROIs, warp matrices and
        #      sizes, blend ratio, photometric parameters), planned on the host
        #      (detaug.planning); its fields are read by name (Compose.plan_layout,
        #      detaug.plan_layout), each a slice of the one "params" input.
        #    Fed without a copy (no_copy): the fed arrays stay alive until the batch's outputs
        #    are taken (feed_inputs says so).
        data = fn.external_source(name="data", layout="HWC" if decoded_input else None, no_copy=True)
        fed = {k: fn.external_source(name=f"data_{k + 1}", layout="HWC" if decoded_input else None, no_copy=True)
               for k in range(transforms.num_partners) if k not in transforms.batch_slots}
        params = fn.external_source(name="params", no_copy=True)
        plan = transforms.plan_layout
        pasted = (fn.external_source(name=input_names(transforms)[-1], layout="HWC", no_copy=True)
                  if getattr(transforms.blend_stage, "pastes_masks", False) else None)  # CopyPaste's paste masks

        def value(name):
            """Plan field ``name`` of every sample: a scalar, or a vector in the field's shape."""
            f = plan.field(name)
            if not f.shape:
                return params[f.start]
            v = params[f.start:f.start + f.size]
            return v if len(f.shape) == 1 else fn.reshape(v, shape=list(f.shape))

        def decode(encoded, roi):
            """Decode only the region of plan field ``roi`` (x, y, w, h) of each image, on the GPU
            if asked; EXIF orientation applied unless the source says "ignore" (the plan's frame)."""
            where = plan.slice(roi)
            anchor, shape = params[where.start:where.start + 2], params[where.start + 2:where.stop]
            if decoded_input:
                images = fn.slice(encoded, anchor, shape, axis_names="WH", normalized_anchor=False, normalized_shape=False)
                return images.gpu() if on_gpu else images
            return fn.decoders.image_slice(
                encoded, anchor, shape,
                normalized_anchor=False, normalized_shape=False,
                device="mixed" if on_gpu else "cpu", output_type=types.RGB,
                adjust_orientation=adjust_orientation, **decoder,
            )

        def warp(images, matrix, size, fill):
            """One warp by the forward matrix of plan field ``matrix`` in DALI pixel space (affine:
            [2, 3]; projective: [3, 3]) to the size of field ``size``. On the CPU an affine warp
            runs as the projective warp of the same map (the same pixels to rounding; DALI's CPU
            warp_perspective takes a quarter of the time of its CPU warp_affine:
            docs/benchmarks.md, "The CPU path")."""
            projective = plan.field(matrix).shape == (3, 3)
            where = plan.slice(matrix)
            if projective or not on_gpu:
                m = params[where]
                if not projective:  # [a b c; d e f] -> [a b c; d e f; 0 0 1]
                    m = fn.cat(m, types.Constant(np.array([0, 0, 1], np.float32), device="cpu"))
                return fn.experimental.warp_perspective(
                    images, matrix=fn.reshape(m, shape=[3, 3]), size=value(size), inverse_map=False,
                    fill_value=fill, interp_type=types.INTERP_LINEAR, pixel_origin="corner",
                )
            return fn.warp_affine(
                images, matrix=value(matrix), size=value(size), inverse_map=False,
                fill_value=fill, interp_type=types.INTERP_LINEAR,
            )

        def partner(k, own, roi):
            """Partner slot ``k``'s image: decoded from its own input (region ``roi``), or, for a
            slot with ``pool="batch"``, the batch-mate's whole image (``own``, decoded once) at the
            batch position the plan gives."""
            if k not in transforms.batch_slots:
                return decode(fed[k], roi)
            index = fn.cast(value(f"slot{k}.batch_index"), dtype=types.INT32)
            return fn.permute_batch(own, indices=index)

        graph = GraphParts(value=value, decode=decode, warp=warp, partner=partner, data=data, on_gpu=on_gpu,
                           pasted=pasted)

        # 3. Decode only what is needed (all of each image where batch-mates share it); a canvas
        #    stage (Mosaic) composes the first canvas from the sample's images instead, decoding
        #    of each only what it shows of the part the first warp reads.
        canvas, blend = transforms.canvas_stage, transforms.blend_stage
        if canvas is not None:
            images, own = canvas.dali_canvas(graph, transforms.slots_of(canvas))
        else:
            own = images = decode(data, "roi")

        # 4. Geometry: one warp per segment (forward matrices, DALI pixel space); a blend stage
        #    (MixUp) blends its partner in where it stands in the recipe.
        for s, fill in enumerate(transforms.segment_fills):
            if blend is not None and s == transforms.blend_at:
                images = blend.dali_blend(graph, images, own, transforms.slots_of(blend))
            images = warp(images, f"warp{s}.matrix", f"warp{s}.size", fill)
        if blend is not None and transforms.blend_at == len(transforms.segments):
            images = blend.dali_blend(graph, images, own, transforms.slots_of(blend))

        # 5. Photometric transforms, in recipe order, with the planned per-sample parameters. On
        #    the CPU the last one hands float32 to an output stage that takes it, where it can
        #    (dali_float: DALI's CPU conversion to uint8 costs more than ColorJitter's op).
        photometric = transforms.photometric
        float_last = not on_gpu and transforms.output is not None and transforms.output.takes_float
        for k, t in enumerate(photometric):
            values = [value(f"photometric{k}.{name}") for name in t.param_names]
            out = t.dali_float(images, values) if float_last and k == len(photometric) - 1 else None
            images = t.dali(images, values) if out is None else out

        # 6. The output stage (Normalize: float32) and the layout.
        if transforms.output is not None:
            images = transforms.output.dali_output(images, layout)
        elif layout == "CHW":
            images = fn.transpose(images, perm=[2, 0, 1])
        return images

    return detection_pipeline()


@dataclass(frozen=True)
class GraphParts:
    """The parts of :func:`build_pipeline`'s graph that a mixing transform's DALI fragment uses
    (:class:`detaug.transforms.mixing.MixingTransform`), inside the pipeline definition.

    Attributes:
        value: ``value(field)``: plan field ``field`` of every sample (a DataNode: a scalar, or
            a vector in the field's shape).
        decode: ``decode(data, roi_field)``: the region of plan field ``roi_field`` of images ``data``.
        warp: ``warp(images, matrix_field, size_field, fill)``: one warp by a planned forward matrix.
        partner: ``partner(slot, own, roi_field)``: partner slot ``slot``'s image (decoded from
            its input, or a batch-mate's ``own`` image for a slot of ``pool="batch"``).
        data: the sample's own image data (the ``"data"`` input).
        on_gpu: the pipeline runs on the GPU.
        pasted: a blend stage's paste masks (``CopyPaste``: uint8 ``[H, W, 1]`` per sample, on
            the CPU), the last input of :func:`input_names`; ``None`` for other recipes.
    """

    value: Callable[[str], Any]
    decode: Callable[[Any, str], Any]
    warp: Callable[[Any, str, str, float], Any]
    partner: Callable[[int, Any, str], Any]
    data: Any
    on_gpu: bool
    pasted: Any = None


def outputs_outlive_runs(pipe: Any) -> bool:
    """Whether ``pipe``'s outputs stay valid after later runs, for as long as they are referenced:
    DALI's default (dynamic) executor gives new output buffers every run (``pipe.exec_dynamic``),
    where its legacy executors write later runs into the same ones. Host outputs of such a
    pipeline may be handed over without a copy."""
    return bool(getattr(pipe, "exec_dynamic", False))


def input_names(transforms: Compose) -> list[str]:
    """The external sources of :func:`build_pipeline`'s pipeline for ``transforms``, in feeding
    order: ``"data"``, ``"params"``, then ``"data_k"`` for each partner slot ``k = 1 .. J``
    (``J = transforms.num_partners``: ``Mosaic``'s tiles 1-3, then ``MixUp``'s partner) but
    those of ``transforms.batch_slots``, whose images are the batch's own; then, for a blend
    that pastes objects by their masks (``CopyPaste``), ``"data_{J + 1}"``: its paste masks
    (``PlannedBatch.partners``' last entry)."""
    pastes = getattr(transforms.blend_stage, "pastes_masks", False)
    return ["data", "params"] + [f"data_{k + 1}" for k in range(transforms.num_partners)
                                 if k not in transforms.batch_slots] + ([f"data_{transforms.num_partners + 1}"]
                                                                        if pastes else [])


def feed_inputs(pipe: Any, data: list[np.ndarray], params: np.ndarray,
                partners: list[list[np.ndarray] | None] | None = None) -> None:
    """Feed one planned batch to a pipeline of :func:`build_pipeline` without scheduling its run:
    ``data``, ``params`` and, for a recipe with mixing transforms, ``partners``
    (``PlannedBatch.partners``: per partner slot, one image per sample, or ``None`` for a slot
    whose images are batch-mates).

    DALI reads the arrays where they are (no copy): they must stay alive and unchanged until
    the batch's outputs are taken (callers keep the ``PlannedBatch`` until then)."""
    _set_input(pipe, "data", data)
    _set_input(pipe, "params", params)
    for k, images in enumerate(partners or [], start=1):
        if images is not None:
            _set_input(pipe, f"data_{k}", images)


def _set_input(pipe: Any, name: str, data: list[np.ndarray] | np.ndarray) -> None:
    """``pipe.feed_input(name, data)`` for arrays detaug planned itself (host numpy arrays of
    one dimensionality, at most a batch of them), without ``feed_input``'s per-sample checks
    and conversions: each array wrapped as a DALI ``TensorCPU`` (no copy), the list handed to
    the pipeline's backend as ``feed_input`` does in the end: a batch of 64 (bytes and
    parameters) takes the loader's main thread 0.12 ms this way against 0.27-0.29 ms through
    ``feed_input`` (docs/benchmarks.md, "The main thread's cost per batch"). Where the backend
    call is not there (another DALI version) or refuses the arguments, ``feed_input`` runs
    instead, from then on."""
    global _direct_feed
    backend = getattr(pipe, "_pipe", None) if _direct_feed else None
    if backend is not None and pipe._built:
        from nvidia.dali.backend import TensorCPU, TensorListCPU

        try:
            if isinstance(data, np.ndarray):
                backend.SetExternalTLInput(name, TensorListCPU(data, ""), None, False)
            else:
                backend.SetExternalTensorInput(name, [TensorCPU(a, "") for a in data], None, False)
            return
        except (AttributeError, TypeError):  # not this DALI's backend API: the public call from now on
            _direct_feed = False
    pipe.feed_input(name, data)


_direct_feed = True  # False once the backend call failed (see _set_input)


def schedule_run(pipe: Any) -> None:
    """``pipe.schedule_run()``: run the fed inputs (DALI's scheduled API).

    After the pipeline's first (public) call, the run is started as ``schedule_run`` starts it,
    without the call's API-type scope: DALI defines a new class on every such call
    (``Pipeline._check_api_type_scope``), about 18 objects a call that only Python's cycle
    collector frees, which made these two calls a batch the loaders' main source of garbage
    collections (a full collection took 165-176 ms of a training step on an H200, 2026-11-27).
    A DALI without these internals gets the public call, from then on."""
    global _direct_run
    if _direct_run and _scheduled_before(pipe):
        try:
            run_once = pipe._run_once
        except AttributeError:
            _direct_run = False
        else:
            with _api_checked(pipe):
                run_once()
            return
    pipe.schedule_run()


def take_outputs(pipe: Any) -> list[Any]:
    """``pipe.outputs()``: the outputs of the oldest scheduled run (the host waits until they
    are ready), without the API-type scope's class after the pipeline's first call (see
    :func:`schedule_run`)."""
    global _direct_run
    if _direct_run and _scheduled_before(pipe):
        try:
            pending, outputs = pipe._batches_to_consume, pipe._outputs
        except AttributeError:
            _direct_run = False
        else:
            pipe._consumer_iter += 1
            if pending == 0:
                raise StopIteration
            pipe._batches_to_consume = pending - 1
            with _api_checked(pipe):
                return outputs()
    return pipe.outputs()


def _scheduled_before(pipe: Any) -> bool:
    """``pipe`` was built and run through the scheduled API, as DALI 2.4's pipeline records it."""
    from nvidia.dali import types

    return (getattr(pipe, "_built", False) and getattr(pipe, "_first_iter", True) is False
            and getattr(pipe, "_api_type", None) == types.PipelineAPIType.SCHEDULED
            and hasattr(pipe, "_skip_api_check") and hasattr(pipe, "_consumer_iter"))


@contextlib.contextmanager
def _api_checked(pipe: Any) -> Iterator[None]:
    """What DALI's API-type scope does inside a call: no further API checks until it ends."""
    before, pipe._skip_api_check = pipe._skip_api_check, True
    try:
        yield
    finally:
        pipe._skip_api_check = before


_direct_run = True  # False once the pipeline's internals were not DALI 2.4's (see schedule_run)


def feed(pipe: Any, data: list[np.ndarray], params: np.ndarray,
         partners: list[list[np.ndarray] | None] | None = None) -> None:
    """Feed one planned batch to a pipeline of :func:`build_pipeline` and schedule its run
    (``partners``: see :func:`feed_inputs`; needed when the recipe has mixing transforms)."""
    feed_inputs(pipe, data, params, partners)
    schedule_run(pipe)


def feed_first_run(pipe: Any, batches: list[Any], depth: int) -> int:
    """Feed a fresh pipeline's first run and schedule it. DALI's first ``schedule_run`` runs
    ``prefetch_queue_depth`` (``depth``) batches, so when fewer are given the last is fed again as
    a filler, whose outputs the caller takes and drops. ``batches``: planned batches
    (:class:`~detaug.planned_batch.PlannedBatch`, at least one). Returns the number of fillers."""
    fillers = max(0, depth - len(batches))
    for planned in [*batches, *batches[-1:] * fillers]:
        feed_inputs(pipe, planned.data, planned.params, planned.partners)
    schedule_run(pipe)
    return fillers
