"""converters.bench: the generated data set, and one small run of the benchmark command."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from converters import bench
from converters.voc2coco import convert


def test_generated_set_converts_cleanly(tmp_path: Path) -> None:
    n_objects = bench.generate_voc(tmp_path / "VOC", 60)
    assert len(list((tmp_path / "VOC/Annotations").glob("*.xml"))) == 60
    result = convert(tmp_path / "VOC")
    assert result.report.images_converted == 60
    assert result.report.objects_converted == n_objects
    assert result.report.skipped_total == 0
    assert bench.generate_voc(tmp_path / "again", 60) == n_objects  # seeded: same set


def test_benchmark_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("globox") is None:
        pytest.skip("globox not installed (pip install globox==2.9.0; only the benchmark uses it)")
    assert bench.main(["--files", "100", "--repeat", "1", "--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line}
    assert "files/s per core" in lines["voc2coco"] and "files/s per core" in lines["globox"]
    # both tools found the same boxes in the generated set
    count = lines["voc2coco"].split("; ")[-1]
    assert count.endswith("annotations)") and count in lines["globox"]
    assert lines["ratio"].split()[1].endswith("x") and "CPU time" in lines["ratio"]
