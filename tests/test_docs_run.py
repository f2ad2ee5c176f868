"""Every ```python block of README.md and docs/*.md runs as shipped, and so do the cheap ```bash
blocks (``voc2coco ...``, ``detaug recipe ...``).

How the blocks run:

* The blocks of one Markdown file run in order in one fresh Python process, as a reader follows
  the page from the top (a later block may use what an earlier one defined), each compiled with
  its file name and line numbers (a traceback points into the Markdown). CPU only: the process
  sees no GPU (``CUDA_VISIBLE_DEVICES=""``), so ``device="auto"`` is the CPU; Keras runs on its
  torch backend (``KERAS_BACKEND=torch``, as docs/keras.md's set-up line says).
* The working folder is a temporary copy of small generated datasets laid out where the docs
  expect them (:func:`write_doc_data`): ``VOCdevkit/VOC2007`` (``trainval``/``test``),
  ``VOCdevkit/VOC2012`` (``train``/``val``), ``my_dataset``, ``labels/`` + ``photos/`` and
  ``cvat_export/`` (VOC), ``annotations.json`` + ``images/`` and ``instances_train2017.json`` +
  ``train2017/`` (COCO), all from :mod:`detaug.synthetic`.
* :data:`PREAMBLE` runs first in each process. It defines only the three names the docs leave to
  the reader: ``source`` (your source: the generated ``VOCdevkit/VOC2007`` trainval split),
  ``recipe`` (your recipe: a flip and a resize to 64x64) and ``model`` (your Keras model: a
  stand-in whose ``fit`` / ``fit_generator`` read every batch of every epoch as Keras' do, calling
  the callbacks' ``on_epoch_begin``/``on_epoch_end`` and the sequence's ``on_epoch_end``, and train
  nothing). Nothing else: a block that forgets an import fails here as it would for a reader.
* docs/notes/ (:data:`LEFT_OUT`) is not run: it holds dated logs of what ran on a day's build
  and machine, not instructions to follow.
* A block preceded by ``<!-- no-run: why -->`` is not run (a benchmark that needs the GPU or data
  the repository does not hold, a fragment); :data:`NOT_RUN` pins how many each file has, so that
  they cannot grow silently. A block preceded by ``<!-- run-alone: why -->`` runs in a process
  of its own (after the preamble), for what must happen before anything else is imported.
* A ```bash block runs (``bash -e``, in the same kind of folder) when each of its commands starts
  with one of :data:`CHEAP_COMMANDS`; ``voc2coco`` and ``detaug`` are this checkout's
  (``python3 -m converters.cli`` / ``python3 -m detaug.cli``). The others (installs, benchmarks,
  ``torchrun``) are listed by :func:`test_which_bash_blocks_run`.

The unit tests at the top check the extraction on fixed text, so that the check itself can fail.
The module takes about two minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The pages whose blocks run.
SOURCES = ("README.md", "docs/*.md")
#: Pages deliberately left out: dated logs (docs/notes/) record what ran on a day's build and
#: machine (timing scripts on ../shared/realdata, GPU commands); they are not instructions.
LEFT_OUT = ("docs/notes/*.md",)
#: Blocks marked ``<!-- no-run: ... -->``, per file: change this only with the marker.
NOT_RUN = {
    "docs/keras.md": 1,  # the KerasHub RetinaNet fragment (`...` stands for the model's arguments)
}
#: A ```bash block runs when every command in it starts with one of these.
CHEAP_COMMANDS = ("voc2coco ", "detaug recipe ")
TIMEOUT_S = 600

FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_+-]*)[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--[ \t]*(?P<kind>no-run|run-alone)[ \t]*:[ \t]*(?P<why>(?:(?!-->)[^\n])*?)[ \t]*-->\s*\Z")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its file (relative to the repository), the line of its first code
    line, its language, its code, and its marker (``"no-run"``, ``"run-alone"`` or ``None``)
    with the reason given."""

    path: str
    line: int
    lang: str
    code: str
    marker: str | None = None
    why: str = ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def blocks_of(text: str, path: str = "<text>") -> list[Block]:
    """The fenced blocks of Markdown ``text``, each with the marker comment right before its
    fence (blank lines between allowed)."""
    found = []
    for m in FENCE.finditer(text):
        before = text[:m.start()]
        marker = MARKER.search(before[-500:])
        found.append(Block(path, before.count("\n") + 2, m.group("lang").lower(), m.group("code"),
                           marker.group("kind") if marker else None, marker.group("why") if marker else ""))
    return found


