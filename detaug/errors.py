"""Errors and warnings about the user's data (one place, imported by every layer).

* :class:`DatasetError` (a ``ValueError``): an input problem that detaug will not repair; the
  message names the file and the image or annotation id.
* :class:`ImageError` (a :class:`DatasetError`): one image cannot be read or decoded; raised with
  ``on_error="raise"``, otherwise the image is skipped and reported.
* :class:`DataWarning`: a skipped image or a counted repair, said once.
* :class:`DeviceError` (a ``RuntimeError``): ``device="gpu"`` where DALI finds no GPU.
* :class:`RecipeError` (a ``ValueError``): a recipe entry that does not fit its transform's
  schema; names the transform, the field and, for a recipe read from a file, the file and line.
"""

from __future__ import annotations

__all__ = ["DatasetError", "ImageError", "DataWarning", "DeviceError", "RecipeError"]


class DatasetError(ValueError):
    """An input problem that is not repaired: the message names the file and the image or
    annotation id."""


class ImageError(DatasetError):
    """An image that cannot be read or decoded.

    Attributes:
        file: the image file (or a description of an in-memory image).
        image_id: the image's id.
        reason: why it cannot be used (``"empty file"``, ``"truncated JPEG"``, ...).
    """

    def __init__(self, file: str, image_id: int | None, reason: str) -> None:
        self.file, self.image_id, self.reason = file, image_id, reason
        super().__init__(f"{file} (image_id {image_id}): {reason}")

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.file, self.image_id, self.reason))


class DataWarning(UserWarning):
    """A skipped image or a counted repair of the input data."""


class DeviceError(RuntimeError):
    """``device="gpu"`` where DALI finds no CUDA device: the message says what was looked for."""


class RecipeError(ValueError):
    """A recipe (or a transform's arguments) that does not fit the schema.

    Attributes:
        problem: what is wrong (``"expected a number ..., got the string '15'"``).
        transform: the transform's name (``None`` for the recipe's own keys).
        field: the parameter (``None`` when the transform itself is at fault).
        index: the position of the entry in the recipe's ``transforms`` list, when known.
        line: the 1-based line in the recipe file, when read from one.
        file: the recipe file, when read from one.

    The message is one line: ``[FILE: ][line L: ][transforms[I] ]TRANSFORM.FIELD: PROBLEM``.
    """

    def __init__(
        self,
        problem: str,
        *,
        transform: str | None = None,
        field: str | None = None,
        index: int | None = None,
        line: int | None = None,
        file: str | None = None,
    ) -> None:
        self.problem, self.transform, self.field = problem, transform, field
        self.index, self.line, self.file = index, line, file
        super().__init__(self._text())

    def _text(self) -> str:
        where = ""
        if self.file:
            where += f"{self.file}: "
        if self.line is not None:
            where += f"line {self.line}: "
        name = ".".join(x for x in (self.transform, self.field) if x)
        if self.index is not None:
            name = f"transforms[{self.index}]" + (f" {name}" if name else "")
        return f"{where}{name + ': ' if name else ''}{self.problem}"

    def located(self, *, index: int | None = None, line: int | None = None, file: str | None = None) -> "RecipeError":
        """The same error with its place in a recipe (unknown parts kept)."""
        return RecipeError(
            self.problem, transform=self.transform, field=self.field,
            index=self.index if index is None else index,
            line=self.line if line is None else line,
            file=self.file if file is None else file,
        )

    def __reduce__(self):  # picklable across worker processes
        return (_recipe_error, (self.problem, self.transform, self.field, self.index, self.line, self.file))


def _recipe_error(problem, transform, field, index, line, file) -> RecipeError:  # noqa: ANN001
    return RecipeError(problem, transform=transform, field=field, index=index, line=line, file=file)
