"""The targets ``detaug bench`` checks (:data:`CHECKS`, :data:`YOLO_CHECKS`; ``--check`` fails the
run on a missed one) and their evaluation on a :class:`~detaug.bench.report.BenchReport`'s rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from detaug.bench.recipe import peer_recipe
from detaug.bench.variants import VariantResult

if TYPE_CHECKING:
    from detaug.bench.report import BenchReport


@dataclass(frozen=True)
class Check:
    """A target: ``numerator / denominator >= target`` in img/s (img/s per core with ``per_core``),
    the two rows of the recipes ``recipes`` (numerator's, denominator's) at one batch size; with
    ``memory_mib``, the numerator row's peak GPU memory above its start ``<= target`` MiB."""

    name: str
    numerator: str
    denominator: str  # a variant name, "cpu-peer" for the best CPU peer of the numerator's recipe; "" with memory_mib
    target: float
    per_core: bool = False
    recipes: tuple[str, str] = ("default", "default")
    memory_mib: bool = False  # instead: the numerator row's peak GPU memory (MiB) <= target
    gpu_only: bool = True  # a target of a GPU run: a CPU run prints its value and "n/a", never FAIL


#: The targets of a GPU run (issue 16); a CPU run prints their values with "n/a" (``gpu_only``),
#: all but the per-core one, whose two rows run on the CPU in every run.
CHECKS: tuple[Check, ...] = (
    Check("detaug (COCO reader) / decode limit", "detaug", "decode", 0.85),
    Check("detaug (sample list) / decode limit", "detaug-list", "decode", 0.85),
    Check("Sequence in fit / iterator (COCO reader)", "sequence", "detaug", 0.8),
    Check("Sequence in fit / iterator (sample list)", "sequence", "detaug-list", 0.8),
    Check("detaug (COCO reader) / best CPU peer", "detaug", "cpu-peer", 25.0),
    Check("detaug (sample list) / best CPU peer", "detaug-list", "cpu-peer", 25.0),
    Check("detaug (COCO reader) / torchvision v2 on the GPU", "detaug", "torchvision-gpu", 100.0),
    Check("detaug on the CPU / albumentations, per core", "detaug-cpu", "albumentations", 1.0, per_core=True,
          gpu_only=False),
    Check("Sequence in fit: peak GPU memory, MiB (no model)", "sequence", "", 4096.0, memory_mib=True),
)
#: The targets of the YOLO-style recipe (issue 11), evaluated when ``--recipes`` has ``yolo``.
YOLO_CHECKS: tuple[Check, ...] = (
    Check("YOLO recipe / default recipe, detaug (COCO reader)", "detaug", "detaug", 0.5, recipes=("yolo", "default")),
    Check("YOLO recipe: detaug (COCO reader) / albumentations Mosaic", "detaug", "albumentations-mosaic", 20.0,
          recipes=("yolo", "yolo")),
)


#: The same targets for the YOLO recipe with partners from the batch (``--recipes yolo-batch``).
YOLO_BATCH_CHECKS: tuple[Check, ...] = (
    Check("YOLO recipe, pool='batch' / default recipe, detaug (COCO reader)", "detaug", "detaug", 0.5,
          recipes=("yolo-batch", "default")),
    Check("YOLO recipe, pool='batch': detaug (COCO reader) / albumentations Mosaic", "detaug",
          "albumentations-mosaic", 20.0, recipes=("yolo-batch", "yolo")),
)


def checks_for(recipes: Sequence[str], device: str = "gpu") -> tuple[Check, ...]:
    """The checks of a run of ``recipes`` on ``device``: :data:`CHECKS` with the default recipe
    (less the GPU memory check in a CPU run), :data:`YOLO_CHECKS` with the YOLO one,
    :data:`YOLO_BATCH_CHECKS` with ``yolo-batch``."""
    default = tuple(c for c in CHECKS if device == "gpu" or not c.memory_mib)
    return (*(default if "default" in recipes else ()), *(YOLO_CHECKS if "yolo" in recipes else ()),
            *(YOLO_BATCH_CHECKS if "yolo-batch" in recipes else ()))


def target_met(value: float | None, target: float, at_most: bool, applies: bool = True) -> bool | None:
    """Whether ``value`` meets ``target``: ``value <= target`` with ``at_most``, else
    ``value >= target``; ``None`` without a value or where the target is not this run's
    (``applies=False``). The rule of ``detaug bench``'s checks and of ``--train``'s."""
    if value is None or not applies:
        return None
    return value <= target if at_most else value >= target


