"""Whether an NVIDIA Multi-Process Service (MPS) daemon serves this process's CUDA clients.

Under MPS the kernels of several processes on one GPU run side by side; without it they take
turns in time slices. The loader's default feed depends on it (``DetectionLoader(feed_process=
None)``: a process of its own on a GPU under MPS), and ``detaug bench --train`` names it.
"""

from __future__ import annotations

import errno
import os
import socket
import stat

__all__ = ["mps_control_pipe"]

#: What opening a daemon's control pipe says when no daemon listens on it: a named pipe without
#: a reader (``ENXIO``, its writer opened without blocking), a socket without a listener
#: (``ECONNREFUSED``), or nothing there any more.
_NO_DAEMON = (errno.ENXIO, errno.ECONNREFUSED, errno.ENOENT)


def mps_control_pipe() -> str | None:
    """The control pipe of a running NVIDIA Multi-Process Service daemon (``nvidia-cuda-mps-control
    -d``) that this process's CUDA clients join, or ``None``: ``control`` in
    ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), where the CUDA driver looks for it,
    a named pipe or a socket that a daemon listens on - not a plain file, nor the pipe of a
    daemon that died without removing it (opened without blocking, and closed at once, nothing
    written). Where the pipe cannot be opened for another reason (say, a daemon of another
    user's, or one that does not accept within a second), it counts as a daemon's."""
    path = os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    try:
        if stat.S_ISFIFO(mode):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        elif stat.S_ISSOCK(mode):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)  # a daemon that does not accept (its backlog full) still counts
                s.connect(path)
        else:
            return None
    except OSError as e:
        if e.errno in _NO_DAEMON:
            return None
    return path
