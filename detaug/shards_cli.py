"""``detaug shards SRC OUT`` (and ``python -m detaug.shards``): its options, the source it reads and
the run that writes the shards with :func:`detaug.shard_writer.write_shards`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from detaug.cli_support import add_voc_options
from detaug.shard_writer import parse_size, write_shards


def add_shards_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add ``detaug shards SRC OUT`` to a subparsers object; its ``run`` default is
    :func:`run_shards`."""
    parser = subparsers.add_parser(
        "shards", parents=list(parents), help="write tar shards (WebDataset layout, DALI index files) from a dataset",
        description="Write the samples of a VOC folder or a COCO JSON into tar shards of about --shard-size bytes "
                    "(<key>.jpg + <key>.json each), with DALI index files and a manifest for ShardSource.")
    parser.add_argument("src", metavar="SRC", help="a VOC folder (Annotations/, JPEGImages/) or a COCO JSON file")
    parser.add_argument("out", metavar="OUT", help="the folder to write")
    parser.add_argument("--shard-size", default="1GB", type=_size_arg, help="bytes per tar file (default: %(default)s)")
    parser.add_argument("--images", metavar="DIR",
                        help="images folder of a COCO JSON (default: the JSON's folder's images/ if there, else its folder)")
    add_voc_options(parser)
    parser.add_argument("--prefix", default="shard", help="tar file names: PREFIX-000000.tar (default: %(default)s)")
    parser.add_argument("--no-verify", action="store_true", help="write image bytes without probing their headers")
    parser.add_argument("--allow-paths-outside", action="store_true",
                        help="accept COCO file_name entries that are absolute or leave the images folder with .. "
                             "(default: an error naming them; docs/security.md)")
    parser.add_argument("--masks", action="store_true",
                        help="a COCO JSON: also write each annotation's segmentation (polygons or RLE), read back as "
                             "the instance masks of ShardSource (docs/masks.md)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run_shards)
    return parser


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def source_of(src: str, *, images: str | None = None, split: str | None = None, labels: str = "discover",
              allow_paths_outside: bool = False, masks: bool = False) -> Any:
    """The source ``detaug shards`` reads: a VOC folder, or a COCO JSON with its images folder
    (``allow_paths_outside``, ``masks``: :class:`~detaug.sources.CocoSource`'s), chosen by
    :func:`detaug.source_args.source_from_args` (a :class:`~detaug.cli_support.CliError`
    naming the option for a user error)."""
    from detaug.source_args import source_from_args

    return source_from_args(argparse.Namespace(src=src, images=images, split=split, labels=labels,
                                               allow_paths_outside=allow_paths_outside, masks=masks))


def run_shards(args: argparse.Namespace) -> int:
    """``detaug shards``: write the shards, print the summary (stdout) and the progress (stderr).
    Exit status 0 (images skipped are named in the summary)."""
    source = source_of(args.src, images=args.images, split=args.split, labels=args.labels,
                       allow_paths_outside=getattr(args, "allow_paths_outside", False),
                       masks=getattr(args, "masks", False))
    print(source.report.summary(), file=sys.stderr)
    summary = write_shards(source, args.out, shard_size=args.shard_size, verify=not args.no_verify,
                           progress=not args.quiet, prefix=args.prefix)
    print(summary.text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m detaug.shards SRC OUT ...`` (the same as ``detaug shards``)."""
    parser = argparse.ArgumentParser(prog="detaug")
    sub = parser.add_subparsers(dest="command", required=True)
    add_shards_parser(sub)
    args = parser.parse_args(["shards", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)
