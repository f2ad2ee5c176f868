"""The command lines as a new user meets them (issue 17): one-line errors with exit status 2 naming
the file, folder, line or option at fault (``--debug`` shows the traceback), ``detaug --version``,
``detaug bench`` defaults that fit the machine and labels true to the device, the demo saying
which split it converted, and benchmark figures from one recorded run.

Everything runs on the CPU; the full default CPU bench (under a minute on 2 cores) runs with
``DETAUG_SLOW_TESTS=1``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from detaug import cli
from detaug.bench import harness, runner
from detaug.bench.checks import _evaluate
from detaug.bench.dataset import BenchDataset, prepare_dataset
from detaug.bench.harness import (
    BenchSettings,
    Measurement,
    default_threads,
    default_workers,
)
from detaug.bench.peers import PEERS_PIP, torchvision_pip
from detaug.bench.variant_runs import _fill_ratios
from detaug.synthetic import write_coco_dataset, write_voc_dataset

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``detaug ARGV`` in this process: ``(status, stdout, stderr)`` (argparse's exits too)."""
    try:
        status = cli.main(list(argv))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def one_error_line(err: str, prefix: str = "detaug") -> str:
    """The one line of ``err`` (nothing else printed, no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix) and ": error: " in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def voc(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("voc")
    write_voc_dataset(root, num_images=6, seed=0, size=((64, 96), (64, 96)))
    return root


@pytest.fixture(scope="module")
def coco(tmp_path_factory, voc) -> Path:
    from converters.voc2coco import convert, write_coco_json

    result = convert(voc)
    path = tmp_path_factory.mktemp("coco") / "train.json"
    write_coco_json(result.coco, path)
    return path


# -- item 4: one-line errors ----------------------------------------------------------------------


def test_version(capsys):
    import detaug

    status, out, _ = run_cli(capsys, "--version")
    assert status == 0 and out.strip() == f"detaug {detaug.__version__}"


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("bad.yaml", "transforms:\n  - name: Resize\n    size: [64, 64\n",
         r"bad\.yaml: line 4, column 1: YAML syntax error: expected ',' or '\]'.*line 3, column 11"),
        ("tabs.yml", "transforms:\n\t- name: Resize\n", r"tabs\.yml: line 2, column 1: YAML syntax error"),
        ("bad.json", '{"transforms": [\n  {"name": "Resize",}\n]}', r"bad\.json: line 2, column 21: JSON syntax error"),
        ("recipe.txt", "transforms: []\n", r"--recipe .*recipe\.txt: a recipe file ends in \.yaml, \.yml or \.json \(this one ends in \.txt\)"),
        ("recipe", "transforms: []\n", r"--recipe .*recipe: a recipe file ends in .* has no extension"),
        ("empty.yaml", "", r"empty\.yaml: the recipe file is empty"),
        ("scalar.yaml", "42\n", r"scalar\.yaml: a recipe is a mapping with a 'transforms' list .* got a int"),
        ("unknown.yaml", "transforms:\n  - name: Blur\n", r"unknown\.yaml: line 2: transforms\[0\]: unknown transform 'Blur'"),
        ("args.json", '{"transforms": [{"name": "Resize", "sizes": 3}]}', r"args\.json: line 1: transforms\[0\] Resize\.sizes: unknown field \(did you mean 'size'\?\)"),
    ],
)
def test_recipe_errors_are_one_line_naming_file_and_line(tmp_path, capsys, name, text, expected):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    status, _, err = run_cli(capsys, "recipe", "--recipe", str(path))
    assert status == 2
    assert re.search(expected, one_error_line(err, "detaug recipe")), err


def test_a_missing_recipe_file(tmp_path, capsys):
    status, _, err = run_cli(capsys, "recipe", "--recipe", str(tmp_path / "nope.yaml"))
    assert status == 2 and one_error_line(err).endswith(f"--recipe {tmp_path / 'nope.yaml'}: file not found")


def test_a_recipe_round_trips(tmp_path, capsys):
    status, out, _ = run_cli(capsys, "recipe", "--size", "64")
    assert status == 0
    (tmp_path / "r.yml").write_text(out, encoding="utf-8")
    status, again, _ = run_cli(capsys, "recipe", "--recipe", str(tmp_path / "r.yml"))
    assert status == 0 and again == out


def test_debug_shows_the_traceback(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("a: [1\n", encoding="utf-8")
    status, _, err = run_cli(capsys, "recipe", "--recipe", str(path), "--debug")
    assert status == 2 and "Traceback" in err and "yaml.parser.ParserError" in err
    assert err.rstrip().splitlines()[-1].startswith("detaug recipe: error: ")


def test_option_errors_are_one_line(capsys):
    status, _, err = run_cli(capsys, "preview", "--num", "0")
    assert status == 2
    assert "argument --num: must be at least 1, got 0" in one_error_line(err, "detaug preview")
    status, _, err = run_cli(capsys, "demo", "--device", "tpu")
    assert status == 2 and "argument --device: invalid choice: 'tpu'" in one_error_line(err, "detaug demo")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--voc", "{tmp}/nope"], "--voc {tmp}/nope: folder not found"),
        (["--voc", "{coco}"], "--voc {coco}: not a folder"),
        (["--voc", "{voc}", "--labels", "{tmp}/labels.txt"], "--labels {tmp}/labels.txt: file not found"),
        (["--voc", "{voc}", "--split", "nope"], "split 'nope' not found: no {voc}/ImageSets/Main/nope.txt"),
        (["--coco", "{tmp}/nope.json", "--images", "{voc}"], "--coco {tmp}/nope.json: file not found"),
        (["--coco", "{coco}"], "--coco needs --images DIR"),
        (["--coco", "{coco}", "--images", "{tmp}/nope"], "--images {tmp}/nope: folder not found"),
        (["--coco", "{coco}", "--images", "{voc}"], "--images {voc}: none of the 6 images of {coco} is there"),
        (["--coco", "{coco}", "--images", "{voc}/JPEGImages", "--split", "train"], "--split goes with --voc"),
        (["--coco", "{coco}", "--voc", "{voc}"], "give either --voc ROOT or --coco FILE --images DIR, not both"),
        ([], "give a dataset: --voc ROOT, or --coco FILE --images DIR"),
        (["--voc", "{voc}", "--recipe", "{tmp}/r.txt"], "--recipe {tmp}/r.txt: a recipe file ends in"),
        (["--voc", "{voc}", "--out", "{tmp}"], "--out {tmp}: is a folder"),
    ],
)
def test_preview_dataset_errors_name_the_option(tmp_path, capsys, voc, coco, args, expected):
    fill = {"tmp": str(tmp_path), "voc": str(voc), "coco": str(coco)}
    status, out, err = run_cli(capsys, "preview", "--device", "cpu", *(a.format(**fill) for a in args))
    assert status == 2 and out == ""
    assert expected.format(**fill) in one_error_line(err, "detaug preview"), err


def test_gpu_without_one_names_the_option(capsys, voc):
    from detaug.pipeline import cuda_devices

    if cuda_devices():
        pytest.skip("DALI sees a GPU here")
    status, _, err = run_cli(capsys, "preview", "--voc", str(voc), "--device", "gpu")
    line = one_error_line(err, "detaug preview")
    assert status == 2 and "--device gpu: " in line and "CUDA" in line


def test_demo_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    status, _, err = run_cli(capsys, "demo", "--out", str(tmp_path / "f"), "--device", "cpu")
    assert status == 2 and f"--out {tmp_path / 'f'}: is a file" in one_error_line(err, "detaug demo")


def test_preview_works(tmp_path, capsys, coco, voc):
    out = tmp_path / "sub" / "p.png"
    status, stdout, _ = run_cli(capsys, "preview", "--coco", str(coco), "--images", str(voc / "JPEGImages"),
                                "--num", "2", "--size", "64", "--device", "cpu", "--out", str(out))
    assert status == 0 and out.is_file() and f"wrote {out}" in stdout


@pytest.fixture
def detaug_log():
    """The ``detaug`` logger, put back as it was after the test (a command line adds its handler)."""
    import logging

    log = logging.getLogger("detaug")
    saved = (list(log.handlers), log.level, log.propagate)
    yield log
    log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]


def test_importing_detaug_adds_only_a_null_handler():
    """A library configures no output (issue 40): a fresh interpreter, as this one ran commands."""
    code = ("import logging, detaug; log = logging.getLogger('detaug'); "
            "print([type(h).__name__ for h in log.handlers], log.level, log.propagate)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          cwd=ROOT)
    assert done.stdout.strip() == "['NullHandler'] 0 True" and done.stderr == ""


def test_the_command_line_prints_what_detaug_decided(tmp_path, capsys, voc, monkeypatch, detaug_log):
    """``detaug`` sets up its own handler: the ``device='auto'`` line, once, on stderr."""
    from detaug import cli_support, pipeline

    for handler in [h for h in detaug_log.handlers if isinstance(h, cli_support._StderrLines)]:
        detaug_log.removeHandler(handler)  # as in a new process
    monkeypatch.setattr(pipeline, "_said", set())
    args = ("preview", "--voc", str(voc), "--num", "2", "--size", "64", "--device", "auto", "--out")
    status, _, err = run_cli(capsys, *args, str(tmp_path / "a.png"))
    assert status == 0
    assert re.search(r"^detaug: device='auto': the (GPU|CPU) ", err, re.MULTILINE), err
    status, _, err = run_cli(capsys, *args, str(tmp_path / "b.png"))
    assert status == 0 and "device='auto'" not in err  # said once per process
    assert sum(isinstance(h, cli_support._StderrLines) for h in detaug_log.handlers) == 1
    monkeypatch.setattr(pipeline, "_said", set())
    pipeline.pick_device("auto")
    assert "detaug: device='auto': " in capsys.readouterr().err  # the stderr of the moment


def test_the_installed_command_prints_one_line_and_exits_2(tmp_path, coco, voc):
    """The real process: exit status 2, one line on stderr, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "detaug.cli", "preview", "--coco", str(coco), "--images", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2
    assert f"--images {tmp_path}: none of the 6 images" in one_error_line(done.stderr, "detaug preview")


