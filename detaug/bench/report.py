"""What ``detaug bench`` gives back and prints: :class:`BenchReport` (its tables, ratios, checks,
settings and environment; ``--json``'s :data:`SCHEMA`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from detaug.bench.albumentations_peers import PEERS_PIP
from detaug.bench.checks import CheckResult
from detaug.bench.dataset import BenchDataset
from detaug.bench.harness import BenchSettings, available_cpus
from detaug.bench.recipe import RECIPE_TITLES, source_images_per_sample
from detaug.bench.tables import format_table
from detaug.bench.variants import VariantResult, same_row


RECIPE_TITLE = RECIPE_TITLES["default"]
#: 3: rows carry their ``recipe`` (two rows may share a variant name), ``source_img_per_s``,
#: ``sources_vs_decode`` and ``vs_default_recipe``; ``settings`` has ``recipes`` and ``sizes``.
SCHEMA = "detaug-bench/3"


@dataclass
class BenchReport:
    """Everything ``detaug bench`` prints (:meth:`format`) and writes with ``--json``.

    The report of the first batch size; :attr:`more_runs` holds the reports of the others
    (same dataset and environment), :attr:`scaling` the ``--scaling`` rows. :attr:`results` holds
    the rows of every recipe of the run (:attr:`recipes`, output sides in :attr:`sizes`).
    """

    settings: BenchSettings
    dataset: BenchDataset
    environment: dict
    results: list[VariantResult]
    checks: list[CheckResult] = field(default_factory=list)
    images_requested: int | None = None
    images_per_variant: str = ""
    warmup: int | None = None
    more_runs: list[BenchReport] = field(default_factory=list)
    scaling: dict | None = None
    recipes: tuple[str, ...] = ("default",)
    sizes: dict[str, int] = field(default_factory=dict)
    rounds: int = 1

    def result(self, name: str, recipe: str = "default") -> VariantResult | None:
        """The row of variant ``name`` in ``recipe`` (the decode limit, shared, in any); in a CPU
        run ``detaug-cpu`` is the ``detaug`` row (:func:`same_row`)."""
        for wanted in dict.fromkeys((name, same_row(name, self.settings.device))):
            row = next((r for r in self.results if r.variant.name == wanted and r.recipe in (recipe, None)), None)
            if row is not None:
                return row
        return None

    def size_of(self, recipe: str) -> int:
        return self.sizes.get(recipe, self.settings.size)

    @property
    def runs(self) -> list[BenchReport]:
        """This report and :attr:`more_runs`: one per batch size, in the order run."""
        return [self, *self.more_runs]

    def decode(self) -> dict | None:
        """The decode limit of this batch size: ``img_per_s``, ``settings``, ``sweep``, or ``None``."""
        r = self.result("decode")
        if r is None:
            return None
        return {
            "batch_size": self.settings.batch_size,
            "status": r.status,
            "message": r.message,
            "img_per_s": r.images_per_second,
            "settings": r.extra.get("settings"),
            "sweep": r.extra.get("sweep", []),
        }

    def format(self) -> str:
        env, s = self.environment, self.settings
        gpu = s.device == "gpu"
        sizes = ", ".join(str(r.settings.batch_size) for r in self.runs)
        if tuple(self.recipes) == ("default",):
            title = f"default detection recipe ({RECIPE_TITLE.format(size=s.size)})"
            size_text = f"size {s.size}"
        else:
            title = "recipes " + "; ".join(
                f"{name} ({RECIPE_TITLES[name].format(size=self.size_of(name))})" for name in self.recipes)
            size_text = "size " + ", ".join(f"{self.size_of(name)} ({name})" for name in self.recipes)
        adapters = "" if s.adapter_threads else " (detaug rows: the adapters' own split, the JSON rows' description)"
        lines = [
            f"detaug bench: {title}",
            f"GPU: {env['gpu']} | CPUs: {env['cpus']} | "
            + " | ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
            (
                f"device {s.device} | batch {sizes} | DALI threads {s.threads}{adapters} | "
                f"DataLoader workers {s.workers} | {size_text} | seed {s.seed}"
                + (" | under NVIDIA MPS (DetectionLoader rows: the loader in a process of its own)"
                   if s.device == "gpu" and env.get("mps_control_pipe") else "")
            ),
            f"dataset: {self.dataset.describe()}",
        ]
        if self.images_per_variant:
            lines.append(
                f"timed: {self.images_per_variant} per variant after {self.warmup} warm-up batches"
                + ("" if gpu or self.images_requested else " (a short CPU run; --images N for a longer one)")
            )
        if self.rounds > 1:
            lines.append(f"rounds: {self.rounds}, the variants taking turns; each row but the peers' is its "
                         "median round (every round's img/s in the JSON)")
        for run in self.runs:
            lines += ["", f"batch {run.settings.batch_size}:"] if len(self.runs) > 1 else [""]
            lines += run._table()
        lines += ["", ("CPU peers are timed in whole waves of DataLoader workers; per core: img/s over "
                       "the DataLoader workers or DALI threads of the CPU paths (at most the CPUs here).")]
        described = {r.variant.name: r.description for r in self.results
                     if r.description and r.variant.kind in ("cpu-peer", "gpu-peer")}
        lines += [f"{name} runs: {text}" for name, text in described.items()]
        if "yolo" in self.recipes:
            lines.append(
                "src img/s: source images read and decoded per second, img/s times the images per sample "
                f"(YOLO: {source_images_per_sample('yolo'):g} for detaug, 4 mosaic tiles plus the MixUp "
                f"partners; {source_images_per_sample('yolo', mixup=False):g} for albumentations, which has "
                "no MixUp; detaug decodes only the visible part of each tile): compare it, not img/s, "
                "with the decode limit (one image each).")
        if "yolo-batch" in self.recipes:
            lines.append("yolo-batch: the YOLO recipe with Mosaic(pool='batch') and MixUp(pool='batch'): "
                         "partners are other samples of the batch, each photo decoded once (1 source image "
                         "per sample); its peer is albumentations' Mosaic of the yolo recipe.")
        lines += _missing_peer_lines([r for run in self.runs for r in run.results])
        if gpu:
            lines.append(
                "GPU MiB: the peak of device-wide GPU memory in use above the start of the variant "
                "(DALI's pools and decoders, PyTorch's cache), sampled every 50 ms."
            )
        if self.scaling:
            lines += ["", *_scaling_lines(self.scaling)]
        lines += ["", "checks" + ("" if gpu else " (the targets are for a GPU run)") + ":"]
        for run in self.runs:
            prefix = f"[batch {run.settings.batch_size}] " if len(self.runs) > 1 else ""
            lines += [f"  {prefix}{c.line()}" for c in run.checks]
        return "\n".join(lines)

    def _table(self) -> list[str]:
        """One row per result: with several recipes a ``recipe`` column; with the YOLO recipe
        the source images per second, their ratio to the decode limit and the ratio to the
        default recipe; on a GPU the GPU memory."""
        gpu = self.settings.device == "gpu"
        several = len(self.recipes) > 1
        yolo = any(r != "default" for r in self.recipes)  # the YOLO and masks recipes' ratios to the default
        columns = ["variant", *(["recipe"] if several else []), "img/s",
                   *(["src img/s", "src vs decode", "vs default"] if yolo else []),
                   "vs decode", "vs best CPU", "per core", "images", "s", *(["GPU MiB"] if gpu else []), "note"]
        header = tuple(columns)
        rows = [header]
        for r in self.results:
            m = r.measurement
            lead = [r.variant.label, *([r.recipe or "-"] if several else [])]
            if m is None:
                rows.append((*lead,) + ("-",) * (len(header) - len(lead) - 1) + (f"{r.status}: {r.message}",))
                continue
            note = r.variant.note_for(self.settings.device)
            if r.variant.name == "decode" and r.extra.get("settings"):
                note = "best of the sweep: " + _settings_text(r.extra["settings"])
            src = r.source_images_per_second
            row = (
                *lead,
                f"{m.images_per_second:,.1f}",
                *([f"{src:,.1f}", _ratio(r.sources_vs_decode), _ratio(r.vs_default_recipe)] if yolo else []),
                _ratio(r.vs_decode),
                _ratio(r.vs_cpu_peer),
                "-" if r.per_core is None else f"{r.per_core:,.1f}",
                str(m.images),
                f"{m.seconds:.2f}",
                *(["-" if m.gpu_peak_mib is None else f"{m.gpu_peak_mib:,.0f}"] if gpu else []),
                note,
            )
            rows.append(row)
        return format_table(rows)

    def to_dict(self) -> dict:
        s = self.settings
        runs = [
            {
                "batch_size": run.settings.batch_size,
                "decode": run.decode(),
                "results": [r.to_dict(s.device) for r in run.results],
                "checks": [c.to_dict() for c in run.checks],
            }
            for run in self.runs
        ]
        return {
            "schema": SCHEMA,
            "settings": {
                "device": s.device,
                "batch_size": s.batch_size,
                "batch_sizes": [run.settings.batch_size for run in self.runs],
                "workers": s.workers,
                "threads": s.threads,
                "size": s.size,
                "recipes": list(self.recipes),
                "sizes": {name: self.size_of(name) for name in self.recipes},
                "seed": s.seed,
                "images_requested": self.images_requested,
                "warmup": self.warmup,
                "rounds": self.rounds,
                "cpus": available_cpus(),
                "decoder_defaults": decoder_defaults(s.device),
            },
            "environment": self.environment,
            "dataset": self.dataset.to_dict(),
            "decode": runs[0]["decode"],
            "results": [row for run in runs for row in run["results"]],
            "checks": [c for run in runs for c in run["checks"]],
            "runs": runs,
            "scaling": self.scaling,
        }


def decoder_defaults(device: str) -> dict:
    """What detaug's loaders decode with by default here (:mod:`detaug.decoding`): ``{"decoder_options":
    {"hw_decoder_load": share} on a GPU ({} on the CPU; {"error": message} for a bad
    ``DETAUG_HW_DECODER_LOAD``), "num_threads": DALI's threads}``."""
    from detaug.decoding import decoder_options, default_num_threads

    try:
        options = decoder_options(device == "gpu")
    except ValueError as exc:  # a bad DETAUG_HW_DECODER_LOAD
        options = {"error": str(exc)}
    return {"decoder_options": options, "num_threads": default_num_threads()}


