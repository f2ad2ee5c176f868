"""``voc2coco``: the command line of :mod:`converters.voc2coco`.

Exit status: 0 done; 1 a split converted no image, or none of its objects (nothing written;
``--allow-empty`` writes it), or ``--strict`` and something was skipped (nothing written); 2 bad arguments,
a dataset that cannot be converted at all, or an output that cannot be written (disk full,
permission: the message names the path); 130 interrupted by Ctrl-C (nothing half-written). A
SIGTERM while writing removes the temporary file, then ends the process by SIGTERM.

Every error is one line, ``voc2coco: error: ...``, naming the file, folder or option at fault;
``--debug`` adds the traceback (an unexpected error: exit status 1).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from converters.boxes import COORDS
from converters.coco import _package_version
from converters.report import Report
from converters.voc2coco import (
    DIFFICULT_MODES,
    ORIENTATIONS,
    ConversionError,
    write_splits,
)

DESCRIPTION = """\
Convert a Pascal VOC dataset (VOCdevkit layout: Annotations/, JPEGImages/, ImageSets/Main/) into
COCO detection JSON, one file per split, or one for every XML (--all, the default)."""

EPILOG = """\
conventions:
  ids          image, annotation and category ids start at 1 (an annotation id 0 breaks
               COCOeval); images in split-file order (--all: sorted ids), categories in
               label order.
  coordinates  COCO bbox is [x, y, w, h] in continuous pixels (pixel i spans [i, i+1)).
               --coords voc (default): VOC values are 1-based inclusive pixel indices:
                 x = xmin - 1, y = ymin - 1, w = xmax - xmin + 1, h = ymax - ymin + 1
                 (a single-point box xmin == xmax is 1 pixel wide).
               --coords raw: values are continuous corners (CVAT, pylabel exports):
                 x = xmin, y = ymin, w = xmax - xmin, h = ymax - ymin.
               Boxes are clipped to the image (reported); boxes of zero size, or with
               nothing left inside the image, are skipped (counted).
  images       an image is identified by its VOC id, the XML file's stem: the file is
               JPEGImages/<id>.<jpg|jpeg|png|...> (any case), else the XML's <filename>.
               A <filename> that disagrees is reported, never used to merge images.
               The size comes from the image header when the image exists (a missing or
               wrong <size> is reported), else from <size>. Without an images folder the
               conversion is annotation-only (file_name = <id> + extension of <filename>).
               --verify-images skips what the loader skips (empty, truncated JPEG/PNG,
               GIF and other formats DALI does not decode, width*height >= 30000*30000);
               without it, those whose header gives a size are kept, with a warning.
  orientation  EXIF orientation: --orientation auto (default): boxes are in the frame
               <size> names, stored pixels or displayed (rotated) image; undecidable
               (square, no <size>, neither): stored. apply: displayed; ignore: stored.
               width/height are that frame's; "exif_orientation": k is added.
  categories   --labels voc: the 20 VOC classes in the devkit's order; FILE: one name a
               line (CVAT/Datumaro labelmap.txt understood); discover (default): every
               name in Annotations/, sorted. Objects with other names are skipped.
  difficult    keep (default): kept, attributes.difficult = 1; crowd: also iscrowd = 1
               (COCOeval ignores them); drop: skipped (counted). truncated, occluded and
               pose are kept in attributes; <part> elements are not objects.
  output       streamed as converted (memory does not grow with the records) and
               written atomically (temp file .<name>.tmp-<pid>-<hex> + rename; removed on
               errors, Ctrl-C and SIGTERM; one left by a killed run is removed by the
               next), same input -> same bytes. -o FILE.json for one output, else a
               folder: <split>.json, all.json.

examples:
  voc2coco VOCdevkit/VOC2007 --split trainval --split test -o coco/ --labels voc
  voc2coco my_dataset -o my_dataset.json --verify-images --strict
  voc2coco --annotations labels/ --images photos/ -o out.json --coords raw

