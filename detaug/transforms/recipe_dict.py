"""A recipe's plain-dict form read back: its own fields (:data:`RECIPE_SCHEMA`), a recipe built
from a dict with every problem located (:func:`recipe_from_dict`, what
:meth:`Compose.from_dict <detaug.transforms.compose.Compose.from_dict>` runs), and the lines of
the parts of a recipe text (:func:`recipe_lines`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from detaug.errors import RecipeError
from detaug.transforms.composition import entry_lines, entry_transform, field_path
from detaug.transforms.schema import Param, closest

__all__ = ["RECIPE_SCHEMA", "recipe_from_dict", "recipe_lines"]

#: The recipe's own fields (besides ``transforms``).
RECIPE_SCHEMA = (
    Param("min_size", "number", 1.0, "boxes narrower or lower than this many output pixels are removed", low=0),
    Param("min_visibility", "probability", 0.0, "boxes with less than this share of their area visible are removed"),
)


def recipe_from_dict(cls: Any, recipe: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                     lines: Mapping[tuple, int] | None = None, file: str | None = None) -> Any:
    """``cls`` (``Compose``) built from :meth:`~detaug.transforms.compose.Compose.to_dict`'s format
    (also accepts a bare list of transforms): see
    :meth:`~detaug.transforms.compose.Compose.from_dict`."""
    lines = lines or {}

    def fail(problem: str, *, where: tuple, transform: str | None = None, field: str | None = None,
             index: int | None = None) -> RecipeError:
        return RecipeError(problem, transform=transform, field=field, index=index, line=_line(lines, where), file=file)

    if isinstance(recipe, (list, tuple)):
        recipe = {"transforms": recipe}
    if not isinstance(recipe, Mapping):
        raise fail(f"a recipe is a mapping with a 'transforms' list, got {type(recipe).__name__}", where=())
    known = ["transforms"] + [p.name for p in RECIPE_SCHEMA] + ["keypoint_flip_pairs", "schedule",
                                                                "boxes_from_masks"]
    for key in recipe:
        if key not in known:
            raise fail(f"unknown recipe key{closest(key, known)}; known: {', '.join(known)}", where=(key,), field=str(key))
    specs = recipe.get("transforms", [])
    if not isinstance(specs, (list, tuple)):
        raise fail(f"'transforms' must be a list of transforms, got {type(specs).__name__}", where=("transforms",))
    transforms = []
    for i, spec in enumerate(specs):
        here = ("transforms", i)
        if not isinstance(spec, Mapping):
            raise fail(f"an entry is a mapping with a 'name', got {spec!r}", where=here, index=i)
        kind, fields = entry_transform(
            spec, lambda problem, at_name: fail(problem, where=here + (("name",) if at_name else ()), index=i))
        try:
            transforms.append(kind(**fields))
        except RecipeError as err:
            path = field_path(err.field)
            where = here + path if path and path[0] in fields else here
            raise err.located(index=i, line=_line(lines, where), file=file) from None
    if not isinstance(recipe.get("boxes_from_masks", False), bool):
        raise fail(f"boxes_from_masks must be true or false, got {recipe['boxes_from_masks']!r:.40}",
                   where=("boxes_from_masks",), field="boxes_from_masks")
    try:
        return cls(transforms, **{p.name: recipe.get(p.name, p.default) for p in RECIPE_SCHEMA},
                   keypoint_flip_pairs=recipe.get("keypoint_flip_pairs", ()), schedule=recipe.get("schedule"),
                   boxes_from_masks=recipe.get("boxes_from_masks", False))
    except RecipeError as err:
        where = (tuple(err.field.split(".")) if err.field  # schedule.<transform>.<field>: the schedule's line
                 else ("transforms", err.index) if err.index is not None else ())
        raise err.located(line=_line(lines, where), file=file) from None


def recipe_lines(text: str) -> dict[tuple, int]:
    """1-based line of each part of a YAML or JSON recipe text: keys ``(key,)`` for the recipe's
    own keys, ``("transforms", i)`` for an entry, ``("transforms", i, field)`` for a field of it.
    Empty when the text does not parse (its syntax error is reported elsewhere)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[tuple, int] = {}
    entries = None
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            out[(key.value,)] = key.start_mark.line + 1
            if key.value == "transforms":
                entries = value
    elif isinstance(root, yaml.SequenceNode):
        entries = root
    if isinstance(entries, yaml.SequenceNode):
        for i, entry in enumerate(entries.value):
            entry_lines(entry, ("transforms", i), out)
    return out


def _line(lines: Mapping[tuple, int], where: tuple) -> int | None:
    """The line of ``where`` or of its nearest enclosing part."""
    while where:
        if where in lines:
            return lines[where]
        where = where[:-1]
    return None
