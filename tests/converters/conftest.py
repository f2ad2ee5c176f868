"""Fixtures of the converter tests (helpers are in helpers.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.converters.helpers import REALDATA, REALDATA_ENV


@pytest.fixture
def realdata() -> Path:
    """The real data root; skips the test when it is absent (a fresh clone has no shared/)."""
    if REALDATA is None:
        pytest.skip(f"real VOC data not found: set {REALDATA_ENV} or put it at "
                    "<repo>/../shared/realdata (CI has it; a fresh clone does not)")
    return REALDATA


@pytest.fixture
def copy_realdata(realdata: Path, tmp_path: Path) -> Callable[..., Path]:
    """Copy a real data folder into ``tmp_path`` (to alter it) and return the copy's root."""

    def copy(folder: str, dest: str | None = None) -> Path:
        target = tmp_path / (dest or folder)
        shutil.copytree(realdata / folder, target)
        return target

    return copy