def doc_blocks(root: Path = ROOT) -> list[Block]:
    """Every fenced block of :data:`SOURCES`, in file order."""
    found = []
    for pattern in SOURCES:
        for path in sorted(root.glob(pattern)):
            found += blocks_of(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return found


def commands(code: str) -> list[str]:
    """The commands of a shell block: its lines without comments and blank lines, continuation
    lines (``\\``) joined."""
    joined = re.sub(r"\s*\\\n\s*", " ", code)
    lines = (line.split(" #", 1)[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_cheap(block: Block) -> bool:
    """Whether a shell block runs here: every command starts with one of :data:`CHEAP_COMMANDS`."""
    found = commands(block.code)
    return bool(found) and all(c.startswith(CHEAP_COMMANDS) for c in found)


# -- unit tests of the extraction -------------------------------------------------------------------


def test_blocks_and_markers_are_extracted():
    text = textwrap.dedent("""\
        # Title

        ```python
        a = 1
        ```

        <!-- no-run: needs a GPU -->
        ```python
        b = 2
        ```
        text <!-- no-run: not before a fence --> more

        ```bash
        voc2coco x -o y.json   # a comment
        ```
        <!-- run-alone: sets an environment variable first -->

        ```python
        import os
        ```
        """)
    blocks = blocks_of(text, "page.md")
    assert [(b.line, b.lang, b.marker) for b in blocks] == [(4, "python", None), (9, "python", "no-run"),
                                                            (14, "bash", None), (19, "python", "run-alone")]
    assert blocks[0].code == "a = 1\n" and blocks[1].why == "needs a GPU"
    assert is_cheap(blocks[2]) and not is_cheap(Block("p", 1, "bash", "pip install x && voc2coco a\n"))
    assert commands("a \\\n  b  # c\n# d\n\ne\n") == ["a b", "e"]


def test_the_not_run_blocks_are_the_pinned_ones():
    """The blocks marked ``no-run``, per file, are exactly :data:`NOT_RUN`'s count (each with a
    reason): a new one is a deliberate change of this file too."""
    marked: dict[str, int] = {}
    for block in doc_blocks():
        if block.marker == "no-run" and block.lang == "python":
            assert block.why, f"{block.where}: a no-run marker needs its reason"
            marked[block.path] = marked.get(block.path, 0) + 1
    assert marked == NOT_RUN


def test_the_left_out_pages_are_logs_only():
    """docs/notes/ is left out on purpose (:data:`LEFT_OUT`), and only it: every other Markdown
    page of docs/ is one of :data:`SOURCES`."""
    run = {b.path for b in doc_blocks()}
    left_out = {str(p.relative_to(ROOT)) for pattern in LEFT_OUT for p in ROOT.glob(pattern)}
    assert not run & left_out
    pages = {str(p.relative_to(ROOT)) for p in ROOT.glob("docs/**/*.md")}
    covered = {str(p.relative_to(ROOT)) for pattern in SOURCES for p in ROOT.glob(pattern)}
    assert pages - covered == left_out, f"pages neither run nor left out: {sorted(pages - covered - left_out)}"


def test_which_bash_blocks_run():
    blocks = [b for b in doc_blocks() if b.lang in ("bash", "sh", "shell", "console")]
    run = [b.where for b in blocks if is_cheap(b)]
    not_run = [f"{b.where}: {commands(b.code)[0][:60]}" for b in blocks if not is_cheap(b)]
    print("bash blocks run:", *run, "not run:", *not_run, sep="\n  ")
    assert any(where.startswith("README.md:") for where in run)


# -- the data the docs name ----------------------------------------------------------------------------

#: A small VOC set size: enough images for ``seq[3]`` at batch 16 in VOC2007 trainval and VOC2012 train.
VOC_IMAGES = 72
IMAGE_SIZE = ((96, 160), (80, 128))


def write_doc_data(root: Path) -> None:
    """The datasets the docs' blocks read, generated into ``root`` (see the module docstring)."""
    from detaug.synthetic import DEFAULT_CLASSES, write_coco_dataset, write_voc_dataset

    voc2007 = root / "VOCdevkit" / "VOC2007"
    write_voc_dataset(voc2007, num_images=VOC_IMAGES, size=IMAGE_SIZE, max_objects=4,
                      splits={"trainval": 0.8, "test": 0.2}, seed=1)
    write_voc_dataset(root / "VOCdevkit" / "VOC2012", num_images=VOC_IMAGES, size=IMAGE_SIZE, max_objects=4,
                      splits={"train": 0.8, "val": 0.2}, seed=2)
    shutil.copytree(voc2007, root / "my_dataset")
    shutil.copytree(voc2007 / "Annotations", root / "labels")
    shutil.copytree(voc2007 / "JPEGImages", root / "photos")
    shutil.copytree(voc2007, root / "cvat_export")
    (root / "cvat_export" / "labelmap.txt").write_text(
        "# label:color_rgb:parts:actions\n" + "".join(f"{name}:{40 * k},0,0::\n" for k, name in enumerate(DEFAULT_CLASSES)))
    write_coco_dataset(root, num_images=8, size=IMAGE_SIZE, max_objects=4, progress=False, seed=3)
    coco = root / "coco2017"
    write_coco_dataset(coco, num_images=8, size=IMAGE_SIZE, max_objects=4, progress=False, seed=4)
    (coco / "annotations.json").rename(root / "instances_train2017.json")
    (coco / "images").rename(root / "train2017")
    coco.rmdir()


@pytest.fixture(scope="module")
def doc_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("doc-data")
    write_doc_data(root)
    return root


def workdir(doc_data: Path, tmp_path: Path) -> Path:
    """A fresh copy of the data, for blocks that write beside it."""
    cwd = tmp_path / "cwd"
    shutil.copytree(doc_data, cwd, symlinks=True)
    return cwd


def environment(tmp_path: Path) -> dict[str, str]:
    """This checkout first on ``PYTHONPATH`` and its commands first on ``PATH``; no GPU; Keras on torch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, module in (("voc2coco", "converters.cli"), ("detaug", "detaug.cli")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        script.chmod(0o755)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]), "CUDA_VISIBLE_DEVICES": "",
            "KERAS_BACKEND": "torch", "MPLBACKEND": "Agg", "TF_CPP_MIN_LOG_LEVEL": "2"}


# -- running the blocks ----------------------------------------------------------------------------------

PREAMBLE = '''
# tests/test_docs_run.py: what the docs leave to the reader (their source, recipe and Keras model)
import random as _random

import detaug.transforms as _T
from detaug.sources import VocSource as _VocSource

source = _VocSource("VOCdevkit/VOC2007", "trainval")
recipe = _T.Compose([_T.RandomHorizontalFlip(), _T.Resize((64, 64))])


class _StandInModel:
    """Reads its data as Keras' fit does and trains nothing: per epoch the callbacks'
    on_epoch_begin, every batch (in order with shuffle=False, else shuffled: a Sequence; the next
    steps_per_epoch items: any other iterable), the sequence's on_epoch_end, the callbacks'
    on_epoch_end."""

    def __init__(self):
        self.batches = 0

    def fit(self, x, epochs=1, steps_per_epoch=None, callbacks=(), shuffle=True, initial_epoch=0, **_):
        iterator = None
        for epoch in range(initial_epoch, epochs):
            for callback in callbacks or ():
                callback.on_epoch_begin(epoch)
            if hasattr(x, "__getitem__") and hasattr(x, "__len__"):
                order = list(range(len(x)))[:steps_per_epoch]
                if shuffle:
                    _random.Random(epoch).shuffle(order)
                for i in order:
                    x[i]
                    self.batches += 1
                if hasattr(x, "on_epoch_end"):
                    x.on_epoch_end()
            else:
                iterator = iter(x) if iterator is None else iterator
                for _ in range(steps_per_epoch):
                    next(iterator)
                    self.batches += 1
            for callback in callbacks or ():
                callback.on_epoch_end(epoch)
        assert self.batches > 0, "fit read no batch"

    fit_generator = fit


model = _StandInModel()
'''

RUNNER = '''
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for where, line, code in blocks:
    try:
        exec(compile("\\n" * (line - 1) + code, where.split(":")[0], "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print("BLOCK FAILED", where, flush=True)
        sys.exit(1)
    print("BLOCK OK", where, flush=True)
'''


def run_python(blocks: list[tuple[str, int, str]], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``(where, line, code)`` blocks in order in one process in ``cwd``."""
    return subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _groups(path: str) -> list[list[Block]]:
    """The runnable python blocks of ``path``: one group per process (the file's blocks together,
    each ``run-alone`` block by itself)."""
    shared: list[Block] = []
    alone: list[list[Block]] = []
    for block in doc_blocks():
        if block.path != path or block.lang != "python" or block.marker == "no-run":
            continue
        (alone.append([block]) if block.marker == "run-alone" else shared.append(block))
    return ([shared] if shared else []) + alone


PAGES = sorted({b.path for b in doc_blocks() if b.lang == "python" and b.marker != "no-run"})


@pytest.mark.parametrize("path", PAGES)
def test_python_blocks_run(path, doc_data, tmp_path):
    env = environment(tmp_path)
    for k, group in enumerate(_groups(path)):
        cwd = workdir(doc_data, tmp_path / str(k))
        todo = [("<preamble>:1", 1, PREAMBLE)] + [(b.where, b.line, b.code) for b in group]
        done = run_python(todo, cwd, env)
        ran = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("BLOCK OK")]
        assert done.returncode == 0 and ran == [where for where, _, _ in todo], (
            f"{path}: blocks {', '.join(b.where for b in group)}; ran {ran}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-5000:]}")


@pytest.mark.parametrize("where", [b.where for b in doc_blocks() if b.lang in ("bash", "sh") and is_cheap(b)])
def test_cheap_bash_blocks_run(where, doc_data, tmp_path):
    block = next(b for b in doc_blocks() if b.where == where)
    cwd = workdir(doc_data, tmp_path)
    done = subprocess.run(["bash", "-e", "-c", block.code], cwd=cwd, env=environment(tmp_path),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{where}:\n{block.code}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


# -- what the docs say of the presets ------------------------------------------------------------------------


def test_presets_page_states_the_fill_the_presets_use():
    """docs/presets.md's table gives each preset's fill as the recipe has it."""
    from detaug.transforms.presets import preset

    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", (ROOT / "docs/presets.md").read_text(), re.M)}
    for name in ("lsj", "ssd"):
        fills = {float(t.fill) for t in preset(name).transforms if getattr(t, "reveals", False)}  # what paints the fill
        detaug_column = rows[name].rsplit("|", 2)[-2]
        stated = {float(v) for v in re.findall(r"fill=([0-9.]+)", detaug_column)}
        assert stated and stated == fills, f"docs/presets.md says fill {stated} for {name!r}; the preset fills {fills}"
