"""Every ``pip install`` line of README.md, docs/*.md and examples/*.py works as written and leaves
the installed torch as it is.

Each distinct line is resolved from the repository root (so ``-e .`` is this checkout) with
``python3 -m pip install --dry-run --report FILE --quiet ARGS`` against the package index, two
lines at a time (pip is CPU-bound while it reads the index); a line passes when pip resolves it
(every name found, no conflict) and torch is not in the report's install list, or, where no torch
is installed, only at the version the line pins. Nothing is cached between runs (pip's download
cache is not used either: ``--no-cache-dir``). The README's first set-up line is resolved as on a
fresh machine (the checkout's metadata built in an isolated environment); the other lines reuse
the installed setuptools (``--no-build-isolation``: the same requirements, ~2 s less each). The
module takes ~15 s on 2 cores with network access to the index (CI has it).

The unit tests at the top check the line extraction and the report check on fixed inputs, so
that the check itself can fail.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The files whose install lines a newcomer follows.
SOURCES = ("README.md", "docs/*.md", "examples/*.py")
#: ``[python3 -m ]pip[3] install ARGS``, ARGS up to the end of the code span or shell command.
PIP_INSTALL = re.compile(r"(?:\bpython3?(?:\.\d+)?\s+-m\s+)?\bpip3?\s+install\s+(?P<args>[^`#&;|\n]+)")
TIMEOUT_S = 240


# -- what the test checks -------------------------------------------------------------------------


def install_lines(text: str) -> list[str]:
    """The argument strings of every ``pip install`` command in ``text`` (markdown code spans and
    blocks, Python docstrings), in order, as written."""
    return [" ".join(m.group("args").split()) for m in PIP_INSTALL.finditer(text)]


def doc_install_lines(root: Path = ROOT) -> dict[str, list[str]]:
    """``{arguments: [where, ...]}`` for every install line of :data:`SOURCES` (``where`` is
    ``file:line``)."""
    found: dict[str, list[str]] = {}
    for pattern in SOURCES:
        for path in sorted(root.glob(pattern)):
            for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for args in install_lines(text):
                    found.setdefault(args, []).append(f"{path.relative_to(root)}:{number}")
    return found


def _base(version: str) -> str:
    """The release without a local label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]


def _pinned_torch(args: list[str]) -> str | None:
    for arg in args:
        m = re.fullmatch(r"torch\s*==\s*([0-9][^\s;,]*)", arg.strip())
        if m:
            return _base(m.group(1))
    return None


def torch_problem(report: dict, args: list[str], installed_torch: str | None) -> str | None:
    """Why the resolution of ``args`` (pip's ``--report`` dict) would change torch, or ``None``.

    With torch installed, the report must not install any torch (a reinstall of the same
    release would swap its build too); without one, only the release the line pins."""
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        if re.sub(r"[-_.]+", "-", str(meta.get("name", "")).lower()) != "torch":
            continue
        version = str(meta.get("version"))
        if installed_torch is not None:
            return f"would replace the installed torch {installed_torch} with torch {version}"
        pinned = _pinned_torch(args)
        if pinned is None or _base(version) != pinned:
            return f"would install torch {version}, which the line does not pin"
    return None


def installed_torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def setup_line(root: Path = ROOT) -> str | None:
    """The arguments of the README's first install line (the set-up a newcomer runs first)."""
    lines = install_lines((root / "README.md").read_text(encoding="utf-8"))
    return " ".join(lines[0].split()) if lines else None


def _setuptools_installed() -> bool:
    try:
        return int(metadata.version("setuptools").split(".")[0]) >= 64  # pyproject's build requirement
    except (metadata.PackageNotFoundError, ValueError):
        return False


def dry_run(args: list[str], workdir: Path, *, isolated: bool = True) -> tuple[int, str, dict | None]:
    """``(exit status, stderr, report)`` of ``pip install --dry-run --report`` for ``args``, run
    in :data:`ROOT`; ``isolated=False`` adds ``--no-build-isolation``."""
    fd, report_path = tempfile.mkstemp(suffix=".json", dir=workdir)
    os.close(fd)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--report", report_path, "--quiet",
               "--no-cache-dir", *([] if isolated else ["--no-build-isolation"]), *args]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"pip did not finish in {TIMEOUT_S} s", None
    report = None
    if done.returncode == 0:
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f)
    return done.returncode, done.stderr, report


