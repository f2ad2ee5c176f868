"""The recipe, the batch planner and the pipeline ask transforms, never test their types (issue 40).

``Compose`` (transforms/compose.py), the batch planner (batch_plan.py, planning.py, with the plan
layout and the decode regions) and the DALI pipeline (pipeline.py) read a recipe through its
transforms' attributes and methods (``kind``, ``stage``, ``plan``, ``plan_fields``, ``dali``...):
their code names no transform class, neither in an import, an ``isinstance`` nor an attribute.
Read with the standard library's :mod:`ast` (identifiers only: docstrings and comments may name
a transform as an example).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import detaug.transforms as T
from detaug.transforms import base

ROOT = Path(__file__).resolve().parents[2]
#: The modules that must name no transform class.
READERS = ("detaug/transforms/compose.py", "detaug/transforms/recipe_dict.py", "detaug/batch_plan.py",
           "detaug/planning.py", "detaug/gathered.py", "detaug/planned_batch.py", "detaug/field_selection.py",
           "detaug/decoded_shapes.py", "detaug/decode_failures.py", "detaug/plan_jobs.py", "detaug/pipeline.py",
           "detaug/plan_layout.py", "detaug/decode_regions.py", "detaug/plan.py")
#: The interface: the base classes a reader may name (annotations, the ``Transform`` check).
INTERFACE = {"Transform", "GeometricTransform", "PhotometricTransform", "OutputTransform"}


def transform_classes() -> set[str]:
    """Names of every transform class of :mod:`detaug.transforms` but the base classes."""
    names = set(T.TRANSFORMS)
    for _, module in inspect.getmembers(T, inspect.ismodule):
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, base.Transform) and obj.__module__.startswith("detaug.transforms"):
                names.add(name)
    return names - INTERFACE


def identifiers(source: str) -> dict[str, int]:
    """``{identifier: first line}`` of every name, attribute and imported name of ``source``."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.setdefault(node.id, node.lineno)
        elif isinstance(node, ast.Attribute):
            found.setdefault(node.attr, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found.setdefault(alias.name.rpartition(".")[2], node.lineno)
                if alias.asname:
                    found.setdefault(alias.asname, node.lineno)
    return found


def test_the_reader_sees_a_type_test_an_import_and_an_attribute():
    code = ("from detaug.transforms.blend import MixUp\n"
            "import detaug.transforms as T\n"
            "def f(t):\n"
            "    '''Mosaic in a docstring is fine.'''\n"
            "    return isinstance(t, MixUp) or type(t) is T.Mosaic  # RandomAffine in a comment too\n")
    names = set(identifiers(code)) & transform_classes()
    assert names == {"MixUp", "Mosaic"}
    assert {"Mosaic", "MixUp", "MixingTransform", "RandomAffine", "Normalize", "OneOf"} <= transform_classes()


@pytest.mark.parametrize("path", READERS)
def test_module_names_no_transform_class(path):
    found = identifiers((ROOT / path).read_text(encoding="utf-8"))
    named = sorted((line, name) for name, line in found.items() if name in transform_classes())
    assert named == [], f"{path} names transform classes (line, name): {named}; ask the transform instead"
