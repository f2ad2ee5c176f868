"""detaug.mps: finding a running NVIDIA MPS daemon by its control pipe."""

from __future__ import annotations

import os
import socket

from detaug.mps import mps_control_pipe


def test_an_mps_daemon_is_found_by_its_control_pipe_only(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert mps_control_pipe() is None  # no daemon: no pipe
    (tmp_path / "control").write_text("")  # a plain file is not a daemon's pipe
    assert mps_control_pipe() is None
    (tmp_path / "control").unlink()
    os.mkfifo(tmp_path / "control")
    reader = os.open(tmp_path / "control", os.O_RDONLY | os.O_NONBLOCK)  # the daemon, reading
    try:
        assert mps_control_pipe() == str(tmp_path / "control")
        assert os.read(reader, 16) == b""  # nothing written to it
    finally:
        os.close(reader)


def test_the_pipe_of_a_daemon_that_died_is_no_daemon(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    os.mkfifo(tmp_path / "control")  # left behind: nobody reads it
    assert mps_control_pipe() is None


def test_a_control_socket_counts_while_a_daemon_listens_on_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "control"))
    server.listen(1)
    assert mps_control_pipe() == str(tmp_path / "control")
    server.close()  # the daemon gone, its socket file left
    assert (tmp_path / "control").exists()
    assert mps_control_pipe() is None