def test_unexpected_errors_are_one_line_with_status_1(monkeypatch, capsys):
    def broken(path):
        raise RuntimeError("deep inside\nsecond line")

    monkeypatch.setattr(cli, "read_recipe", broken)
    status, _, err = run_cli(capsys, "recipe", "--recipe", "r.yaml")
    line = one_error_line(err)
    assert status == 1 and "RuntimeError: deep inside (and 1 more lines" in line and "--debug shows the traceback" in line


# voc2coco


@pytest.mark.parametrize(
    "args, expected, status",
    [
        (["{voc}"], "voc2coco: error: the following arguments are required: -o/--output (see voc2coco --help)", 2),
        (["{voc}", "-o", "{tmp}/x.json", "--coords", "bad"], "voc2coco: error: argument --coords: invalid choice", 2),
        (["{voc}", "-o", "{tmp}/x.json", "--workers", "0"], "voc2coco: error: argument --workers: must be at least 1", 2),
        (["{tmp}/nope", "-o", "{tmp}/x.json"], "voc2coco: error: {tmp}/nope: not a folder", 2),
        (["{voc}", "-o", "{tmp}/x.json", "--split", "nope"], "voc2coco: error: split 'nope' not found", 2),
        (["{voc}", "-o", "{tmp}/x.json", "--labels", "{tmp}/l.txt"], "voc2coco: error: labels: {tmp}/l.txt is not", 2),
    ],
)
def test_voc2coco_errors_are_one_line(tmp_path, capsys, voc, args, expected, status):
    from converters.cli import main

    fill = {"tmp": str(tmp_path), "voc": str(voc)}
    try:
        got = main([a.format(**fill) for a in args] + ["--quiet"])
    except SystemExit as exc:
        got = exc.code
    err = capsys.readouterr().err
    assert got == status and one_error_line(err, "voc2coco").startswith(expected.format(**fill)), err


