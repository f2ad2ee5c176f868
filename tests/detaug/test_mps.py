"""detaug.mps: finding a running NVIDIA MPS daemon by its control pipe."""

from __future__ import annotations

import os

from detaug.mps import mps_control_pipe


def test_an_mps_daemon_is_found_by_its_control_pipe_only(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert mps_control_pipe() is None  # no daemon: no pipe
    (tmp_path / "control").write_text("")  # a plain file is not a daemon's pipe
    assert mps_control_pipe() is None
    (tmp_path / "control").unlink()
    os.mkfifo(tmp_path / "control")
    assert mps_control_pipe() == str(tmp_path / "control")
