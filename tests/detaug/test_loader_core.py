"""The loader core's argument rules, as both faces take them (:mod:`detaug.loader_core`)."""

from __future__ import annotations

import pytest

import detaug.transforms as T
from detaug.keras import DetectionSequence
from detaug.loader_core import hardware_decoder_share
from detaug.sources import SampleListSource
from detaug.torch import DetectionLoader
from tests.detaug.consistency import scene_samples

RECIPE = T.Compose([T.RandomHorizontalFlip(), T.Resize((64, 80))])


def test_hardware_decoder_share_is_resolved_once(monkeypatch):
    monkeypatch.delenv("DETAUG_HW_DECODER_LOAD", raising=False)
    assert hardware_decoder_share(None, 0) == 0.8  # detaug's default on a GPU
    assert hardware_decoder_share(0.0, 0) == 0.0 and hardware_decoder_share(1, 0) == 1.0
    assert hardware_decoder_share(None, None) is None and hardware_decoder_share(0.3, None) is None  # the CPU
    monkeypatch.setenv("DETAUG_HW_DECODER_LOAD", "0.25")
    assert hardware_decoder_share(None, 0) == 0.25  # the environment, where no value is given
    assert hardware_decoder_share(0.5, 0) == 0.5  # a given value wins over it


@pytest.mark.parametrize("bad", [1.5, -0.1, "half", True])
def test_a_bad_hardware_decoder_share_is_an_error_on_any_device(bad):
    for device_id in (0, None):
        with pytest.raises(ValueError, match=r"hw_decoder_load: should be a number in \[0, 1\], got "):
            hardware_decoder_share(bad, device_id)


@pytest.mark.parametrize("face", ["loader", "sequence"])
def test_both_faces_take_the_hardware_decoder_share(face):
    source = SampleListSource(scene_samples(4, seed=1)[0])

    def make(**kw):
        if face == "loader":
            return DetectionLoader(source, RECIPE, 2, device="cpu", num_workers=0, ready_batches=0, **kw)
        return DetectionSequence(source, RECIPE, 2, device="cpu", plan_workers=0, prefetch=False, **kw)

    with pytest.raises(ValueError, match=r"hw_decoder_load: should be a number in \[0, 1\], got 2"):
        make(hw_decoder_load=2)
    made = make(hw_decoder_load=0.0)
    assert made.hw_decoder_load is None  # DALI's CPU decoder has no hardware share
    images = next(iter(made))[0] if face == "loader" else made[0][0]
    assert tuple(images.shape)[:1] == (2,)  # the CPU pipeline runs with it
    made.close()


@pytest.mark.parametrize("face", [DetectionLoader, DetectionSequence])
def test_every_argument_of_both_faces_is_documented(face):
    """Each constructor argument has its entry in the class docstring's ``Args:`` (alone or in a
    shared ``a, b:`` entry), so that ``help()`` and the reference say what every one means."""
    import inspect
    import re

    args = face.__doc__.split("Args:", 1)[1]
    entries = {name for line in re.findall(r"^ {8}(\w+(?:, \w+)*):", args, re.M) for name in line.split(", ")}
    params = [p for p in inspect.signature(face.__init__).parameters if p not in ("self", "kwargs")]
    assert [p for p in params if p not in entries] == []