def check_line(name: str, shown: str | None, bound: str, passed: bool | None, applies: bool, reason: str = "") -> str:
    """A check's line: ``NAME = SHOWN (BOUND): PASS`` (``FAIL``, or ``n/a on the CPU`` where the
    target is not this run's), or ``NAME: n/a (REASON) (BOUND)`` without a value (``shown=None``)."""
    if shown is None:
        return f"{name}: n/a ({reason}) ({bound})"
    verdict = "PASS" if passed else "FAIL" if applies else "n/a on the CPU"
    return f"{name} = {shown} ({bound}): {verdict}"


@dataclass
class CheckResult:
    """A check's value; ``applies=False`` where the target is not this run's (a GPU target in a
    CPU run): the value is shown, ``passed`` is ``None`` and the line says "n/a"."""

    check: Check
    value: float | None
    reason: str = ""
    batch_size: int | None = None
    applies: bool = True

    @property
    def passed(self) -> bool | None:
        return target_met(self.value, self.check.target, self.check.memory_mib, self.applies)

    def line(self) -> str:
        c = self.check
        bound = f"target {'<=' if c.memory_mib else '>='} {c.target:g}"
        shown = None if self.value is None else f"{self.value:,.0f}" if c.memory_mib else f"{self.value:.2f}"
        return check_line(c.name, shown, bound, self.passed, self.applies, self.reason)

    def to_dict(self) -> dict:
        return {
            "name": self.check.name,
            "batch_size": self.batch_size,
            "numerator": self.check.numerator,
            "denominator": self.check.denominator,
            "numerator_recipe": self.check.recipes[0],
            "denominator_recipe": self.check.recipes[1],
            "per_core": self.check.per_core,
            "memory_mib": self.check.memory_mib,
            "value": self.value,
            "target": self.check.target,
            "passed": self.passed,
            "applies": self.applies,
            "reason": self.reason,
        }


def _best_cpu_peer(results: list[VariantResult], recipe: str = "default") -> float | None:
    """The img/s of the fastest CPU peer of ``recipe``, or ``None``."""
    rates = [r.images_per_second for r in results
             if r.variant.kind == "cpu-peer" and r.recipe == recipe and r.measurement]
    return max(rates) if rates else None


def _evaluate(check: Check, report: BenchReport) -> CheckResult:
    """``check`` on ``report``'s rows; a GPU target (``check.gpu_only``) in a CPU run keeps its
    value but does not apply (its line says "n/a", ``--check`` ignores it)."""
    result = _check_value(check, report)
    result.applies = not check.gpu_only or report.settings.device == "gpu"
    return result


def _check_value(check: Check, report: BenchReport) -> CheckResult:
    batch = report.settings.batch_size
    top_recipe, bottom_recipe = check.recipes
    top = report.result(check.numerator, top_recipe)
    if top is None or top.measurement is None:
        return CheckResult(check, None, _why_missing(check.numerator, top, top_recipe), batch)
    if check.memory_mib:
        if top.measurement.gpu_peak_mib is None:
            return CheckResult(check, None, "no GPU memory figure (a CPU run)", batch)
        return CheckResult(check, top.measurement.gpu_peak_mib, batch_size=batch)
    if check.denominator == "cpu-peer":
        bottom = _best_cpu_peer(report.results, peer_recipe(top_recipe))
        if bottom is None:
            return CheckResult(check, None, "no CPU peer measured", batch)
        return CheckResult(check, top.images_per_second / bottom, batch_size=batch)
    other = report.result(check.denominator, bottom_recipe)
    if other is None or other.measurement is None:
        return CheckResult(check, None, _why_missing(check.denominator, other, bottom_recipe), batch)
    if check.per_core:
        if top.per_core is None or other.per_core is None:
            return CheckResult(check, None, "no per-core figure", batch)
        return CheckResult(check, top.per_core / other.per_core, batch_size=batch)
    return CheckResult(check, top.images_per_second / other.images_per_second, batch_size=batch)


def _why_missing(name: str, result: VariantResult | None, recipe: str = "default") -> str:
    label = name if recipe == "default" else f"{name} ({recipe} recipe)"
    if result is None:
        return f"{label} not run"
    return f"{label} {result.status}"