# -- unit tests of the check ------------------------------------------------------------------------


def test_install_lines_are_cut_at_the_end_of_the_command():
    text = (
        'python3 -m pip install "torch==2.13.0" -e ".[test]" && python3 -m pytest -q\n'
        "Keras is optional: `pip install -e \".[keras]\"`.\n"
        'pip install globox==2.9.0        # only the benchmark uses it\n'
        "Needs ``pip install torchvision`` matching your torch; pip3 install a; b\n"
    )
    assert install_lines(text) == [
        '"torch==2.13.0" -e ".[test]"',
        '-e ".[keras]"',
        "globox==2.9.0",
        "torchvision",
        "a",
    ]
    assert install_lines("pip installs nothing; `pip list`") == []


@pytest.mark.parametrize(
    "report, args, installed, problem",
    [
        ({"install": [{"metadata": {"name": "detaug", "version": "0.1.0"}}]}, ["-e", "."], "2.13.0+cpu", None),
        ({"install": [{"metadata": {"name": "torchvision", "version": "0.29.1"}},
                      {"metadata": {"name": "torch", "version": "2.14.1"}}]},
         ["torchvision"], "2.13.0+cpu", "would replace the installed torch 2.13.0+cpu with torch 2.14.1"),
        ({"install": [{"metadata": {"name": "Torch", "version": "2.13.0"}}]},
         ["torch==2.13.0"], "2.13.0+cpu", "would replace"),
        ({"install": [{"metadata": {"name": "torch", "version": "2.13.0"}}]}, ["torch==2.13.0", "-e", "."], None, None),
        ({"install": [{"metadata": {"name": "torch", "version": "2.14.1"}}]}, ["-e", ".[keras]"], None,
         "would install torch 2.14.1, which the line does not pin"),
    ],
)
def test_torch_problem(report, args, installed, problem):
    found = torch_problem(report, args, installed)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_the_docs_have_install_lines():
    lines = doc_install_lines()
    assert any(where.startswith("README.md:") for places in lines.values() for where in places)
    assert setup_line() is not None and "-e" in shlex.split(setup_line())
    # the extras' lines of docs/keras.md and docs/benchmarks.md, from the clone
    assert '-e ".[keras]"' in lines and '-e ".[peers]"' in lines
    assert all("detaug[" not in args.replace(".[", "") for args in lines), "detaug is not on the index"


def test_no_extra_brings_torch():
    """The extras leave torch alone: none names torch or torchvision (torchvision must be the
    build of the installed torch, which only the command line can pin)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert {"keras", "test", "peers"} <= set(extras)
    for name, requirements in extras.items():
        for requirement in requirements:
            dist = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")
            assert dist not in ("torch", "torchvision", "torchaudio"), f"extra {name!r} brings {requirement}"
    assert any(r.startswith("albumentations") for r in extras["peers"])


# -- the docs' lines, resolved ------------------------------------------------------------------------


LINES = doc_install_lines()


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory) -> dict[str, tuple[int, str, dict | None]]:
    """Every distinct line resolved once, in parallel (pip spends most of its time waiting on the
    index)."""
    workdir = tmp_path_factory.mktemp("pip-reports")
    first, reuse = setup_line(), _setuptools_installed()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {args: pool.submit(dry_run, shlex.split(args), workdir, isolated=args == first or not reuse)
                   for args in LINES}
        return {args: future.result() for args, future in futures.items()}


@pytest.mark.parametrize("args", sorted(LINES), ids=lambda args: args[:60])
def test_install_line_resolves_and_keeps_torch(args, resolutions):
    where = ", ".join(LINES[args])
    status, stderr, report = resolutions[args]
    errors = "\n".join(line for line in stderr.splitlines() if "is ignored" not in line)
    assert status == 0, f"`pip install {args}` ({where}) does not resolve (exit {status}):\n{errors[-3000:]}"
    problem = torch_problem(report, shlex.split(args), installed_torch_version())
    assert problem is None, f"`pip install {args}` ({where}) {problem}"
