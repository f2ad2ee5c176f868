"""The model of ``detaug bench --train``: a fast one-stage dense detector, in PyTorch and in Keras.

:class:`DenseDetector` (PyTorch): a ResNet-18 trunk with random weights (torchvision's
``resnet18`` less its pooling and classifier where torchvision imports, else :class:`ResNet18Trunk`,
the same architecture written here: BasicBlocks ``[2, 2, 2, 2]``, 11,176,512 parameters either way)
and a 1x1 convolution per 32-pixel cell with ``4 + 1 + num_classes`` channels: a box, an objectness
logit and the class logits. :func:`keras_dense_detector` is the same network in Keras (channels
last, Keras' own layers) for the Keras Sequence's rows; its loss is the same function.

Loss (:func:`detection_loss`), all on the outputs' device, no host synchronisation:

1. targets padded to ``MAX_BOXES`` boxes (:func:`pad_targets`; padding has label ``-1``);
2. each real box goes to the cell containing its centre (clamped to the grid);
3. box: L1 between the cell's ``sigmoid`` box channels and the box's corners over the image size
   (``x0 / W, y0 / H, x1 / W, y1 / H``), averaged over the real boxes;
4. objectness: binary cross-entropy of every cell against 1 where a box's centre falls, else 0;
5. class: cross-entropy of the cell's class logits against the box's label modulo
   ``num_classes`` (the bench times the step; the class meaning does not matter), averaged over
   the real boxes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MAX_BOXES",
    "NUM_CLASSES",
    "RESNET18_TRUNK_PARAMS",
    "STRIDE",
    "DenseDetector",
    "ResNet18Trunk",
    "detection_loss",
    "batch_on",
    "keras_dense_detector",
    "model_loss",
    "pad_targets",
    "resnet18_trunk",
]

#: Rows of the padded targets.
MAX_BOXES = 64
#: Classes of the head (Pascal VOC's 20).
NUM_CLASSES = 20
#: Pixels per cell of the head (the trunk's output stride).
STRIDE = 32
#: Parameters of torchvision's ``resnet18`` without its ``fc`` layer: 11,689,512 (the
#: ``num_params`` of ``ResNet18_Weights`` in torchvision's ``models/resnet.py``) less
#: ``512 * 1000 + 1000``.
RESNET18_TRUNK_PARAMS = 11_689_512 - 513_000


class BasicBlock(nn.Module):
    """torchvision's ``BasicBlock``: two 3x3 convolutions with batch norm, the input added back
    (through a strided 1x1 convolution and batch norm where the shape changes)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18Trunk(nn.Sequential):
    """torchvision's ResNet-18 up to ``layer4`` (no pooling, no classifier): ``[B, 3, H, W]`` ->
    ``[B, 512, H / 32, W / 32]``, with torchvision's initialisation (Kaiming normal, fan out, for
    the convolutions; batch norm weight 1, bias 0)."""

    def __init__(self) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        inplanes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        super().__init__(*layers)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)


def resnet18_trunk(prefer_torchvision: bool = True) -> tuple[nn.Module, str]:
    """``(trunk, where)``: torchvision's ``resnet18(weights=None)`` without ``avgpool`` and ``fc``
    (``where="torchvision"``) where torchvision imports and ``prefer_torchvision``, else
    :class:`ResNet18Trunk` (``where="detaug.bench"``); the same architecture either way."""
    if prefer_torchvision:
        try:
            from torchvision.models import resnet18
        except Exception:  # noqa: BLE001 - not installed, or built for another torch
            pass
        else:
            net = resnet18(weights=None)
            return nn.Sequential(*list(net.children())[:-2]), "torchvision"
    return ResNet18Trunk(), "detaug.bench"


