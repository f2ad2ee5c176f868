"""The loaders' worker processes behave as a torch DataLoader's do on Linux: a script without a
main guard, ``python -c`` and standard input work; SIGINT and SIGTERM end the run promptly and
leave no process behind, and SIGTERM no shared-memory file or leak warning; a full, read-only
or small ``/dev/shm`` slows the loader down, never stops it. Real subprocesses running DetectionLoader with planning workers (the
pool itself is tested in test_workers.py)."""

from __future__ import annotations

import os
import shlex
import shutil
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


# -- SIGTERM leaves nothing for the resource tracker to warn of ------------------------------------------

SIGTERM_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import detaug.transforms as T
    from detaug.sources import CocoSource
    from detaug.synthetic import write_coco_dataset
    from detaug.torch import DetectionLoader

    root, how = sys.argv[1], sys.argv[2]
    if how == "user handler":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    write_coco_dataset(root, num_images=9, size=(64, 48), max_objects=2, progress=False)
    loader = DetectionLoader(CocoSource(root + "/annotations.json", root + "/images"),
                             T.Compose([T.RandomHorizontalFlip(), T.Resize((32, 32))]), 2,
                             device="cpu", num_workers=2, shuffle=True)
    next(iter(loader))
    print("handler", "default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else "set", flush=True)
    print("PID", os.getpid(), "looping", flush=True)
    while True:
        for _ in loader:
            time.sleep(0.01)
    """
)


def shm_names_of(pid: int) -> list[str]:
    """detaug's shared-memory files of process ``pid`` (slots ``detaug_batch_<pid>_*``, payloads
    ``detaug_<pid>_*``)."""
    if not os.path.isdir("/dev/shm"):
        return []
    return [n for n in os.listdir("/dev/shm") if n.startswith((f"detaug_batch_{pid}_", f"detaug_{pid}_"))]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory is not in /dev/shm here")
@pytest.mark.parametrize("how", ["default", "user handler"])
def test_sigterm_leaves_no_shared_memory_and_no_leak_warning(tmp_path, how):
    """A SIGTERM (torchrun's, docker stop's) to a loader whose workers have written batches into
    shared memory: with Python's default action the process still dies of the signal at once, and
    with a handler of the user's that exits it exits as that handler says; either way no file of
    it is left in /dev/shm and multiprocessing's resource tracker warns of no leaked object."""
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path / "data"), how],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "looping" in line:
                break
        pid = int(lines[-1].split()[1])
        assert pid == proc.pid
        time.sleep(0.5)
        assert shm_names_of(pid), "the workers should have written batches into shared memory"
        workers = children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)  # to EOF: the resource tracker, which shares stderr, is gone too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if how == "default":
        assert "handler default" not in "".join(lines)  # detaug's, which dies as SIG_DFL does
        assert proc.returncode == -signal.SIGTERM, err
    else:
        assert "handler set" in "".join(lines)
        assert proc.returncode == 3, err
    assert "leaked" not in err and "resource_tracker" not in err, err
    assert not shm_names_of(pid)
    deadline = time.monotonic() + 5
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(w) for w in workers), "planning workers outlived the run"


# -- a full, read-only or missing /dev/shm does not stop a loader ----------------------------------------

SHM_SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("always")
    import detaug.transforms as T
    from detaug.sources import CocoSource
    from detaug.synthetic import write_coco_dataset
    from detaug.torch import DetectionLoader

    root = sys.argv[1]
    write_coco_dataset(root, num_images=9, size=(64, 48), max_objects=2, progress=False)
    source = CocoSource(root + "/annotations.json", root + "/images")
    recipe = T.Compose([T.RandomHorizontalFlip(), T.RandomAffine(degrees=10), T.Resize((32, 32))])
    def run(workers):
        loader = DetectionLoader(source, recipe, 2, device="cpu", num_workers=workers, shuffle=True, seed=1)
        return [(t["image_id"], t["boxes"].cpu().numpy().round(4).tolist()) for _, targets in loader for t in targets]
    with warnings.catch_warnings(record=True) as caught:
        with_workers = run(2)
    print("same", with_workers == run(0), "ids", sorted(i for i, _ in with_workers), flush=True)
    for w in caught:
        print("WARNING", w.category.__name__, str(w.message).replace(chr(10), " "), flush=True)
    """
)


def _in_a_small_dev_shm(tmp_path: Path, mount: str, fill_kib: int) -> subprocess.CompletedProcess:
    """Run :data:`SHM_SCRIPT` in a mount namespace of its own where ``/dev/shm`` is a tmpfs mounted
    with ``mount`` (``size=64k``, ``ro``, ...) holding a file of ``fill_kib`` KiB; skip where
    that cannot be done (no ``unshare``, no right to mount)."""
    script = tmp_path / "shm.py"
    script.write_text(SHM_SCRIPT)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /dev/shm"],
                           capture_output=True, text=True, check=False) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"a private /dev/shm cannot be mounted here ({'no unshare' if probe is None else probe.stderr.strip()})")
    fill = f"head -c {fill_kib * 1024} /dev/zero > /dev/shm/fill && " if fill_kib else ""
    remount = "mount -o remount,ro /dev/shm && " if "ro" in mount.split(",") else ""
    size = ",".join(o for o in mount.split(",") if o != "ro")
    command = (f"mount -t tmpfs -o {size} tmpfs /dev/shm && {fill}{remount}"
               f"exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(tmp_path / 'data'))}")
    return subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=300, env=env())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /dev/shm")
@pytest.mark.parametrize(
    "mount, fill_kib, says",
    [
        ("size=8k", 8, "semaphores cannot be made in /dev/shm (No space left on device)"),  # full: no worker pool
        ("size=64k,ro", 0, "semaphores cannot be made in /dev/shm (Read-only file system)"),
        ("size=64k", 36, "/dev/shm has"),  # room for the pool's semaphores, not for the batches: pipes
    ],
    ids=["full", "read-only", "too small for the batches"],
)
def test_a_full_or_read_only_dev_shm_does_not_stop_the_loader(tmp_path, mount, fill_kib, says):
    """Where /dev/shm cannot hold the worker pool's semaphores the loader plans in its own
    process; where it holds them but not the batches' bytes, the bytes come through the pipes.
    Either way: every image of the epoch, the same batches as without workers, and one warning
    that names the folder."""
    run = _in_a_small_dev_shm(tmp_path, mount, fill_kib)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "same True ids [1, 2, 3, 4, 5, 6, 7, 8, 9]" in run.stdout, run.stdout + run.stderr[-3000:]
    warned = [line for line in run.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1 and "RuntimeWarning" in warned[0] and says in warned[0], warned
