"""Whether an NVIDIA Multi-Process Service (MPS) daemon serves this process's CUDA clients.

Under MPS the kernels of several processes on one GPU run side by side; without it they take
turns in time slices. The loader's default feed depends on it (``DetectionLoader(feed_process=
None)``: a process of its own on a GPU under MPS), and ``detaug bench --train`` names it.
"""

from __future__ import annotations

import os
import stat

__all__ = ["mps_control_pipe"]


def mps_control_pipe() -> str | None:
    """The control pipe of a running NVIDIA Multi-Process Service daemon (``nvidia-cuda-mps-control
    -d``) that this process's CUDA clients join, or ``None``: ``control`` in
    ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), where the CUDA driver looks for it,
    a named pipe or a socket (not a plain file a daemon left behind)."""
    path = os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control")
    try:
        mode = os.stat(path).st_mode
        return path if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None
    except OSError:
        return None
