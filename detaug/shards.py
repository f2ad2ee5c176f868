"""Tar shards (WebDataset layout) and :class:`ShardSource`, the source that reads them.

Layout of a shard folder written by :func:`write_shards` (``detaug shards SRC OUT``)::

    OUT/shard-000000.tar     <key>.jpg (the encoded image as it was) + <key>.json, ... (~1 GB each)
    OUT/shard-000000.idx     DALI's webdataset index of that tar (``wds2idx`` format v1.2)
    OUT/dataset.json         categories, orientation, counts, the files skipped when writing
    OUT/manifest/            the columns of every sample (a cache of the JSONs, see below)

``<key>`` is the sample's position in the folder, zero-padded (``000000042``). ``<key>.json`` is
the truth about the sample: ``{"image_id": int, "boxes": [[x1, y1, x2, y2], ...] absolute xyxy
in continuous pixels (pixel i spans [i, i + 1)), "labels": [category id, ...], "size": [height,
width] or null, "file": the file it was written from, "fields": {name: [value per box, ...]}
(the source's per-box fields, such as ``iscrowd``, ``difficult`` or a track id; absent without
any), "masks": [COCO segmentation per box, ...] (a source with instance masks only; uint8 masks
written as compressed RLE: :func:`~detaug.shard_manifest.mask_segmentations`)}``. The tars are
plain POSIX tars that ``tar``, the ``webdataset`` library and DALI's
``fn.readers.webdataset`` (with the ``.idx`` files: no scan at start-up) read.

``manifest/`` holds the same facts as columns (:mod:`detaug.formats.columnar`: image ids,
declared sizes, box offsets, boxes, labels, the per-box fields as ``field_<k>`` in the order of
``dataset.json``'s ``"fields"`` ``[[name, dtype, shape], ...]``, the masks' segmentations as the
number columns of :class:`~detaug.formats.mask_columns.MaskColumns`, and where each image's bytes
are in its tar), opened memory-mapped: a :class:`ShardSource` starts in the same time, and with
the same memory, for 1k or 10M samples, and holds no Python object per sample. It is rebuilt
from the tars and index files when missing (:func:`rebuild_manifest`).

Why detaug reads the tars by offset rather than through ``fn.readers.webdataset``: detaug plans
every sample's augmentation on the host before DALI decodes it (the boxes decide the crop), and
the Keras ``Sequence`` reads any batch in any order; a reader that streams the tars gives
neither. Reading ``(offset, size)`` from the index keeps random access, the skip rules of bad
images and the exact epochs of :mod:`detaug.epochs`.

Shuffling (:func:`shard_shuffled_order`): epoch ``e`` permutes the tar files, then the samples
within each tar, all drawn from :func:`detaug.seeds.order_generator` ``(seed, e)``; the ranks
then take their share of that one order by the rules of :mod:`detaug.epochs` (equal ranks, every
sample once per epoch). Neighbouring samples of an epoch come from the same tar, which keeps a
rank's reads local.

Modules: this one holds :class:`ShardSource`; :mod:`detaug.shard_writer` writes a shard folder,
:mod:`detaug.shard_manifest` reads the index files and saves or rebuilds ``manifest/``, and
:mod:`detaug.shards_cli` is ``detaug shards``. Their public names are importable from here too.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detaug.errors import DatasetError, DataWarning
from detaug.formats.coco import read_json
from detaug.formats.column_store import SampleTable, SampleView, load_columns
from detaug.formats.mask_columns import MaskColumns
from detaug.formats.report import Report
from detaug.formats.validation import check_columns
from detaug.masks import MASKS, CocoMasks
from detaug.keypoints import KEYPOINTS, check_keypoints
from detaug.rotated import ROTATED_BOXES, check_rotated_boxes
from detaug.shard_manifest import (
    MANIFEST_VERSION, _check_names, _specs_of, read_index, rebuild_manifest, save_manifest,
)
from detaug.shard_writer import INDEX_VERSION, ShardSummary, parse_size, write_shards
from detaug.shards_cli import add_shards_parser, main, run_shards, source_of
from detaug.sources import CheckedSamples, FieldSpec, SampleListSource, check_orientation

__all__ = [
    "INDEX_VERSION", "ShardSource", "ShardSummary", "add_shards_parser", "parse_size", "read_index",
    "rebuild_manifest", "run_shards", "shard_shuffled_order", "write_shards",
]


# -- shuffling -------------------------------------------------------------------------------------

def shard_shuffled_order(sizes: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s order of tar-grouped samples: :func:`detaug.epochs.grouped_order`."""
    from detaug.epochs import grouped_order

    return grouped_order(sizes, seed, epoch)


