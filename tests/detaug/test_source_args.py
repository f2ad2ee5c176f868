"""source_from_args: the one rule that chooses a dataset for ``detaug preview`` (--voc/--coco)
and ``detaug shards`` (SRC), each user error a CliError naming its option."""

from __future__ import annotations

import argparse
import warnings

import pytest

from detaug import DataWarning
from detaug.cli_support import CliError
from detaug.shards import source_of
from detaug.source_args import source_from_args
from detaug.sources import CocoSource, VocSource
from detaug.synthetic import write_coco_dataset, write_voc_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("args")
    write_coco_dataset(root / "coco", num_images=3, size=(48, 40), max_objects=2, progress=False)
    write_voc_dataset(root / "voc", num_images=3, size=(48, 40), max_objects=2)
    return root


def choose(**given):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        return source_from_args(argparse.Namespace(**given))


def test_both_spellings_give_the_same_sources(data):
    json, images = str(data / "coco" / "annotations.json"), str(data / "coco" / "images")
    flags = choose(coco=json, images=images, seed=3)
    shards = source_of(json)  # SRC: the images folder beside the JSON by default
    assert isinstance(flags, CocoSource) and isinstance(shards, CocoSource) and flags.seed == 3
    assert [s.image for s in flags.samples] == [s.image for s in shards.samples]
    voc = choose(voc=str(data / "voc"))
    assert isinstance(voc, VocSource) and [s.image for s in voc.samples] == [s.image for s in source_of(str(data / "voc")).samples]


@pytest.mark.parametrize("given, message", [
    ({"src": "{root}/nope"}, "SRC {root}/nope: no such VOC folder or COCO JSON file"),
    ({"src": "{root}/voc", "images": "{root}/coco/images"}, "--images goes with a COCO JSON"),
    ({"src": "{root}/coco/annotations.json", "split": "train"}, "--split goes with a VOC folder"),
    ({"src": "{root}/coco/annotations.json", "images": "{root}/voc"}, "--images {root}/voc: none of the 3 images"),
    ({"voc": "{root}/voc", "images": "{root}/coco/images"}, "--images goes with --coco"),
    ({"src": "{root}/voc", "masks": True}, "--masks goes with a COCO JSON"),
    ({"voc": "{root}/voc", "masks": True}, "--masks goes with --coco"),
    ({"voc": "{root}/voc", "labels": "{root}/labels.txt"}, "--labels {root}/labels.txt: file not found"),
    ({"coco": "{root}/coco/annotations.json"}, "--coco needs --images DIR"),
    ({}, "give a dataset: --voc ROOT, or --coco FILE --images DIR"),
])
def test_user_errors_name_their_option(data, given, message):
    with pytest.raises(CliError) as info:
        choose(**{k: v.format(root=data) if isinstance(v, str) else v for k, v in given.items()})
    assert str(info.value).startswith(message.format(root=data))


def test_masks_reads_the_segmentations(data):
    """``--masks`` (``detaug shards SRC --masks``): the COCO source's ``masks=True``; without it no
    masks field."""
    from detaug.masks import MASKS, CocoMasks

    json = str(data / "coco" / "annotations.json")
    with_masks, without = source_of(json, masks=True), source_of(json)
    assert all(isinstance(s.fields[MASKS], CocoMasks) and len(s.fields[MASKS]) == len(s.boxes)
               for s in with_masks.samples)
    assert all(MASKS not in s.fields for s in without.samples)
