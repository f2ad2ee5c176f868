"""Samples made of several images: ``Mosaic`` (YOLO's 2x2 or 3x3 tiles), ``MixUp`` (two images
blended), ``CutMix`` (a partner's rectangle pasted in) and ``CopyPaste`` (a partner's objects
pasted in by their masks).

This module holds what they share: the kind's base classes (:class:`MixingTransform`,
:class:`BlendTransform`) and its rules below. The transforms are in :mod:`detaug.transforms.mosaic`,
:mod:`detaug.transforms.blend` (``MixUp``, ``CutMix``) and :mod:`detaug.transforms.copypaste`.

Kind ``"mixing"``: a mixing transform names how many *partner* images a sample needs
(``partners``) and places each on the sample's canvas with an axis-aligned matrix (scale and
translation) and a visible rectangle. It takes part in a plan through the methods of
:class:`MixingTransform`, as a warp does through ``plan``: its ``stage`` says where (``"canvas"``:
it composes the sample's first canvas, ``Mosaic``; ``"blend"``: it blends a partner into the
current canvas between warp segments, ``MixUp``, ``CutMix``), and it declares its plan fields
(:mod:`detaug.plan_layout`), plans them (:mod:`detaug.batch_plan` calls it) and adds its DALI
operators (:mod:`detaug.pipeline` calls it). Nothing about them is written anywhere else: the
recipe, the planner and the pipeline name none of these classes.

**Partners (the rule).** The partners of a sample are dataset positions drawn from the sample's
own random stream (:class:`detaug.seeds.SampleRandom` keyed by ``(seed, epoch, image_id)``):
the stream's first positions, one per partner, each uniform over ``range(len(source))`` (all
the dataset's positions, whatever the shard or the epoch order), then the blend's
(``MixUp``'s or ``CutMix``'s) apply-or-not draw. A partner whose image cannot be read or decoded is replaced by the next
position (``p + 1``, cyclically), named and counted as a skipped image. So a sample's partners,
like its parameters, depend on nothing but its key and the dataset: the same for any batch,
batch size, order, shard, worker count, random access (Keras ``seq[i]``) or device. A partner
may be the sample itself, or appear twice (as in ultralytics, which draws with replacement).

**Partners from the batch (``pool="batch"``, opt-in).** The rule above decodes every partner
image: a YOLO sample costs 4 decodes (4.1 with ``MixUp(p=0.1)``), so its output rate is about a
quarter of the decode limit. With ``pool="batch"`` a slot's partner is instead another sample of
the same batch (drawn from the same stream position, uniform over the batch's positions
``0 .. B - 1``, the sample itself included), and the pipeline decodes each image of the batch
once, in full, and reuses it for the tiles and the blend of its batch-mates (DALI's
``permute_batch``): one decode per sample, as ultralytics reuses the images of its buffer of
recently loaded ones. The price is the seed contract's independence from the batch: a sample's
partners then depend on its batch-mates, which are a pure function of ``(seed, epoch, rank,
batch index)`` (so epochs, resume, DDP ranks and a Keras ``seq[i]`` stay exact and repeatable),
but not of ``(seed, epoch, image_id)`` alone: another batch size, another shard layout or an
eager one-sample call (where the sample is its own partner) gives other partners. A skipped
image is replaced in the batch (by the sample rule) before partners are drawn, so partners are
always images that decoded. ``pool`` is set per transform; ``Mosaic`` and ``MixUp`` may differ.

Restrictions (checked by ``Compose``, :class:`~detaug.errors.RecipeError` otherwise):
``Mosaic`` is the first transform of its recipe (its tiles are whole source images, as in
YOLO); ``MixUp``, ``CutMix`` and ``CopyPaste`` follow transforms that fix the canvas size (``Mosaic``,
``Resize((h, w))``, ``LetterBox``, ``RandomResizedCrop``...); at most one ``Mosaic`` and one
blend (``MixUp``, ``CutMix`` or ``CopyPaste``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import numpy as np

from detaug.plan import PlanState
from detaug.plan_layout import PlanFieldSpec
from detaug.seeds import SampleRandom
from detaug.transforms.base import Param, Transform

__all__ = ["POOLS", "MixingTransform", "BlendTransform"]

_FILL = Param("fill", "number", 114, "grey level (0-255) where no image is", low=0, high=255)
#: where partner images come from (the module docstring): "dataset" (the seed contract's rule) or "batch"
POOLS = ("dataset", "batch")
_POOL = Param("pool", "choice", "dataset", "where partners come from: 'dataset' (drawn over the dataset by the "
              "sample's key, each decoded) or 'batch' (other samples of the batch, decoded once; see "
              "docs/mixing.md)", choices=POOLS)


class MixingTransform(Transform):
    """A transform whose samples are made of several source images (see the module docstring).

    Its partner images fill *slots* of the sample (``slots``: their indices among the recipe's
    partner slots, ``Compose.mixing_slots``). A ``"canvas"`` stage implements
    :meth:`plan_canvas`, :meth:`canvas_values` and :meth:`dali_canvas`; a ``"blend"`` stage
    :meth:`plan_blend` and :meth:`dali_blend`. The DALI methods receive ``graph``, the
    pipeline's parts (:class:`detaug.pipeline.GraphParts`: ``value(field)``, ``decode(data,
    roi_field)``, ``warp(images, matrix_field, size_field, fill)``, ``partner(slot, own,
    roi_field)``, ``data``, ``on_gpu``).
    """

    kind: ClassVar[str] = "mixing"
    #: partner images per sample (besides the sample's own)
    partners: ClassVar[int] = 0
    #: ``"canvas"`` (composes the sample's first canvas from its images, in place of decoding
    #: the sample's image) or ``"blend"`` (blends its partners into the current canvas)
    stage: ClassVar[str] = ""
    #: its DALI operators run under a DALI conditional (``if`` on a DataNode)
    conditional: ClassVar[bool] = False
    #: it pastes objects by their masks: the recipe needs masks, and the planner updates the
    #: targets on the host (:meth:`paste_targets`) once the masks are moved
    pastes_masks: ClassVar[bool] = False

    def misplaced(self, index: int, before: Sequence[Transform], fixed: bool) -> str | None:
        """What is wrong with this transform at ``index`` of its recipe, after the transforms
        ``before`` (``fixed``: they fix the canvas size); ``None`` where it can be planned."""
        return None

    def draw_needed(self, rand: SampleRandom) -> np.ndarray:
        """bool ``[B, partners]``: which partners a sample needs, drawn (the same way for every
        sample) in the partner block after the partner positions (:func:`detaug.batch_plan.partner_block`).
        The default draws nothing: all of them."""
        return np.ones((rand.batch_size, self.partners), dtype=bool)

    def plan_fields(self) -> list[PlanFieldSpec]:
        """Its fields in the recipe's plan layout (:mod:`detaug.plan_layout`), in order."""
        return []

    def plan_canvas(self, state: PlanState, image_hw: np.ndarray, layers: np.ndarray,
                    apply: np.ndarray | None = None) -> Any:
        """Canvas stage: place the sample's image and its partners (``image_hw`` float64
        ``[B, 1 + partners, 2]``, layers ``[B, 1 + partners]`` of ``state``) on a new canvas
        (``state.start_canvas``, ``state.place_layers``); returns what :meth:`canvas_values` needs.
        ``apply`` (bool ``[B]``, :meth:`draw_needed`; ``None``: all): the samples it composes;
        the others' canvas shows their own image alone."""
        raise NotImplementedError

    def canvas_values(self, placed: Any, first: tuple[np.ndarray, np.ndarray] | None,
                      whole: Sequence[bool]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Canvas stage: ``(its plan field values, origin [B, 2])``: what to decode and where to
        put it, for a first warp ``first`` (``(matrix [B, 3, 3], canvas_hw [B, 2])`` reading the
        canvas; ``None``: the whole canvas is the stage's output); ``whole[k]``: image ``k`` is
        decoded whole (shared by the batch). The composed part starts at ``origin`` (x, y) of
        the canvas: the first warp reads from there."""
        raise NotImplementedError

    def dali_canvas(self, graph: Any, slots: Sequence[int]) -> tuple[Any, Any]:
        """Canvas stage: ``(canvas images, the sample's own decoded image)`` in the DALI graph."""
        raise NotImplementedError

    def plan_blend(self, state: PlanState, apply: np.ndarray, partner_hw: np.ndarray, layers: np.ndarray,
                   whole: bool) -> dict[str, np.ndarray]:
        """Blend stage: place the partner (``partner_hw`` ``[B, 2]``, layers ``[B]`` of ``state``)
        on the current canvas for the samples of ``apply`` (``[B]`` bool, :meth:`draw_needed`);
        its plan field values (``whole``: the partner is decoded whole)."""
        raise NotImplementedError

    def dali_blend(self, graph: Any, images: Any, own: Any, slots: Sequence[int]) -> Any:
        """Blend stage: ``images`` with the partner blended in, in the DALI graph."""
        raise NotImplementedError


class BlendTransform(MixingTransform):
    """A ``"blend"`` stage with one partner a sample, run under a DALI conditional (on the samples
    it applies to only): the canvas keeps its size; it must follow a fixed canvas
    (:func:`_blend_misplaced`). ``MixUp``, ``CutMix`` and ``CopyPaste``."""

    partners = 1
    stage = "blend"
    conditional = True

    def out_size(self, in_size: tuple[int, int] | None) -> tuple[int, int] | None:
        return in_size

    def misplaced(self, index: int, before: Sequence[Transform], fixed: bool) -> str | None:
        return _blend_misplaced(before, fixed)


def _blend_misplaced(before: Sequence[Transform], fixed: bool) -> str | None:
    """What keeps a blend stage (``MixUp``, ``CutMix``) from being planned after ``before``."""
    if any(getattr(u, "stage", None) == "blend" for u in before):
        return "a recipe may blend only once (one MixUp, CutMix or CopyPaste)"
    if not fixed:
        return ("needs a fixed canvas size before it: put Mosaic, Resize((h, w)), LetterBox "
                "or another transform with a fixed output size earlier")
    return None
