"""Recipe schemas: every transform's fields are checked by type and range, errors name the
transform, the field and the line, and every registered transform round-trips."""

from __future__ import annotations

import inspect
import json

import pytest

import detaug.transforms as T
from detaug import RecipeError
from detaug.transforms import TRANSFORMS, Compose
from detaug.transforms.schema import REQUIRED

#: The smallest valid arguments of transforms that have required fields.
REQUIRED_ARGS = {"RandomResizedCrop": {"size": 64}, "Resize": {"size": 64}, "LetterBox": {"size": 64},
                 "RandomRotation": {"degrees": 10},
                 "RandomCrop": {"size": 32}, "CenterCrop": {"size": 32}, "FixedSizeCrop": {"size": 32},
                 "Pad": {"padding": 4}, "ScaleJitter": {"target_size": 64}, "RandomShortestSize": {"min_size": 32},
                 "GaussianBlur": {"kernel_size": 3}, "Mosaic": {"size": 64},
                 "OneOf": {"transforms": [{"name": "RandomHorizontalFlip"}]},
                 "RandomChoice": {"transforms": [{"name": "RandomHorizontalFlip"}]},
                 "RandomApply": {"transforms": [{"name": "RandomHorizontalFlip"}]},
                 "SomeOf": {"transforms": [{"name": "RandomHorizontalFlip"}]}}


def minimal(name: str) -> dict:
    cls = TRANSFORMS[name]
    args = {}
    for p in cls.schema:
        if p.default is REQUIRED:
            assert name in REQUIRED_ARGS, f"{name}.{p.name} is required: add it to REQUIRED_ARGS"
            args[p.name] = REQUIRED_ARGS[name][p.name]
    return args


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_every_transform_round_trips_through_dict_yaml_and_json(name):
    t = TRANSFORMS[name](**minimal(name))
    assert TRANSFORMS[name](**{k: v for k, v in t.to_dict().items() if k != "name"}) == t
    if t.kind == "output":
        recipe = Compose([T.RandomHorizontalFlip(), t])
    elif getattr(t, "stage", None) == "blend":  # MixUp, CutMix: need a fixed canvas before them
        recipe = Compose([T.Resize((64, 64)), t])
    else:
        recipe = Compose([t])
    assert Compose.from_yaml(recipe.to_yaml()) == recipe
    assert Compose.from_json(recipe.to_json()) == recipe
    assert list(inspect.signature(type(t)).parameters) == [p.name for p in t.schema]


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_a_string_is_never_taken_for_a_number_or_a_flag(name):
    cls = TRANSFORMS[name]
    for p in cls.schema:
        if p.kind in ("number", "int", "probability", "range", "size", "numbers", "bool"):
            with pytest.raises(RecipeError) as err:
                cls(**{**minimal(name), p.name: "15" if p.kind != "bool" else "no"})
            assert (err.value.transform, err.value.field) == (name, p.name)
            assert "the string" in str(err.value)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"name": "RandomAffine", "degrees": "15"}, r"RandomAffine\.degrees: expected a number v >= 0 .* got the string '15'"),
        ({"name": "RandomRotation", "degrees": 5, "expand": "no"}, r"RandomRotation\.expand: expected true or false, got the string 'no'"),
        ({"name": "RandomAffine", "scale": [1.2, 0.8]}, r"RandomAffine\.scale: range reversed"),
        ({"name": "RandomAffine", "degres": 3}, r"RandomAffine\.degres: unknown field \(did you mean 'degrees'\?\)"),
        ({"name": "RandomAfine", "degrees": 3}, r"unknown transform 'RandomAfine' \(did you mean 'RandomAffine'\?\)"),
        ({"name": "Resize"}, r"Resize\.size: required field missing"),
        ({"name": "ColorJitter", "p": 1.5}, r"ColorJitter\.p: expected a probability in \[0, 1\], got 1\.5"),
        ({"name": "Resize", "size": [10.5, 3]}, r"Resize\.size: expected an integer or a \[height, width\] pair"),
        ({"name": "RandomIoUCrop", "trials": 0}, r"RandomIoUCrop\.trials: 0 is out of range"),
    ],
)
def test_malformed_entries_name_the_transform_and_the_field(spec, expected):
    with pytest.raises(RecipeError, match=r"transforms\[1\]:? " + expected):
        Compose.from_dict({"transforms": [{"name": "RandomHorizontalFlip"}, spec]})


