"""Fixtures the detaug tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

#: The real Pascal VOC data beside the repository (absent in CI: tests that need it skip).
REALDATA = Path(__file__).resolve().parents[3] / "shared" / "realdata"
RACCOON = REALDATA / "raccoon"


@pytest.fixture(scope="module")
def voc_folder(tmp_path_factory) -> Path:
    """Real photos (raccoon, 20 JPEGs) where ../shared/realdata is, else synthetic VOC scenes."""
    if (RACCOON / "Annotations").is_dir():
        return RACCOON
    from detaug.synthetic import write_voc_dataset

    root = tmp_path_factory.mktemp("voc")
    write_voc_dataset(root, num_images=8, size=((160, 240), (120, 180)), max_objects=3, seed=0)
    return root


def cyclic_garbage(take, batches: int) -> list:
    """The objects only Python's cycle collector would free, left by ``batches`` calls of
    ``take()`` (the collector off meanwhile; every thread's garbage counts)."""
    import gc

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(batches):
            take()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