def _settings_text(settings: dict) -> str:
    parts = []
    if settings.get("hw_decoder_load") is not None:
        parts.append(f"hw_decoder_load {settings['hw_decoder_load']:g}")
    threads = settings["num_threads"]
    parts.append(f"{threads} thread" + ("" if threads == 1 else "s"))
    parts.append("window decoding" if settings.get("window") else "whole images")
    return ", ".join(parts)


def _scaling_lines(scaling: dict) -> list[str]:
    lines = ["scaling (img/s):"]
    for row in scaling.get("megapixels", []):
        ips = row["img_per_s"]
        rate = "-" if ips is None else f"{ips:,.1f} img/s ({ips * row['megapixels']:,.1f} MP/s)"
        lines.append(f"  {row['megapixels']:g} MP ({row['size_wh'][0]}x{row['size_wh'][1]}), batch "
                     f"{row['batch_size']}, {row['variant']}: {rate}" + (f" {row['message']}" if row["message"] else ""))
    for row in scaling.get("batch", []):
        ips = row["img_per_s"]
        rate = "-" if ips is None else f"{ips:,.1f} img/s"
        lines.append(f"  batch {row['batch_size']}, {row['variant']}: {rate}" + (f" {row['message']}" if row["message"] else ""))
    return lines


def _missing_peer_lines(results: list[VariantResult]) -> list[str]:
    """How to install each peer that was unavailable, without changing the installed torch."""
    missing = {r.variant.name for r in results if r.variant.kind in ("cpu-peer", "gpu-peer") and r.status == "unavailable"
               and "CUDA GPU" not in r.message}
    lines = []
    if missing & {"albumentations", "albumentations-mosaic"}:
        lines.append(f"albumentations missing: {PEERS_PIP} (from the detaug clone; it leaves torch as it is)")
    if missing & {"torchvision", "torchvision-gpu"}:
        from detaug.bench.torchvision_peers import torchvision_pip

        lines.append(f"torchvision missing or not loadable (it must be the build of your torch): {torchvision_pip()}")
    return lines


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