def test_recipe_keys_and_entries_are_checked():
    with pytest.raises(RecipeError, match=r"min_sise: unknown recipe key \(did you mean 'min_size'\?\)"):
        Compose.from_dict({"transforms": [], "min_sise": 2})
    with pytest.raises(RecipeError, match=r"min_size: expected a number"):
        Compose.from_dict({"transforms": [], "min_size": "2"})
    with pytest.raises(RecipeError, match=r"transforms\[0\]: entry has no 'name'"):
        Compose.from_dict({"transforms": [{"p": 0.5}]})
    with pytest.raises(RecipeError, match=r"'transforms' must be a list"):
        Compose.from_dict({"transforms": {"name": "Resize"}})


def test_errors_from_a_file_give_the_file_and_the_line(tmp_path):
    text = "transforms:\n  - name: RandomHorizontalFlip\n  - name: RandomAffine\n    translate: [0.1, 0.1]\n    degrees: '15'\nmin_size: 2\n"
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as err:
        Compose.load(path)
    e = err.value
    assert (e.file, e.line, e.index, e.transform, e.field) == (str(path), 5, 1, "RandomAffine", "degrees")
    assert str(e).startswith(f"{path}: line 5: transforms[1] RandomAffine.degrees: ")
    recipe = {"transforms": [{"name": "Resize", "size": 8}, {"name": "Padd", "padding": 3}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(recipe, indent=2))
    with pytest.raises(RecipeError, match=r"r\.json: line 8: transforms\[1\]: unknown transform 'Padd' \(did you mean 'Pad'\?\)") as err:
        Compose.load(path)
    path = tmp_path / "nameless.yaml"  # no name: the entry's line
    path.write_text("transforms:\n  - name: Resize\n    size: 8\n  - p: 0.5\n")
    with pytest.raises(RecipeError, match=r"nameless\.yaml: line 4: transforms\[1\]: entry has no 'name'$"):
        Compose.load(path)


def test_python_calls_get_the_same_checks():
    with pytest.raises(RecipeError, match=r"Resize: takes 2 arguments \(size, max_size\), got 3"):
        T.Resize(256, 512, 3)
    with pytest.raises(RecipeError, match=r"Resize.max_size: only allowed when size is a single int"):
        T.Resize((256, 256), max_size=512)
    assert T.Resize(256).size == 256 and T.LetterBox(640).size == (640, 640)
    assert T.RandomAffine(degrees=10, shear=5).shear == (-5.0, 5.0, 0.0, 0.0)
    assert isinstance(RecipeError("x"), ValueError)


def test_output_size_is_asked_of_the_transforms():
    assert Compose([T.RandomIoUCrop(), T.Resize((300, 200)), T.RandomHorizontalFlip()]).output_size() == (300, 200)
    assert Compose([T.LetterBox(640), T.RandomAffine(degrees=5), T.ColorJitter()]).output_size() == (640, 640)
    assert Compose([T.Resize((64, 64)), T.RandomRotation(10, expand=True)]).output_size() is None
    assert Compose([T.Resize(64)]).output_size() is None
    assert Compose([T.RandomResizedCrop(32), T.Resize(64)]).output_size() == (64, 64)


def test_docs_transforms_table_is_generated_from_the_schemas():
    from pathlib import Path

    from detaug.transforms.table import BEGIN, END, markdown_table

    text = (Path(__file__).resolve().parents[3] / "docs" / "transforms.md").read_text(encoding="utf-8")
    assert text.split(BEGIN, 1)[1].split(END, 1)[0].strip() == markdown_table().strip(), (
        "docs/transforms.md is stale: run python -m detaug.transforms.table")
    for name in TRANSFORMS:
        assert f"### {name}" in text
