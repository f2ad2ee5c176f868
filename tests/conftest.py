"""Test-wide settings: Keras (optional) runs on its torch backend, the one CI installs; a test
that hangs ends the run with every thread's stack instead of holding CI until its time limit."""

import faulthandler
import os
import sys

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")  # before any test module imports Keras

#: Seconds one test (setup, call, teardown) may take before the run is ended with the stacks of
#: all threads (exit status 1). The slowest test takes ~40 s on 2 cores. DETAUG_TEST_TIMEOUT=0: none.
TEST_TIMEOUT_S = float(os.environ.get("DETAUG_TEST_TIMEOUT", "300"))


def _stderr_fd(config: pytest.Config) -> int:
    """The terminal's stderr, which pytest keeps for faulthandler (fd 2 is captured in tests)."""
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        return config.stash[fault_handler_stderr_fd_key]
    except (ImportError, KeyError):
        return sys.__stderr__.fileno()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ANN001, ANN201 - pytest's hook signature
    if TEST_TIMEOUT_S > 0:
        faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=True, file=_stderr_fd(item.config))
    try:
        yield
    finally:
        if TEST_TIMEOUT_S > 0:
            faulthandler.cancel_dump_traceback_later()
