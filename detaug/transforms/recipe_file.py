"""Reading recipe text and files safely: every problem a :class:`~detaug.errors.RecipeError`
naming the file and the line.

A recipe file is untrusted input (docs/security.md). Before anything is built from it:

* its size is at most :data:`MAX_RECIPE_BYTES` (a recipe is a few hundred bytes);
* YAML is composed into its node graph first (no Python object yet), and refused when it uses
  a tag that is not plain YAML (``!!python/object/apply:...`` and the like: the safe loader
  has no constructor for them), or when it would expand, aliases counted each time they are
  used, to more than :data:`MAX_RECIPE_NODES` values or nest deeper than
  :data:`MAX_RECIPE_DEPTH` (a 608-byte file of aliases nested seven deep expands to millions
  of entries: refused in milliseconds instead of minutes and gigabytes);
* JSON is parsed by ``json`` (which has no aliases), nesting bounded the same way.

:func:`load_recipe_data` gives the parsed data; :func:`read_recipe_file` reads a file (the
suffix decides: ``.yaml``/``.yml`` YAML, anything else JSON) and gives the data and the text
(for :func:`~detaug.transforms.recipe_dict.recipe_lines`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from detaug.errors import RecipeError

__all__ = ["MAX_RECIPE_BYTES", "MAX_RECIPE_DEPTH", "MAX_RECIPE_NODES", "load_recipe_data", "read_recipe_file",
           "safe_yaml_load"]

#: Largest recipe file or text read (bytes).
MAX_RECIPE_BYTES = 1 << 20
#: Most values a YAML recipe may expand to (each use of an alias counts its whole value again).
MAX_RECIPE_NODES = 100_000
#: Deepest nesting of lists and mappings in a recipe.
MAX_RECIPE_DEPTH = 64


def _check_size(nbytes: int, file: str | None) -> None:
    if nbytes > MAX_RECIPE_BYTES:
        raise RecipeError(f"{nbytes} bytes: a recipe file is at most {MAX_RECIPE_BYTES} bytes "
                          "(detaug.transforms.recipe_file.MAX_RECIPE_BYTES)", file=file)


def safe_yaml_load(text: str, *, file: str | None = None) -> Any:
    """The data of YAML ``text`` by the rules of the module docstring. A syntax error is raised
    as PyYAML's ``MarkedYAMLError`` (the caller words it); a size beyond the cap, a tag that is
    not plain YAML, too many values after alias expansion or too deep a nesting raise
    :class:`RecipeError` naming ``file`` and the line."""
    import yaml

    _check_size(len(text.encode("utf-8", "surrogatepass")), file)
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise RecipeError(f"nested deeper than Python can parse (at most {MAX_RECIPE_DEPTH} levels)",
                              file=file) from None
        if node is None:
            return None
        _check_nodes(node, loader, file)
        try:
            return loader.construct_document(node)
        except yaml.constructor.ConstructorError as err:
            mark = err.problem_mark or err.context_mark
            raise RecipeError(" ".join(str(err.problem or err).split()), file=file,
                              line=mark.line + 1 if mark is not None else None) from None
    finally:
        loader.dispose()


def _check_nodes(root: Any, loader: Any, file: str | None) -> None:
    """Walk the node graph once (shared nodes once): every tag has a safe constructor, the
    expanded count of values stays under :data:`MAX_RECIPE_NODES` and the depth under
    :data:`MAX_RECIPE_DEPTH`."""
    import yaml

    known = {tag for tag in type(loader).yaml_constructors if tag is not None}
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        line = node.start_mark.line + 1
        if done:
            on_path.discard(key)
            children = _children(node)
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_RECIPE_NODES:
                raise RecipeError(f"expands to more than {MAX_RECIPE_NODES} values (YAML aliases used over and "
                                  "over: a recipe is refused beyond detaug.transforms.recipe_file.MAX_RECIPE_NODES)",
                                  file=file, line=line)
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise RecipeError("a YAML alias refers to the value that holds it (a recursive structure)",
                              file=file, line=line)
        if node.tag not in known:
            raise RecipeError(f"the YAML tag {node.tag!r} is not allowed: a recipe holds plain YAML (mappings, "
                              "lists, strings, numbers, booleans, null)", file=file, line=line)
        if depth > MAX_RECIPE_DEPTH:
            raise RecipeError(f"nested deeper than {MAX_RECIPE_DEPTH} levels", file=file, line=line)
        on_path.add(key)
        stack.append((node, depth, True))
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            stack.extend((c, depth + 1, False) for c in _children(node))


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_recipe_data(text: str, *, kind: str = "yaml", file: str | None = None) -> Any:
    """The data of a recipe ``text`` (``kind``: ``"yaml"`` or ``"json"``); every problem,
    syntax errors included, a :class:`RecipeError` naming ``file`` and the line."""
    if kind == "json":
        _check_size(len(text.encode("utf-8", "surrogatepass")), file)
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise RecipeError(f"column {err.colno}: JSON syntax error: {err.msg}", file=file, line=err.lineno) from None
        except RecursionError:
            raise RecipeError(f"nested deeper than Python can parse (at most {MAX_RECIPE_DEPTH} levels)",
                              file=file) from None
        except ValueError as err:
            raise RecipeError(f"JSON error: {err}", file=file) from None
    import yaml

    try:
        return safe_yaml_load(text, file=file)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        problem = err.problem or err.context or "cannot parse"
        raise RecipeError(f"YAML syntax error: {problem}" + (f" (column {mark.column + 1})" if mark else ""),
                          file=file, line=mark.line + 1 if mark is not None else None) from None
    except yaml.YAMLError as err:
        raise RecipeError(f"YAML error: {' '.join(str(err).split())}", file=file) from None


def read_recipe_file(path: str | os.PathLike) -> tuple[Any, str]:
    """``(data, text)`` of a recipe file (``.yaml``/``.yml``: YAML, else JSON). ``OSError``
    (e.g. ``FileNotFoundError``) passes through; everything about the content is a
    :class:`RecipeError` naming the file (and the line)."""
    path = Path(path)
    file = str(path)
    with open(path, "rb") as f:
        _check_size(os.fstat(f.fileno()).st_size, file)
        raw = f.read(MAX_RECIPE_BYTES + 1)
    _check_size(len(raw), file)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(f"not UTF-8 text (byte {err.start}); a recipe is YAML or JSON text", file=file) from None
    kind = "yaml" if path.suffix.lower() in (".yaml", ".yml") else "json"
    return load_recipe_data(text, kind=kind, file=file), text
