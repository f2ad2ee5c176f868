"""Decoder settings that reach DALI's decode limit, and the DALI threads of a process.

One source of truth for two defaults that the loaders and ``detaug bench`` share:

* :func:`decoder_options`: keyword arguments for DALI's image decoders
  (``fn.decoders.image``, ``image_slice``, ``image_random_crop``). On a GPU,
  ``hw_decoder_load`` is :data:`HW_DECODER_LOAD`, 0.8: four fifths of each batch's JPEGs go to
  the hardware JPEG decoder where the GPU has one (A100, H100, H200, ...; DALI ignores the share
  elsewhere), the rest to the CUDA decoder, whose Huffman decoding runs on DALI's CPU threads,
  so that both work. At DALI's own default, 0.65, those threads were busy the whole time and
  the loader fell below 0.85x the decode limit on real photos; 0.99 was ahead on real photos and
  behind on small synthetic ones, whose limit favours DALI's threads. 0.8 and 0.99 both kept the
  loader above 0.85x in the six cells measured (H100 and H200, real and synthetic, batch 64 and
  256; docs/benchmarks.md, "The hardware decoder's share, again"), and 0.99 had failed the
  synthetic set at batch 256 earlier. ``DETAUG_HW_DECODER_LOAD`` (a number in ``[0, 1]``)
  overrides it, an explicit argument overrides both. On the CPU: no options.
* :func:`default_num_threads`: DALI CPU threads for one process: the CPUs it may use
  (:func:`available_cpus`) divided by the ranks sharing the host (``LOCAL_WORLD_SIZE``, as
  ``torchrun`` sets it), at least 1 and at most 16.
* :func:`default_planning_workers` and :func:`threads_beside`: where a rank plans its batches in
  worker processes, its CPUs are split between them and DALI instead: half of them plan, DALI's
  threads get the rest. Giving both all the CPUs made them
  compete: on a 16-core H100 host the loader ran 10,800-11,500 img/s with 16 DALI threads beside
  16 planning workers and 12,400-14,400 with 8 beside 8 (docs/benchmarks.md).

Nothing here needs a GPU.
"""

from __future__ import annotations

import math
import os

__all__ = [
    "HW_DECODER_ENV",
    "DALI_HW_DECODER_LOAD",
    "HW_DECODER_LOAD",
    "MAX_THREADS",
    "available_cpus",
    "decoder_options",
    "default_num_threads",
    "default_planning_workers",
    "hw_decoder_load_from",
    "local_ranks",
    "rank_cpus",
    "threads_beside",
    "threads_for",
]

#: The environment variable that overrides the hardware decoder share (a number in [0, 1]).
HW_DECODER_ENV = "DETAUG_HW_DECODER_LOAD"
#: The share of JPEGs given to the GPU's hardware decoder by default (measured on H100 and
#: H200 hosts: see the module docstring).
HW_DECODER_LOAD = 0.8
#: DALI's own default share (``fn.decoders.image``, DALI 1.x-2.x).
DALI_HW_DECODER_LOAD = 0.65
#: Most DALI CPU threads :func:`default_num_threads` gives one process.
MAX_THREADS = 16


def hw_decoder_load_from(env: str | None) -> float:
    """The ``hw_decoder_load`` for ``env``, the value of :data:`HW_DECODER_ENV`: that number
    when set and not blank, else :data:`HW_DECODER_LOAD`.

    Raises:
        ValueError: ``env`` is not a number in ``[0, 1]`` (the message names the variable).
    """
    if env is not None and env.strip():
        return _check_load(env.strip(), f"{HW_DECODER_ENV}={env!r}")
    return HW_DECODER_LOAD


