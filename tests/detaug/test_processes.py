"""The loaders' worker processes behave as a torch DataLoader's do on Linux: a script without a
main guard, ``python -c`` and standard input work; SIGINT and SIGTERM end the run promptly and
leave no process behind. Real subprocesses running DetectionLoader with planning workers (the
pool itself is tested in test_workers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from PIL import Image
    import detaug.transforms as T
    from detaug.sources import CocoSource
    from detaug.synthetic import write_coco_dataset
    from detaug.torch import DetectionLoader

    root = sys.argv[1] if len(sys.argv) > 1 else {root!r}
    print("main body runs", flush=True)
    write_coco_dataset(root, num_images=9, size=(64, 48), max_objects=2, progress=False)
    loader = DetectionLoader(CocoSource(root + "/annotations.json", root + "/images"),
                             T.Compose([T.RandomHorizontalFlip(), T.Resize((32, 32))]), 2,
                             device="cpu", num_workers=2, shuffle=True)
    ids = sorted(t["image_id"] for _, targets in loader for t in targets)
    print("ids", ids, flush=True)
    if {forever}:
        print("looping", flush=True)
        while True:
            for _ in loader:
                time.sleep(0.01)
    """
)


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.mark.parametrize("how", ["file", "-c", "stdin"])
def test_without_a_main_guard(tmp_path, how):
    code = SCRIPT.format(root=str(tmp_path / "data"), forever=False)
    if how == "file":
        script = tmp_path / "train.py"
        script.write_text(code)
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env())
    elif how == "-c":
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env())
    else:
        run = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=180, env=env())
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("main body runs") == 1  # the workers did not run the script again
    assert "ids [1, 2, 3, 4, 5, 6, 7, 8, 9]" in run.stdout  # one epoch, every image once


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_end_the_run_and_leave_no_process(tmp_path, sig):
    """Ctrl-C (SIGINT) and torchrun's SIGTERM during iteration: the process ends within 5 s and
    its planning workers with it. A few rounds here; the pool's own test loops 50 times."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=str(tmp_path / "data"), forever=True))
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        try:
            for line in proc.stdout:
                if "looping" in line:
                    break
            time.sleep(0.3)
            workers = children_of(proc.pid)
            assert workers, "the loader should have planning workers"
            proc.send_signal(sig)
            proc.wait(timeout=5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        deadline = time.monotonic() + 5
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(w) for w in workers), "planning workers outlived the run"
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in proc.stderr.read()
