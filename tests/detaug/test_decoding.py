"""detaug.decoding: the decoder settings and DALI threads a loader gets by default.

Nothing here needs a GPU.
"""

from __future__ import annotations

import os

import pytest

from detaug import decoding
from detaug.decoding import (
    HW_DECODER_ENV,
    HW_DECODER_LOAD,
    decoder_options,
    default_num_threads,
    default_planning_workers,
    hw_decoder_load_from,
    threads_beside,
    threads_for,
)


def test_the_default_share():
    """0.8: four fifths of the JPEGs to the hardware decoder, the rest to the CUDA decoder on
    DALI's threads (measured against 0.65 and 0.99 on H100 and H200 hosts: docs/benchmarks.md)."""
    assert HW_DECODER_LOAD == 0.8
    assert hw_decoder_load_from(None) == hw_decoder_load_from("") == hw_decoder_load_from("  ") == 0.8


def test_the_environment_variable_sets_the_share():
    assert hw_decoder_load_from("0.5") == 0.5
    assert hw_decoder_load_from(" 1 ") == 1.0
    assert hw_decoder_load_from("0") == 0.0
    for bad in ("1.5", "-0.1", "most", "nan"):
        with pytest.raises(ValueError, match=HW_DECODER_ENV):
            hw_decoder_load_from(bad)


def test_decoder_options(monkeypatch):
    monkeypatch.delenv(HW_DECODER_ENV, raising=False)
    assert decoder_options(False) == {} and decoder_options(False, hw_decoder_load=0.3) == {}
    assert decoder_options(True) == {"hw_decoder_load": 0.8}
    assert decoder_options(True, hw_decoder_load=0.0) == {"hw_decoder_load": 0.0}
    monkeypatch.setenv(HW_DECODER_ENV, "0.99")
    assert decoder_options(True) == {"hw_decoder_load": 0.99}
    assert decoder_options(True, hw_decoder_load=0.1) == {"hw_decoder_load": 0.1}
    assert decoder_options(False) == {}
    with pytest.raises(ValueError, match="hw_decoder_load"):
        decoder_options(True, hw_decoder_load=2.0)
    monkeypatch.setenv(HW_DECODER_ENV, "lots")
    with pytest.raises(ValueError, match=HW_DECODER_ENV):
        decoder_options(True)


def test_the_options_are_accepted_by_dalis_decoders():
    """The keys decoder_options returns are arguments of every decoder detaug and the bench use."""
    from nvidia.dali import backend

    options = decoder_options(True)
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