def test_voc2coco_debug_shows_the_traceback(tmp_path, capsys):
    from converters.cli import main

    assert main([str(tmp_path / "nope"), "-o", str(tmp_path / "x.json"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().splitlines()[-1] == f"voc2coco: error: {tmp_path / 'nope'}: not a folder"


# bench


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--data", "{tmp}"], "detaug bench: error: --data {tmp} should hold annotations.json and images/"),
        (["--only", "bogus"], "detaug bench: error: unknown variant(s) ['bogus']"),
        (["--batch-size", "0"], "detaug bench: error: argument --batch-size: must be at least 1, got 0"),
        (["--json", "{tmp}"], "detaug bench: error: --json {tmp}: is a folder"),
    ],
)
def test_bench_errors_are_one_line(tmp_path, capsys, args, expected):
    fill = {"tmp": str(tmp_path)}
    status, _, err = run_cli(capsys, "bench", "--device", "cpu", *(a.format(**fill) for a in args))
    assert status == 2 and one_error_line(err).startswith(expected.format(**fill)), err


# -- item 6: bench defaults that fit the machine, labels true to the device --------------------------


@pytest.mark.parametrize("cpus, threads, workers", [(16, 16, 16), (2, 2, 2), (1, 1, 1), (64, 16, 64)])
def test_threads_and_workers_follow_the_cpus(cpus, threads, workers):
    assert (default_threads(cpus), default_workers(cpus)) == (threads, workers)


def test_the_cpus_are_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert harness.available_cpus() <= 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    assert harness.available_cpus() == 1
    assert BenchSettings(device="cpu").threads == 1 and BenchSettings(device="cpu").workers == 1


@pytest.fixture(scope="module")
def bench_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    write_coco_dataset(root, num_images=8, size=(160, 120), min_objects=1, max_objects=3, seed=0, progress=False)
    return prepare_dataset(root)


def test_cpu_defaults_are_a_short_run(bench_data):
    report = runner.run_bench(data=bench_data.root, device="cpu", only=["raw-dali"], log=lambda msg: None)
    s, cpu = report.settings, runner.DEFAULTS["cpu"]
    assert (s.batch_size, s.threads, s.workers) == (cpu.batch_size, default_threads(), default_workers())
    raw = report.result("raw-dali")
    assert raw.status == "ok" and cpu.images <= raw.measurement.images < cpu.images + cpu.batch_size
    assert report.warmup == cpu.warmup
    assert f"timed: {cpu.images} images per variant after 2 warm-up batches (a short CPU run; --images N" in report.format()
    gpu = runner.DEFAULTS["gpu"]
    assert (gpu.num_images, gpu.batch_size, gpu.epochs, cpu.num_images) == (2048, 64, (10, 2), 256)


def _fake_report(device: str, missing: tuple[str, ...] = ()) -> runner.BenchReport:
    results = []
    for variant in runner.VARIANTS:
        if variant.name in missing:
            results.append(runner.VariantResult(variant, "unavailable", message="not installed"))
        else:
            m = Measurement(images=64, batches=4, seconds=1.0, warmup_seconds=0.1,
                            gpu_mem_mib=100.0 if device == "gpu" else None)
            results.append(runner.VariantResult(variant, "ok", measurement=m))
    _fill_ratios(results)
    dataset = BenchDataset(
        root=Path("/d"), images_dir=Path("/d/images"), annotations_file=Path("/d/a.json"), num_images=8,
        num_boxes=16, max_boxes=3, min_size=(600, 420), max_size=(600, 420), total_bytes=8000, generated=True)
    env = {"gpu": "none" if device == "cpu" else "NVIDIA H100", "cpus": "2", "versions": {"python": "3"}}
    report = runner.BenchReport(BenchSettings(device=device, workers=1, threads=2), dataset, env, results)
    report.checks = [_evaluate(c, report) for c in runner.checks_for(("default",), device)]
    return report


def test_a_cpu_report_says_nothing_about_a_gpu():
    report = _fake_report("cpu")
    body = report.format().split("\n", 2)[2]  # past the title and the "GPU: none | CPUs" line
    body = body.replace("checks (the targets are for a GPU run):", "")
    body = "\n".join(line for line in body.splitlines() if "v2 on the GPU" not in line)  # the peer's row and check
    assert "GPU" not in body, body
    notes = {r["variant"]: r["note"] for r in report.to_dict()["results"]}
    assert "in order; NumPy images on the host" in notes["sequence"]
    assert "planning in the main process" in notes["detaug"] and "planning in the main process" in notes["detaug-list"]
    gpu_notes = {r["variant"]: r["note"] for r in _fake_report("gpu").to_dict()["results"]}
    assert "prepared ahead; images on the GPU" in gpu_notes["sequence"] and "GPU MiB" in _fake_report("gpu").format()


def test_the_cpu_notes_are_the_adapters_cpu_defaults(bench_data):
    """What the CPU notes say: the loader plans in the main process, the Sequence runs 1 thread
    and returns NumPy images."""
    keras = pytest.importorskip("keras")  # noqa: F841
    import detaug.transforms as T
    from detaug.keras import DetectionSequence
    from detaug.sources import CocoSource
    from detaug.torch import DetectionLoader

    source = CocoSource(bench_data.annotations_file, bench_data.images_dir)
    recipe = T.Compose([T.Resize((32, 32))])
    loader = DetectionLoader(source, recipe, 4, device="cpu")
    seq = DetectionSequence(source, recipe, batch_size=4, device="cpu")
    try:
        assert loader.num_workers == 0
        assert seq.workers == 1 and seq.images_on_device is False
    finally:
        loader.close()
        seq.close()


def test_missing_peers_name_the_extra_and_the_torch_pin():
    import torch

    text = _fake_report("cpu", missing=("torchvision", "albumentations")).format()
    assert f"albumentations missing: {PEERS_PIP}" in text and '-e ".[peers]"' in text
    base = torch.__version__.split("+")[0]
    assert f'torchvision missing or not loadable (it must be the build of your torch): python3 -m pip install torchvision "torch=={base}"' in text
    assert "missing" not in _fake_report("cpu").format()


def test_torchvision_pip_pins_the_installed_torch():
    assert torchvision_pip("2.13.0") == 'python3 -m pip install torchvision "torch==2.13.0"'
    assert torchvision_pip("2.11.0+cu130") == 'python3 -m pip install torchvision "torch==2.11.0"'
    cpu = torchvision_pip("2.13.0+cpu")
    assert cpu.startswith('python3 -m pip install torchvision "torch==2.13.0"') and "download.pytorch.org/whl/cpu" in cpu


def test_an_unavailable_peer_row_says_how_to_install_it(bench_data, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_albumentations(name, *args, **kwargs):
        if name == "albumentations":
            raise ImportError("No module named 'albumentations'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_albumentations)
    report = runner.run_bench(data=bench_data.root, device="cpu", only=["albumentations"], log=lambda m: None)
    row = report.result("albumentations")
    assert row.status == "unavailable" and PEERS_PIP in row.message


@pytest.mark.skipif(not os.environ.get("DETAUG_SLOW_TESTS"), reason="the full default CPU bench (~25 s on 2 cores): DETAUG_SLOW_TESTS=1")
def test_the_default_cpu_bench_takes_under_a_minute(tmp_path):
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "detaug.cli", "bench", "--device", "cpu", "--cache-dir", str(tmp_path),
         "--json", str(tmp_path / "b.json"), "--quiet"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "b.json").read_text())
    assert results["settings"]["threads"] == default_threads() and results["settings"]["workers"] == default_workers()
    if harness.available_cpus() <= 2:
        assert elapsed < 60, f"the default CPU bench took {elapsed:.0f} s"


# -- item 7: output that tells the truth ------------------------------------------------------------


def test_the_demo_says_which_split_it_converted(tmp_path, capsys):
    status, out, _ = run_cli(capsys, "demo", "--out", str(tmp_path / "demo"), "--num-images", "8", "--epochs", "1",
                             "--batch-size", "4", "--size", "64", "--device", "cpu")
    assert status == 0, out
    train = len((tmp_path / "demo/voc/ImageSets/Main/train.txt").read_text().split())
    val = len((tmp_path / "demo/voc/ImageSets/Main/val.txt").read_text().split())
    assert train + val == 8 and val > 0
    assert (f"2/4 converting the train split to COCO with voc2coco: {train} of the 8 images "
            f"(the generator splits them 75/25 into train and val; the {val} val images are held out") in out
    assert f"images:      {train} converted, 0 skipped, of {train}" in out
    assert "1 epoch of the train split, device cpu" in out
    assert json.loads((tmp_path / "demo/coco/train.json").read_text())["images"].__len__() == train


def _recorded_run() -> str:
    text = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    assert text.count("### The recorded run") == 1
    section = text.split("### The recorded run", 1)[1].split("\n## ", 1)[0]
    for field in ("- Host: ", "- Date: ", "- Command: `detaug bench`"):
        assert field in section
    return section


def test_the_readme_table_is_the_recorded_run():
    """Every img/s figure and raw-DALI ratio of the README's table is the one recorded run's."""
    section = _recorded_run()
    recorded = [float(x.replace(",", "")) for x in re.findall(r"^\S.*?\s([\d,]+\.\d)\s+[\d.]+x", section, re.MULTILINE)]
    readme = (ROOT / "README.md").read_text(encoding="utf-8").split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| [^|]+ \| [\d,]+ \| [\d.]+× \|.*$", readme, re.MULTILINE)
    assert len(rows) >= 6
    pairs = [pair for row in rows for pair in re.findall(r"\| ([\d,]+) \| ([\d.]+)× ", row)]
    assert len(pairs) >= len(rows)
    for rate, ratio in pairs:
        assert any(abs(r - int(rate.replace(",", ""))) <= 0.5 for r in recorded), f"{rate} img/s is not the recorded run's"
        assert f"{ratio}x" in section, f"{ratio}x is not the recorded run's"


def test_no_other_doc_quotes_its_own_throughput():
    """docs/keras.md (and every doc but benchmarks.md) refer to the recorded run instead of
    quoting figures of other runs."""
    for path in sorted((ROOT / "docs").glob("*.md")):
        if path.name == "benchmarks.md":
            continue
        found = re.findall(r"\d[\d,.]*\s*img/s|\d\.\d\dx the iterator", path.read_text(encoding="utf-8"))
        assert not found, f"{path.name} quotes {found}: refer to docs/benchmarks.md's recorded run"
    assert "benchmarks.md" in (ROOT / "docs/keras.md").read_text(encoding="utf-8")