class DenseDetector(nn.Module):
    """ResNet-18 trunk and a 1x1 convolution head: ``[B, 3, H, W]`` float ->
    ``[B, 4 + 1 + num_classes, H / 32, W / 32]`` (box, objectness, class logits per cell).

    Attributes:
        trunk_source: ``"torchvision"`` or ``"detaug.bench"`` (:func:`resnet18_trunk`).
    """

    def __init__(self, num_classes: int = NUM_CLASSES, prefer_torchvision: bool = True) -> None:
        super().__init__()
        self.trunk, self.trunk_source = resnet18_trunk(prefer_torchvision)
        self.head = nn.Conv2d(512, 4 + 1 + num_classes, 1)
        self.num_classes = num_classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(images))


def pad_targets(
    targets: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    device: torch.device | str,
    max_boxes: int = MAX_BOXES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's targets as ``(boxes float32 [B, max_boxes, 4], labels int64 [B, max_boxes])`` on
    ``device``, labels ``-1`` where there is no box; a sample's boxes past ``max_boxes`` are cut.

    ``targets`` is either torchvision's list of ``{"boxes": [N, 4], "labels": [N], ...}`` (each
    moved as a torchvision user moves it, ``.to(device, non_blocking=True)``: nothing when it is
    there already) or the batched form ``{"boxes": [B, M, 4], "labels": [B, M] padded by -1,
    ...}`` (``DetectionLoader(targets="padded")``, the Keras Sequence's targets). The
    padding runs on ``device`` from shapes the host knows: no copy back, no synchronisation.
    """
    if isinstance(targets, Mapping):
        boxes = torch.as_tensor(targets["boxes"]).to(device, non_blocking=True)
        labels = torch.as_tensor(targets["labels"]).to(device, non_blocking=True)
    else:
        if not targets:
            raise ValueError("pad_targets: an empty batch")
        boxes = nn.utils.rnn.pad_sequence(
            [t["boxes"].to(device, non_blocking=True)[:max_boxes] for t in targets], batch_first=True)
        labels = nn.utils.rnn.pad_sequence(
            [t["labels"].to(device, non_blocking=True)[:max_boxes] for t in targets], batch_first=True,
            padding_value=-1)
    rows = boxes.shape[1]
    if rows >= max_boxes:
        boxes, labels = boxes[:, :max_boxes], labels[:, :max_boxes]
    else:
        boxes = F.pad(boxes, (0, 0, 0, max_boxes - rows))
        labels = F.pad(labels, (0, max_boxes - rows), value=-1)
    return boxes.float(), labels.long()


def batch_on(images: Any, targets: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch as the bench's step takes it, moved as a torchvision user moves it
    (``.to(device, non_blocking=True)``: nothing where it is already there): ``(images [B, 3, H, W]
    in channels last (a list of ``[3, H, W]`` stacked), boxes, labels)``, the targets padded by
    :func:`pad_targets`."""
    if isinstance(images, (list, tuple)):
        images = torch.stack([image.to(device, non_blocking=True) for image in images])
    images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
    boxes, labels = pad_targets(targets, device)
    return images, boxes, labels


def model_loss(model: nn.Module, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, *,
               autocast: bool, cache: bool = True) -> torch.Tensor:
    """:func:`detection_loss` of ``model(images)``, the forward in bf16 autocast where ``autocast``
    (``cache``: autocast's weight cache, which a CUDA-graph capture needs off)."""
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=autocast, cache_enabled=cache):
        outputs = model(images)
    return detection_loss(outputs, boxes, labels)


