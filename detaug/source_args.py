"""Choosing a dataset from command-line arguments: the one rule of ``detaug preview`` and
``detaug shards`` (:func:`source_from_args`).

The arguments, as the two commands spell them:

* ``--voc ROOT [--split NAME] [--labels voc|discover|FILE]``: a Pascal VOC folder
  (:class:`~detaug.sources.VocSource`);
* ``--coco FILE --images DIR [--allow-paths-outside] [--masks]``: a COCO JSON and the folder its
  ``file_name`` entries are relative to (:class:`~detaug.sources.CocoSource`; ``--masks``: its
  ``masks=True``, the annotations' segmentations read too);
* ``SRC`` (``detaug shards``): a VOC folder, or a COCO JSON whose images folder is ``--images``
  (default: the JSON's folder's ``images/`` if there, else its folder).

Every user error is a :class:`~detaug.cli_support.CliError` naming its option, raised before a
dataset is read: a missing file or folder, options that do not go together, or a COCO images
folder that holds not one of its images (single missing images are the loaders' to skip and name).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from detaug.cli_support import CliError
from detaug.sources import CocoSource, Source, VocSource

__all__ = ["source_from_args"]


def source_from_args(args: argparse.Namespace, *, shuffle: bool = False) -> Source:
    """The source ``args`` names (see the module docstring), its files checked first.

    Args:
        args: the parsed arguments; read: ``src`` (``detaug shards``) or ``voc`` / ``coco``, and
            ``images``, ``split``, ``labels`` (default ``"discover"``), ``seed`` (default
            ``None``), ``allow_paths_outside`` and ``masks`` (default ``False``) where present.
        shuffle: the COCO source's ``shuffle`` (kept for the loaders, with ``args.seed``).

    Raises:
        CliError: a user error of the arguments, naming the option.
    """
    voc, coco = getattr(args, "voc", None), getattr(args, "coco", None)
    images, split = getattr(args, "images", None), getattr(args, "split", None)
    src = getattr(args, "src", None)
    if src is not None:  # detaug shards SRC: the kind is the path's
        path = Path(src)
        if path.is_dir():
            voc = src
        elif path.is_file():
            coco = src
            if not images:
                images = str(path.parent / "images" if (path.parent / "images").is_dir() else path.parent)
        else:
            raise CliError(f"SRC {path}: no such VOC folder or COCO JSON file")
    as_voc, as_coco = ("a VOC folder", "a COCO JSON") if src is not None else ("--voc", "--coco")
    if voc and coco:
        raise CliError("give either --voc ROOT or --coco FILE --images DIR, not both")
    if voc:
        _existing_folder("SRC" if src is not None else "--voc", voc)
        if images:
            raise CliError(f"--images goes with {as_coco} (a VOC folder has its images in JPEGImages/)")
        if getattr(args, "masks", False):
            raise CliError(f"--masks goes with {as_coco} (Pascal VOC annotations hold boxes, not instance masks)")
        labels = getattr(args, "labels", "discover")
        if labels not in ("voc", "discover"):
            _existing_file("--labels", labels)
        return VocSource(voc, split, labels=labels)
    if coco:
        if split:
            raise CliError(f"--split goes with {as_voc} (a COCO file is one split)")
        annotations = _existing_file("--coco", coco)
        if not images:
            raise CliError("--coco needs --images DIR (the folder its file_name entries are relative to)")
        folder = _existing_folder("--images", images)
        source = CocoSource(annotations, folder, shuffle=shuffle, seed=getattr(args, "seed", None),
                            allow_paths_outside=getattr(args, "allow_paths_outside", False),
                            masks=getattr(args, "masks", False))
        _check_images_there(source, annotations, folder)
        return source
    raise CliError("give a dataset: --voc ROOT, or --coco FILE --images DIR")


def _existing_folder(option: str, path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{option} {p}: folder not found")
    if not p.is_dir():
        raise CliError(f"{option} {p}: not a folder")
    return p


def _existing_file(option: str, path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{option} {p}: file not found")
    if p.is_dir():
        raise CliError(f"{option} {p}: is a folder, not a file")
    return p


def _check_images_there(source: Source, coco: Path, images: Path) -> None:
    """A :class:`CliError` when not one image of ``source`` is in ``images`` (the wrong folder);
    single missing images are the loader's to skip and name."""
    if any(os.path.exists(source.file_of(i)) for i in range(len(source))):
        return
    first = source.file_of(0)
    raise CliError(
        f"--images {images}: none of the {len(source)} images of {coco} is there (the first would "
        f"be {first}); give the folder their file_name entries are relative to"
    )