def decoder_options(on_gpu: bool, *, hw_decoder_load: float | None = None) -> dict:
    """Keyword arguments for DALI's image decoders (``fn.decoders.image``, ``image_slice``,
    ``image_random_crop``) on the GPU (``device="mixed"``) or the CPU.

    Args:
        on_gpu: the decoder runs with ``device="mixed"``.
        hw_decoder_load: the share of JPEGs for the hardware decoder, in ``[0, 1]``; ``None``:
            :data:`HW_DECODER_ENV` when set, else :data:`HW_DECODER_LOAD`.

    Returns:
        ``{"hw_decoder_load": float}`` on the GPU, ``{}`` on the CPU (DALI's CPU decoder has no
        hardware share).

    Raises:
        ValueError: ``hw_decoder_load`` (or the environment variable) not a number in ``[0, 1]``.
    """
    if not on_gpu:
        return {}
    if hw_decoder_load is not None:
        return {"hw_decoder_load": _check_load(hw_decoder_load, "hw_decoder_load")}
    return {"hw_decoder_load": hw_decoder_load_from(os.environ.get(HW_DECODER_ENV))}


def _check_load(value: object, what: str) -> float:
    try:
        load = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what}: should be a number in [0, 1], got {value!r}") from None
    if isinstance(value, bool) or not 0.0 <= load <= 1.0:
        raise ValueError(f"{what}: should be a number in [0, 1], got {value!r}")
    return load


# ------------------------------------------------------------------------------------------
# threads
# ------------------------------------------------------------------------------------------


def available_cpus() -> int:
    """The CPUs this process may use: its affinity mask (``taskset``, container cpusets), capped
    by a cgroup v2 CPU quota (``docker --cpus``) when there is one; ``os.cpu_count()`` where
    neither can be read. At least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max" and int(period) > 0:
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def threads_for(cpus: int, ranks_per_host: int = 1) -> int:
    """DALI threads of one of ``ranks_per_host`` processes sharing ``cpus`` CPUs: their share,
    at least 1, at most :data:`MAX_THREADS` (16 on a 16-core host, 2 per rank for 8 ranks on
    16 cores, 16 on 64 cores)."""
    return max(1, min(MAX_THREADS, cpus // max(1, ranks_per_host)))


def default_num_threads(ranks_per_host: int | None = None) -> int:
    """DALI CPU threads for this process: :func:`threads_for` the CPUs it may use
    (:func:`available_cpus`) and the ranks on this host (``ranks_per_host``; ``None``: the
    ``LOCAL_WORLD_SIZE`` environment variable, 1 when unset or not a positive integer)."""
    return threads_for(available_cpus(), local_ranks() if ranks_per_host is None else max(1, ranks_per_host))


def rank_cpus(ranks_per_host: int | None = None) -> int:
    """The CPUs of one of the ranks on this host: :func:`available_cpus` divided by
    ``ranks_per_host`` (``None``: :func:`local_ranks`), at least 1."""
    return max(1, available_cpus() // (local_ranks() if ranks_per_host is None else max(1, ranks_per_host)))


def default_planning_workers(ranks_per_host: int | None = None, *, on_gpu: bool = True) -> int:
    """Planning worker processes of a rank: on a GPU (``on_gpu``), half its CPUs
    (:func:`rank_cpus`), at least 1, at most :data:`MAX_THREADS` (8 on a 16-core host, 1 on a
    2-core machine, 16 on 64 cores), DALI's threads getting the rest (:func:`threads_beside`);
    on the CPU none, since DALI's CPU operators need every core and the batches are planned in
    the calling process."""
    if not on_gpu:
        return 0
    return max(1, min(MAX_THREADS, rank_cpus(ranks_per_host) // 2))


def threads_beside(planning_workers: int, ranks_per_host: int | None = None) -> int:
    """DALI CPU threads of a rank's pipeline beside its ``planning_workers`` processes: the
    rank's CPUs (:func:`rank_cpus`) less the workers, at least 1, at most :data:`MAX_THREADS`.
    Without workers, :func:`default_num_threads` (16 cores: 8 threads beside 8 workers, 16
    beside none)."""
    left = max(1, rank_cpus(ranks_per_host) - max(0, int(planning_workers)))
    return max(1, min(MAX_THREADS, left))


def local_ranks() -> int:
    """Processes sharing this host's CPUs: ``LOCAL_WORLD_SIZE`` (``torchrun`` sets it), 1 when
    unset or not a positive integer."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