def detection_loss(outputs: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, *,
                   stride: int = STRIDE, channels_last: bool = False) -> torch.Tensor:
    """The loss of the module docstring, a float32 scalar on the outputs' device.

    Args:
        outputs: ``[B, 5 + C, Gh, Gw]`` (``[B, Gh, Gw, 5 + C]`` with ``channels_last``), any float.
        boxes: float32 ``[B, M, 4]`` xyxy input-image pixels (:func:`pad_targets`).
        labels: int64 ``[B, M]``, ``-1`` for padding.
        stride: input pixels per cell: the image is ``Gh * stride`` x ``Gw * stride``.
    """
    if channels_last:
        b, gh, gw, ch = outputs.shape
        cells = outputs.float().reshape(b, gh * gw, ch)
    else:
        b, ch, gh, gw = outputs.shape
        cells = outputs.float().flatten(2).transpose(1, 2)  # [B, G, 5 + C]
    num_classes = ch - 5
    height, width = float(gh * stride), float(gw * stride)
    weight = (labels >= 0).float()  # [B, M]
    count = weight.sum().clamp(min=1.0)
    centre = (boxes[..., :2] + boxes[..., 2:]) * 0.5
    col = (centre[..., 0] / stride).floor().clamp(0, gw - 1).long()
    row = (centre[..., 1] / stride).floor().clamp(0, gh - 1).long()
    cell = row * gw + col  # [B, M]
    picked = cells.gather(1, cell.unsqueeze(-1).expand(-1, -1, ch))  # [B, M, 5 + C]
    scale = torch.stack((boxes[..., 0] / width, boxes[..., 1] / height, boxes[..., 2] / width,
                         boxes[..., 3] / height), dim=-1)
    box_loss = ((picked[..., :4].sigmoid() - scale).abs().sum(-1) * weight).sum() / count
    objectness = torch.zeros_like(cells[..., 4]).scatter_reduce(1, cell, weight, reduce="amax")
    obj_loss = F.binary_cross_entropy_with_logits(cells[..., 4], objectness)
    classes = labels.clamp(min=0).remainder(num_classes)
    cls_loss = (F.cross_entropy(picked[..., 5:].reshape(-1, num_classes), classes.reshape(-1), reduction="none")
                * weight.reshape(-1)).sum() / count
    return box_loss + obj_loss + cls_loss


def keras_dense_detector(size: int, num_classes: int = NUM_CLASSES, *, dtype: str | None = None) -> Any:
    """:class:`DenseDetector` in Keras 3 (channels last; its backend must be torch): the
    ResNet-18 trunk in Keras layers (the same convolutions, batch norms and shapes) and the 1x1
    head, as a ``keras.Model`` whose ``compute_loss`` is :func:`detection_loss` of its targets
    (``{"boxes": [B, M, 4], "labels": [B, M]}``, padded by -1, as the Keras Sequence yields them).
    ``dtype``: a Keras dtype policy (``"mixed_bfloat16"`` on CUDA)."""
    import keras
    from keras import layers

    def conv(x, filters, kernel, stride=1, name=""):
        return layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False,
                             kernel_initializer="he_normal", dtype=dtype, name=name)(x)

    def bn(x, name):
        return layers.BatchNormalization(epsilon=1e-5, momentum=0.9, dtype=dtype, name=name)(x)

    def block(x, filters, stride, name):
        shortcut = x
        if stride != 1 or x.shape[-1] != filters:
            shortcut = bn(conv(x, filters, 1, stride, f"{name}_down"), f"{name}_down_bn")
        y = layers.ReLU(dtype=dtype)(bn(conv(x, filters, 3, stride, f"{name}_conv1"), f"{name}_bn1"))
        y = bn(conv(y, filters, 3, 1, f"{name}_conv2"), f"{name}_bn2")
        return layers.ReLU(dtype=dtype)(layers.Add(dtype=dtype)([y, shortcut]))

    inputs = keras.Input((size, size, 3), name="images")
    x = layers.ReLU(dtype=dtype)(bn(conv(inputs, 64, 7, 2, "conv1"), "bn1"))
    x = layers.MaxPooling2D(3, strides=2, padding="same", dtype=dtype)(x)
    for k, (filters, stride) in enumerate(((64, 1), (128, 2), (256, 2), (512, 2)), start=1):
        x = block(x, filters, stride, f"layer{k}_0")
        x = block(x, filters, 1, f"layer{k}_1")
    outputs = layers.Conv2D(4 + 1 + num_classes, 1, dtype=dtype, name="head")(x)

    class KerasDenseDetector(keras.Model):
        """The functional model with :func:`detection_loss` as its loss (torch backend)."""

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            boxes, labels = pad_targets(y, y_pred.device)
            return detection_loss(y_pred, boxes, labels, channels_last=True)

    return KerasDenseDetector(inputs, outputs, name="dense_detector")
