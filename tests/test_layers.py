"""The import graph of detaug/ and converters/: no circles, and no module importing a higher layer.

:data:`LAYERS` is the one place the layer order is written down, bottom first. A module may import
modules of its own layer and of the layers below it, never of a layer above; in a layer marked
independent (the transform families) no module imports another of that layer. Every module must
belong to a layer: a new module is placed here, by its name or by a ``prefix.*`` pattern (an exact
name wins over a pattern, a longer pattern over a shorter one).

The imports are read with the standard library's :mod:`ast`, every one of them: at module level
and inside functions or methods (a call-time import is an import all the same), except those
under ``if TYPE_CHECKING:`` (annotations only). ``from a.b import c`` imports the module
``a.b.c`` where there is one, else ``a.b``; ``import a.b.c`` imports ``a.b.c``.

:data:`KNOWN_EXCEPTIONS` lists the import arrows not fixed yet (issue 40), each with its reason;
the test fails when one of them is gone, so that it is removed from the list too.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("detaug", "converters")


@dataclass(frozen=True)
class Layer:
    """One layer: its name, what it holds, its modules (names or ``prefix.*`` patterns)."""

    name: str
    holds: str
    modules: tuple[str, ...]
    independent: bool = False


#: The layers, bottom first.
LAYERS: tuple[Layer, ...] = (
    Layer("foundations", "errors, random keys, box kernels, worker processes, the DALI-to-framework hand-over, "
          "the training loop's CUDA stream, a loader's process, finding an MPS daemon, "
          "generated data, the shared command-line helpers",
          ("detaug", "detaug.arrays", "detaug.errors", "detaug.seeds", "detaug.boxes", "detaug.keypoints", "detaug.rotated", "detaug.masks",
           "detaug.plan", "detaug.plan_layout", "detaug.decode_regions", "detaug.labels", "detaug.epochs",
           "detaug.decoding", "detaug.main_pickles", "detaug.spawning", "detaug.worker_payload",
           "detaug.pool_stop", "detaug.sigterm", "detaug.workers", "detaug.shared_arrays", "detaug.handover", "detaug.feeder", "detaug.process_feed", "detaug.streams", "detaug.mps",
           "detaug.synthetic", "detaug.synthetic_scenes", "detaug.synthetic_voc",
           "detaug.synthetic_coco", "detaug.preview", "detaug.cli_support")),
    Layer("formats", "reading and checking files: images, COCO, box formats, columnar caches",
          ("detaug.formats", "detaug.formats.*")),
    Layer("converters", "voc2coco", ("converters", "converters.*")),
    Layer("sources", "datasets: COCO, VOC, sample lists, shards; choosing one from arguments",
          ("detaug.sample_checks", "detaug.sample_list", "detaug.sources", "detaug.shards",
           "detaug.shard_manifest", "detaug.shard_writer", "detaug.shards_cli", "detaug.source_args")),
    Layer("engine", "the batch planner, planning ahead in workers, the DALI pipeline, the loader core, eager calls; "
          "they read a recipe through its methods",
          ("detaug.batch_plan", "detaug.field_selection", "detaug.sample_rows", "detaug.planned_batch", "detaug.gathered",
           "detaug.decoded_shapes", "detaug.decode_failures", "detaug.planning", "detaug.plan_jobs",
           "detaug.plan_ahead", "detaug.pipeline", "detaug.pipeline_runs", "detaug.loader_core", "detaug.eager")),
    Layer("transform schema", "parameters and their checks", ("detaug.transforms.schema", "detaug.transforms.params")),
    Layer("transform base", "the base classes and the registry; the mixing kind's base classes",
          ("detaug.transforms.base", "detaug.transforms.mixing")),
    Layer("transform families", "one module per family of transforms", ("detaug.transforms.*",), independent=True),
    Layer("recipe", "Compose, its dict form read back and its epoch schedule",
          ("detaug.transforms.compose", "detaug.transforms.recipe_dict", "detaug.transforms.schedule")),
    Layer("presets", "named recipes", ("detaug.transforms.presets",)),
    Layer("transforms package", "detaug.transforms and its docs table", ("detaug.transforms", "detaug.transforms.table")),
    Layer("frameworks", "the PyTorch and Keras loaders", ("detaug.torch", "detaug.keras", "detaug.keras.*",
                                                          "detaug.keras_data")),
    Layer("bench", "detaug bench", ("detaug.bench", "detaug.bench.*")),
    Layer("commands", "the command lines", ("detaug.cli", "converters.cli")),
)

#: ``(importer, imported)``: arrows not fixed yet, with the reason; remove one once it is fixed.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def module_files() -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of :data:`PACKAGES`."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """``(module name, line)`` of every import of module ``name`` (at any depth, outside
    ``if TYPE_CHECKING:``); names outside :data:`PACKAGES` are kept as written."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_node(other)
            else:
                visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in modules else base, node.lineno))
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module of PACKAGES: first line}}`` (a module's own name left out)."""
    modules = module_files()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in imported_names(name, path, modules):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of ``module``'s layer; ``None`` when no layer names it."""
    best: tuple[int, int] | None = None  # (specificity, layer index)
    for index, layer in enumerate(LAYERS):
        for entry in layer.modules:
            if entry == module:
                return index
            if entry.endswith(".*") and fnmatch.fnmatchcase(module, entry):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), index)
    return None if best is None else best[1]


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _without_exceptions(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {a: {b: line for b, line in edges.items() if (a, b) not in KNOWN_EXCEPTIONS} for a, edges in graph.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph()


def test_every_module_has_a_layer(graph):
    assert [m for m in graph if layer_of(m) is None] == [], "place these modules in LAYERS (tests/test_layers.py)"


def test_no_import_circles(graph):
    found = circles(_without_exceptions(graph))
    assert found == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_imports_a_higher_layer(graph):
    wrong = []
    for importer, edges in _without_exceptions(graph).items():
        low = layer_of(importer)
        for imported, line in sorted(edges.items()):
            high = layer_of(imported)
            if low is None or high is None:
                continue  # test_every_module_has_a_layer
            if high > low:
                wrong.append(f"{importer}:{line} imports {imported} ({LAYERS[low].name} below {LAYERS[high].name})")
            elif high == low and LAYERS[low].independent:
                wrong.append(f"{importer}:{line} imports {imported} (both of the independent layer {LAYERS[low].name})")
    assert wrong == [], "imports against the layer order of tests/test_layers.py:\n" + "\n".join(wrong)


def test_known_exceptions_still_exist(graph):
    gone = [f"{a} -> {b}" for a, b in KNOWN_EXCEPTIONS if b not in graph.get(a, {})]
    assert gone == [], f"fixed: remove these from KNOWN_EXCEPTIONS in tests/test_layers.py: {gone}"


def test_the_reader_sees_every_kind_of_import(tmp_path):
    """Function-level and relative imports count; ``if TYPE_CHECKING:`` ones do not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("")
    source = package / "high.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "from . import low\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.other import Thing\n"
        "else:\n"
        "    import pkg.fallback\n"
        "def f():\n"
        "    from pkg.deep import name\n"
        "class C:\n"
        "    def m(self):\n"
        "        import pkg.method\n"
    )
    modules = {"pkg": package / "__init__.py", "pkg.low": package / "low.py", "pkg.high": source}
    names = [n for n, _ in imported_names("pkg.high", source, modules)]
    assert names == ["typing", "os", "pkg.low", "pkg.fallback", "pkg.deep", "pkg.method"]
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert layer_of("detaug.transforms.compose") > layer_of("detaug.transforms.flip") > layer_of("detaug.boxes")