exit status: 0 done, 1 a split converted no image or none of its objects (nothing
             written; --allow-empty writes it) or --strict and something was skipped
             (nothing written), 2 bad arguments or dataset, or output not writable,
             130 interrupted.
"""


class _OneLineParser(argparse.ArgumentParser):
    """Errors in one line (``voc2coco: error: MESSAGE (see voc2coco --help)``, exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to render ``--help`` in the docs)."""
    parser = _OneLineParser(
        prog="voc2coco", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("voc_root", nargs="?", metavar="VOC_ROOT",
                        help="folder with Annotations/, JPEGImages/, ImageSets/Main/")
    parser.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="output file (ends in .json; one split or --all) or folder")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--split", action="append", metavar="NAME",
                       help="split to convert, from ImageSets/Main/NAME.txt (or a list file); "
                            "repeat for several")
    which.add_argument("--all", action="store_true",
                       help="one output for every XML in Annotations/ (the default)")
    parser.add_argument("--annotations", metavar="DIR", help="annotations folder "
                        "(default VOC_ROOT/Annotations)")
    parser.add_argument("--images", metavar="DIR", help="images folder "
                        "(default VOC_ROOT/JPEGImages)")
    parser.add_argument("--labels", default="discover", metavar="voc|discover|FILE",
                        help="category list (default: discover)")
    parser.add_argument("--coords", choices=COORDS, default="voc",
                        help="how to read <bndbox> values (default: voc)")
    parser.add_argument("--difficult", choices=DIFFICULT_MODES, default="keep",
                        help="what to do with difficult objects (default: keep)")
    parser.add_argument("--verify-images", action="store_true",
                        help="skip (and report) the images the loader would skip (header and "
                             "end-marker checks)")
    parser.add_argument("--orientation", choices=ORIENTATIONS, default="auto",
                        help="frame of the boxes of EXIF-oriented images (default: auto)")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1, writing nothing, if anything is skipped")
    parser.add_argument("--allow-empty", action="store_true",
                        help="write a split that converted no image or none of its objects "
                             "(default: exit with status 1, writing nothing)")
    parser.add_argument("--workers", type=_positive_int, metavar="N",
                        help="processes parsing XMLs (default: one per available core from "
                             "2000 files on; the output is the same for any N)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (default: a bar with ETA on stderr when it is a "
                             "terminal and there are 1000 files or more)")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true",
                           help="print nothing but errors")
    verbosity.add_argument("-v", "--verbose", action="store_true",
                           help="list every message (default: 5 per reason)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--version", action="version",
                        version=f"voc2coco (detaug {_package_version()})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except Exception as err:  # noqa: BLE001 - not a known user error: one line, --debug for more
        if args.debug:
            traceback.print_exc()
        first = (str(err).splitlines() or [""])[0]
        print(f"voc2coco: error: {type(err).__name__}: {first}"
              + ("" if args.debug else " (--debug shows the traceback)"), file=sys.stderr)
        return 1


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.voc_root is None and args.annotations is None:
        parser.error("give VOC_ROOT or --annotations DIR")
    splits: list[str | None] = list(args.split) if args.split else [None]
    try:
        targets = _output_paths(Path(args.output), splits)
    except ValueError as err:
        parser.error(str(err))
    progress = False if (args.quiet or args.no_progress) else None
    counts = {"images": 0, "objects": 0}
    empty: list[str] = []
    committing: list[Path] = []

    def before_commit(reports: dict[str | None, Report]) -> bool:
        """Print the reports; with --strict, say no when something was skipped."""
        for split, report in reports.items():
            counts["images"] += sum(report.images_skipped.values())
            counts["objects"] += sum(report.objects_skipped.values())
            if not args.quiet:
                details = report.details(None if args.verbose else 5)
                if details:
                    print(details, file=sys.stderr)
                title = "all XML files" if split is None else f"split {split}"
                print(f"== {title}\n{report.summary()}", file=sys.stderr)
            why = _converted_nothing(report)
            if why and not args.allow_empty:
                empty.append(f"{'all XML files' if split is None else f'split {split}'} {why}")
        return not (empty or (args.strict and (counts["images"] or counts["objects"])))

    def on_commit(split: str | None, path: Path) -> None:
        if committing and not args.quiet:
            print(f"wrote {committing[-1]}", file=sys.stderr)
        committing.append(path)

    try:
        write_splits(args.voc_root, targets, annotations_dir=args.annotations,
                     images_dir=args.images, labels=args.labels, coords=args.coords,
                     difficult=args.difficult, verify_images=args.verify_images,
                     orientation=args.orientation, workers=args.workers, progress=progress,
                     before_commit=before_commit, on_commit=on_commit,
                     on_stale=None if args.quiet else lambda stale: print(
                         f"voc2coco: removed {stale}, left by a killed run", file=sys.stderr))
    except ConversionError as err:
        if args.debug:
            traceback.print_exc()
        print(f"voc2coco: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if args.debug:
            traceback.print_exc()
        output = err.filename is not None and Path(str(err.filename)) in targets.values()
        if output:  # an output that cannot be written (disk full, permission)
            print(f"voc2coco: error: cannot write {err.filename}: {err.strerror or err}",
                  file=sys.stderr)
        else:  # an input that cannot be read (a folder that cannot be listed, say)
            print(f"voc2coco: error: {_os_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if committing:
            print(f"voc2coco: interrupted while writing {committing[-1]}; it and the files not "
                  "yet written were left as they were", file=sys.stderr)
        else:
            print("voc2coco: interrupted; nothing written", file=sys.stderr)
        return 130
    if args.strict and (counts["images"] or counts["objects"]):
        what = [f"{n} skipped {kind[:-1]}{'s' if n != 1 else ''}"
                for kind, n in counts.items() if n]
        print(f"voc2coco: --strict: {' and '.join(what)}; nothing written", file=sys.stderr)
        return 1
    if empty:
        print(f"voc2coco: error: {'; '.join(empty)}; nothing written (--allow-empty writes it)",
              file=sys.stderr)
        return 1
    if committing and not args.quiet:
        print(f"wrote {committing[-1]}", file=sys.stderr)
    return 0


def _converted_nothing(report: Report) -> str:
    """Why a split's output would hold nothing to train on (``"converted no image (0 of 33:
    31 image file not found, 2 empty file)"``), or ``""``: no image converted, or none of its
    objects (a split whose XMLs hold no object at all is not empty)."""
    if report.images_converted == 0:
        total, skipped = report.images_total, report.images_skipped
        what = "image"
    elif report.objects_total and not report.objects_converted:
        total, skipped = report.objects_total, report.objects_skipped
        what = "object"
    else:
        return ""
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(
        skipped.items(), key=lambda item: (-item[1], item[0])))
    return f"converted no {what} (0 of {total}{': ' + reasons if reasons else ''})"


def _os_error(err: OSError) -> str:
    """``path: reason`` in one line."""
    where = f"{err.filename}: " if err.filename is not None else ""
    return f"{where}{err.strerror or err}"


def _output_paths(output: Path, splits: list[str | None]) -> dict[str | None, Path]:
    """``-o x.json``: that file (one output only); otherwise a folder of ``<split>.json``."""
    if output.suffix.lower() == ".json" and not output.is_dir():
        if len(splits) > 1:
            raise ValueError(f"-o {output}: one file cannot hold {len(splits)} splits; "
                             "give a folder")
        return {splits[0]: output}
    names = {split: (Path(split).stem if split is not None else "all") for split in splits}
    if len(set(names.values())) != len(names):
        raise ValueError(f"splits {splits} would write the same file name")
    return {split: output / f"{name}.json" for split, name in names.items()}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