# -- the source ------------------------------------------------------------------------------------

class _TarMember:
    """``image_of`` of a shard view: ``"<folder>/<tar>:<key>.<ext>"`` (picklable)."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source

    def __call__(self, row: int) -> str:
        return self.source.member_of(row)


class _ShardFields:
    """``fields_of`` of a shard view: the per-box fields' rows of a sample (picklable)."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source

    def __call__(self, start: int, end: int, boxes: np.ndarray) -> dict[str, Any]:
        src = self.source
        fields: dict[str, Any] = {name: np.array(column[start:end]) for name, column in src.field_columns.items()}
        if src.segments is not None:  # instance masks: undecoded (decoded when the image is read)
            rows = range(start, end) if src.segment_rows is None else src.segment_rows[start:end]
            fields[MASKS] = CocoMasks([src.segments.segmentation(int(j)) for j in rows])
        return fields


class ShardSource(SampleListSource):
    """The samples of a shard folder written by :func:`write_shards` (``detaug shards``), read
    by offset from the tar files (the module docstring says why).

    Every rule of the other sources holds: ``source.samples[i]`` is the ``i``-th sample of the
    folder (a :class:`~detaug.sources.Sample` built on demand; its ``image`` names the tar
    member, ``"OUT/shard-000003.tar:000012345.jpg"``; its ``fields`` the per-box fields the
    folder was written with, :attr:`field_specs`), ``load(i)`` gives its bytes as written, an
    image that cannot be decoded is named and skipped by the loaders, and ``DetectionLoader`` /
    ``DetectionSequence`` give exact epochs, equal ranks and resumable states. Start-up opens
    ``manifest/`` memory-mapped (no scan of the tars; the same time for any number of samples);
    a process keeps resident only the pages of the samples it reads.

    Args:
        root: the folder (``dataset.json``, ``manifest/``, ``*.tar``, ``*.idx``); a missing
            manifest is rebuilt (:func:`rebuild_manifest`).
        shuffle, seed, shard_id, num_shards: as :class:`~detaug.sources.CocoSource`'s, kept for
            the loaders. With shuffle, epochs permute whole tars, then samples within each
            (:func:`shard_shuffled_order`), where the loaders take the source's order (see
            :meth:`epoch_order`).
        orientation: the frame of the boxes of EXIF-rotated images; ``None``: the one the
            folder was written with.
        allow_paths_outside: accept tar and index files that ``manifest/meta.json`` or
            ``dataset.json`` name by an absolute path or one leaving the folder with ``..``
            (default: a :class:`~detaug.errors.DatasetError`; docs/security.md).

    The manifest is untrusted input and passes the checks of every source
    (:func:`detaug.formats.validation.check_columns`, vectorised): unique image ids, valid
    sizes, labels among the categories, finite boxes (errors); empty boxes and boxes outside
    the declared image dropped, boxes partly outside clipped (repairs, counted in ``report``
    and said with one :class:`~detaug.errors.DataWarning`; the repaired columns are then held
    in memory). Each image's bytes must lie inside its tar.

    Raises:
        FileNotFoundError: the folder, or one of its tar files, is missing.
        DatasetError: a tar file shorter than the manifest says (truncated), a manifest of
            another version, a path outside the folder, or a manifest that fails the checks
            (the message names the folder, the tar member and the image id).
    """

    def __init__(self, root: str | os.PathLike, *, shuffle: bool = False, seed: int | None = None,
                 shard_id: int | None = None, num_shards: int | None = None, orientation: str | None = None,
                 allow_paths_outside: bool = False) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.root}: shard folder not found")
        self.shuffle, self.seed, self.shard_id, self.num_shards = shuffle, seed, shard_id, num_shards
        self.allow_paths_outside = allow_paths_outside
        self._options = {"shuffle": shuffle, "seed": seed, "shard_id": shard_id, "num_shards": num_shards,
                         "orientation": orientation, "allow_paths_outside": allow_paths_outside}
        if not (self.root / "manifest" / "meta.json").is_file():
            rebuild_manifest(self.root, allow_paths_outside=allow_paths_outside)
        manifest = self.root / "manifest"
        try:
            arrays, meta = load_columns(manifest)
            self.dataset = read_json(self.root / "dataset.json")
            if meta.get("version") != MANIFEST_VERSION:
                raise DatasetError(f"{manifest}: manifest version {str(meta.get('version'))[:20]}, "
                                   f"this detaug reads {MANIFEST_VERSION} (rebuild it: detaug.shards.rebuild_manifest)")
            self.table = SampleTable.from_arrays(arrays)
            self.offsets, self.lengths, self.exts = arrays["offsets"], arrays["lengths"], arrays["exts"]
            names = [str(name) for name in meta["shards"]]
            _check_names(names, manifest / "meta.json", allow_paths_outside)
            _check_names([str(s["tar"]) for s in self.dataset["shards"]] + [str(s["index"]) for s in self.dataset["shards"]],
                         self.root / "dataset.json", allow_paths_outside)
            self.tars = [str(self.root / name) for name in names]
            self.shard_sizes = tuple(int(k) for k in meta["shard_samples"])
            if len(self.shard_sizes) != len(names) or len(names) != len(self.dataset["shards"]) or any(
                    str(s["tar"]) != name for s, name in zip(self.dataset["shards"], names)):
                raise DatasetError(f"{manifest / 'meta.json'}: its tar files differ from those of dataset.json")
            self._shard_starts = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)
            self._present = np.asarray(meta["present_labels"], dtype=np.int64)
            self._max_boxes = int(meta["max_boxes"])
            self._width = int(self.dataset["key_width"])
            if not 1 <= self._width <= 32:
                raise DatasetError(f"{self.root / 'dataset.json'}: key_width {self._width} is not 1..32")
            self._ext_names = [str(e) for e in self.dataset["extensions"]]
            specs = _specs_of(self.dataset)
            self.field_columns = {name: arrays[f"field_{k}"] for k, name in enumerate(specs)}
            self.segments, self.segment_rows = None, None  # segment_rows: the masks' rows of kept boxes
            if self.dataset.get("masks", False):
                self.segments = MaskColumns.from_arrays(arrays)
                if self.segments is None:
                    raise DatasetError(f"{manifest}: dataset.json says the samples have masks; the manifest has none")
            categories = {int(k): str(name) for k, name in self.dataset["categories"]}
            orientation = check_orientation(orientation if orientation is not None
                                            else self.dataset.get("orientation", "auto"))
            self._files: dict[int, int] = {}
            self._check_tars()
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            if isinstance(err, DatasetError):
                raise
            raise DatasetError(f"{manifest}: not a shard manifest detaug wrote ({type(err).__name__}: "
                               f"{' '.join(str(err).split())[:200]})") from None
        report = self._check_manifest(categories, specs)
        view = SampleView(self.table, _TarMember(self),
                          fields_of=_ShardFields(self) if specs or self.segments is not None else None)
        if self.segments is not None:
            specs = {**specs, MASKS: FieldSpec(np.dtype(np.uint8), ())}  # uint8 [N, H, W], each image's size
        super().__init__(CheckedSamples(view, categories, report, specs), orientation=orientation)  # type: ignore[arg-type]
        if self.skipped_when_written:  # named when written; said again to whoever reads the folder
            first = self.skipped_when_written[0]
            warnings.warn(f"{self.root}: {len(self.skipped_when_written)} image(s) left out when the shards were "
                          f"written, e.g. {first['file']} (image_id {first['image_id']}): {first['reason']} "
                          "(source.skipped_when_written lists them)", DataWarning, stacklevel=2)

    def _check_tars(self) -> None:
        """Every tar is there and as long as when it was written (one ``stat`` per tar)."""
        self._tar_bytes = []
        for tar, shard in zip(self.tars, self.dataset["shards"]):
            try:
                size = os.stat(tar).st_size
            except FileNotFoundError:
                raise FileNotFoundError(f"{tar}: tar file of the shard folder not found") from None
            if size < int(shard["bytes"]):
                raise DatasetError(f"{tar}: {size} bytes, {shard['bytes']} when written (truncated?)")
            self._tar_bytes.append(size)

    def _check_manifest(self, categories: dict[int, int | str], specs: dict[str, FieldSpec]) -> Report:
        """Check the manifest's columns as every source's are (vectorised); repairs make the
        table an in-memory copy. The report (raised when it has errors, warned of when it has
        repairs)."""
        report = Report(str(self.root))
        t = self.table
        n = len(t.image_ids)
        offsets, lengths, exts = (np.asarray(a) for a in (self.offsets, self.lengths, self.exts))
        if (offsets.shape != (n,) or lengths.shape != (n,) or exts.shape != (n,) or sum(self.shard_sizes) != n
                or min(self.shard_sizes, default=0) < 0):
            raise DatasetError(f"{self.root / 'manifest'}: offsets, lengths, exts or shard_samples do not fit "
                               f"the {n} samples")
        member = self.member_of if len(self._ext_names) else (lambda r: f"{self.root}: sample {r}")
        if n:
            shard = np.repeat(np.arange(len(self.shard_sizes)), self.shard_sizes)
            ends = np.asarray(self._tar_bytes, dtype=np.int64)[shard]
            bad = np.flatnonzero((offsets < 0) | (lengths < 0) | (offsets > ends - lengths) | (exts >= len(self._ext_names)))
            if len(bad):
                r = int(bad[0])
                raise DatasetError(f"{self.root / 'manifest'}: sample {r} (image_id {int(t.image_ids[r])}): "
                                   f"bytes {int(offsets[r])}+{int(lengths[r])} (ext {int(exts[r])}) are not inside "
                                   f"its tar {self.tars[int(shard[r])]} ({int(ends[r])} bytes); "
                                   f"{len(bad)} such sample(s)")
        for name, column in self.field_columns.items():
            spec = specs[name]
            if spec.dtype.kind not in "biuf" or column.dtype != spec.dtype or column.shape[1:] != spec.shape:
                raise DatasetError(f"{self.root / 'dataset.json'}: field {name!r} is {spec.dtype} {list(spec.shape)}, "
                                   f"its column {column.dtype} {list(column.shape[1:])} (numbers only)")
            if len(column) != len(t.boxes):
                raise DatasetError(f"{self.root / 'manifest'}: field {name!r} has {len(column)} rows, "
                                   f"{len(t.boxes)} boxes")
            check = {KEYPOINTS: check_keypoints, ROTATED_BOXES: check_rotated_boxes}.get(name)
            if check is not None:  # the checks of a sample's keypoints / rotated boxes, on the whole column
                checked, why = check(np.asarray(column), len(t.boxes))
                if checked is None:
                    raise DatasetError(f"{self.root / 'manifest'}: field {name!r} does not pass the checks ({why})")
        if self.segments is not None:  # the checks of a fresh parse of the segmentations
            why = self.segments.check(len(t.boxes))
            if why:
                raise DatasetError(f"{self.root / 'manifest'}: its masks do not pass the checks ({why})")
        boxes, keep = check_columns(t.image_ids, t.sizes, t.box_starts, t.boxes, t.labels, categories, report,
                                    member)
        report.raise_errors()
        labels = np.asarray(t.labels)
        if len(labels) and int(labels.min()) >= 0 and int(labels.max()) < 1 << 24:
            present = np.flatnonzero(np.bincount(labels[keep] if report.repairs else labels)).astype(np.int64)
        else:
            present = np.unique(labels[keep]).astype(np.int64)
        self._present = present  # the manifest's own list is not trusted
        self._max_boxes = int(np.diff(np.asarray(t.box_starts)).max(initial=0))
        if report.repairs:
            owner = np.repeat(np.arange(n), np.diff(np.asarray(t.box_starts)))[keep]
            starts = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n))]).astype(np.int64)
            self.table = SampleTable(np.asarray(t.image_ids), np.asarray(t.sizes), starts, boxes[keep],
                                     np.asarray(t.labels)[keep])
            self.field_columns = {name: np.asarray(c)[keep] for name, c in self.field_columns.items()}
            self.segment_rows = np.flatnonzero(keep).astype(np.int64)
            self._max_boxes = int(np.diff(starts).max(initial=0))
        report.images, report.boxes = n, int(self.table.box_starts[-1])
        report.finish()
        return report

    # -- what the loaders use --------------------------------------------------------------------

    def shard_of(self, index: int) -> int:
        """The tar file (its number) holding sample ``index``."""
        return int(np.searchsorted(self._shard_starts, index, side="right") - 1)

    def member_of(self, index: int) -> str:
        """``"<tar>:<key>.<ext>"`` of sample ``index``."""
        return f"{self.tars[self.shard_of(index)]}:{index:0{self._width}d}.{self._ext_names[int(self.exts[index])]}"

    def file_of(self, index: int) -> str:
        """The tar member of sample ``index`` (``"OUT/shard-000003.tar:000012345.jpg"``)."""
        self.samples.row(index)  # IndexError out of range  # type: ignore[attr-defined]
        return self.member_of(index % len(self))

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(data uint8 [L] the image bytes, boxes float32 [N, 4] xyxy, labels int64 [N],
        image_id)`` of sample ``index``; ``OSError`` naming the tar member when it cannot be read."""
        r = self.samples.row(index)  # type: ignore[attr-defined]
        shard = self.shard_of(r)
        offset, length = int(self.offsets[r]), int(self.lengths[r])
        try:
            fd = self._files.get(shard)
            if fd is None:
                fd = self._files[shard] = os.open(self.tars[shard], os.O_RDONLY)
            data = os.pread(fd, length, offset)
        except OSError as err:
            raise OSError(err.errno, f"{self.member_of(r)}: cannot read the image: {err.strerror or err}") from err
        if len(data) != length:
            raise OSError(5, f"{self.member_of(r)}: {len(data)} of {length} bytes (the tar is truncated)")
        t = self.table
        return np.frombuffer(data, np.uint8), t.boxes_of(r), t.labels_of(r), int(t.image_ids[r])

    def present_labels(self) -> np.ndarray:
        """int64: the distinct labels of all boxes, sorted (from the manifest, no scan)."""
        return self._present.copy()

    def max_boxes(self) -> int:
        """The largest number of boxes of one sample (from the manifest)."""
        return self._max_boxes

    def epoch_order(self, epoch: int, seed: int) -> np.ndarray:
        """int64 ``[n]``: the shuffled order of epoch ``epoch`` (:func:`shard_shuffled_order`)."""
        return shard_shuffled_order(self.shard_sizes, seed, epoch)

    @property
    def skipped_when_written(self) -> list[dict[str, Any]]:
        """The images :func:`write_shards` left out (``{"file", "image_id", "reason"}``)."""
        return list(self.dataset.get("skipped", []))

    def close(self) -> None:
        """Close the tar files opened so far (they open again when read)."""
        files, self._files = self._files, {}
        for fd in files.values():
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its folder and options (a worker process opens the manifest again)."""
        return (_open_shard_source, (str(self.root), self._options))

    def __repr__(self) -> str:
        return f"ShardSource({str(self.root)!r}, {len(self)} samples in {len(self.tars)} tar file(s))"


def _open_shard_source(root: str, options: dict[str, Any]) -> ShardSource:
    """A pickled source opened again (in a worker process): the same checks and repairs, said
    once by the process that built it."""
    import warnings

    from detaug.errors import DataWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        return ShardSource(root, **options)


def iter_webdataset(root: str | os.PathLike, *, allow_paths_outside: bool = False) -> Iterator[tuple[str, str]]:
    """``(tar, index)`` paths of a shard folder, in order (for ``fn.readers.webdataset``'s
    ``paths`` and ``index_paths``); paths outside the folder as :class:`ShardSource`."""
    dataset = read_json(Path(root) / "dataset.json")
    _check_names([str(s[k]) for s in dataset["shards"] for k in ("tar", "index")], Path(root) / "dataset.json",
                 allow_paths_outside)
    for shard in dataset["shards"]:
        yield str(Path(root) / shard["tar"]), str(Path(root) / shard["index"])


if __name__ == "__main__":
    sys.exit(main())
