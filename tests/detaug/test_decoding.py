"""detaug.decoding: the decoder settings and DALI threads a loader gets by default.

Nothing here needs a GPU: the GPU rule is a pure function of the device's name.
"""

from __future__ import annotations

import os

import pytest

from detaug import decoding
from detaug.decoding import (
    DALI_DEFAULT_HW_DECODER_LOAD,
    HW_DECODER_ENV,
    HW_DECODER_LOAD,
    decoder_options,
    default_num_threads,
    has_hardware_jpeg_decoder,
    default_planning_workers,
    hw_decoder_load_for,
    threads_beside,
    threads_for,
)


@pytest.mark.parametrize(
    "name",
    ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A30", "NVIDIA GH200 480GB",
     "NVIDIA H20", "NVIDIA B200", "NVIDIA H100 NVL"],
)
def test_gpus_with_hardware_jpeg_decoders_get_nearly_all_jpegs(name):
    assert has_hardware_jpeg_decoder(name)
    assert hw_decoder_load_for(name) == HW_DECODER_LOAD == 0.99


@pytest.mark.parametrize(
    "name", ["NVIDIA A10", "NVIDIA A40", "Tesla V100-SXM2-16GB", "NVIDIA L4", "NVIDIA GeForce RTX 4090",
             "NVIDIA RTX A3000 Laptop GPU", ""],
)
def test_other_gpus_keep_dalis_default(name):
    """Similar names (A10 is not A100, A3000 not A30) do not count; DALI's default 0.65 stays."""
    assert not has_hardware_jpeg_decoder(name)
    assert hw_decoder_load_for(name) == DALI_DEFAULT_HW_DECODER_LOAD == 0.65


def test_the_environment_variable_overrides_the_table():
    assert hw_decoder_load_for("NVIDIA H200", env="0.5") == 0.5
    assert hw_decoder_load_for("NVIDIA L4", env=" 1 ") == 1.0
    assert hw_decoder_load_for("NVIDIA H200", env="  ") == HW_DECODER_LOAD  # blank: not set
    for bad in ("1.5", "-0.1", "most"):
        with pytest.raises(ValueError, match=HW_DECODER_ENV):
            hw_decoder_load_for("NVIDIA H200", env=bad)


def test_decoder_options(monkeypatch):
    monkeypatch.delenv(HW_DECODER_ENV, raising=False)
    assert decoder_options(False) == {} and decoder_options(False, hw_decoder_load=0.3) == {}
    assert decoder_options(True, device_name="NVIDIA H200") == {"hw_decoder_load": 0.99}
    assert decoder_options(True, device_name="NVIDIA L4") == {"hw_decoder_load": 0.65}
    assert decoder_options(True, hw_decoder_load=0.0, device_name="NVIDIA H200") == {"hw_decoder_load": 0.0}
    monkeypatch.setenv(HW_DECODER_ENV, "0.8")
    assert decoder_options(True, device_name="NVIDIA H200") == {"hw_decoder_load": 0.8}
    assert decoder_options(True, hw_decoder_load=0.1, device_name="NVIDIA H200") == {"hw_decoder_load": 0.1}
    with pytest.raises(ValueError, match="hw_decoder_load"):
        decoder_options(True, hw_decoder_load=2.0, device_name="NVIDIA H200")


def test_the_options_are_accepted_by_dalis_decoders():
    """The keys decoder_options returns are arguments of every decoder detaug and the bench use."""
    from nvidia.dali import backend

    options = decoder_options(True, device_name="NVIDIA H200")
    for op in ("decoders__Image", "decoders__ImageSlice", "decoders__ImageRandomCrop"):
        schema = backend.GetSchema(op)
        assert all(schema.HasArgument(key) for key in options), op


@pytest.mark.parametrize(
    "cpus, ranks, threads", [(16, 1, 16), (64, 1, 16), (2, 1, 2), (1, 1, 1), (16, 8, 2), (4, 8, 1), (16, 0, 16)]
)
def test_threads_are_the_cores_of_a_rank(cpus, ranks, threads):
    assert threads_for(cpus, ranks) == threads


def test_default_threads_follow_the_affinity_and_local_world_size(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    cpus = decoding.available_cpus()
    assert cpus <= 12
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_num_threads() == min(16, cpus)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_num_threads() == max(1, cpus // 4)
    assert default_num_threads(ranks_per_host=1) == min(16, cpus)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert default_num_threads() == min(16, cpus)


@pytest.mark.parametrize(
    "cpus, ranks, workers, threads",
    [(16, 1, 8, 8), (64, 1, 16, 16), (32, 2, 8, 8), (16, 8, 1, 1), (2, 1, 1, 1), (1, 1, 1, 1), (12, 1, 6, 6)],
)
def test_planning_workers_get_half_a_ranks_cpus_and_dalis_threads_the_rest(monkeypatch, cpus, ranks, workers, threads):
    monkeypatch.setattr(decoding, "available_cpus", lambda: cpus)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    assert default_planning_workers() == workers and default_planning_workers(on_gpu=False) == 0
    assert threads_beside(workers) == threads
    assert threads_beside(0) == default_num_threads()  # no workers: DALI has the rank's CPUs
    assert threads_beside(3, ranks_per_host=1) == max(1, min(16, cpus - 3))
