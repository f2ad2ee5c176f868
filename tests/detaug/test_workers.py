"""detaug.workers: spawned worker pools that need no main guard, die with their parent, and stop
without hanging. Most scenarios run in real subprocesses (a script file, ``python -c``, standard
input) and signal them the way a terminal or torchrun does."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import pytest

from detaug.main_pickles import main_references, references_main
from detaug.worker_payload import SHARED_MEMORY_PREFIX
from detaug.workers import PIPE_PAYLOAD_LIMIT, start_pool, stop_pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics (/proc, prctl)")

# A module the workers import (not __main__): it lands next to the scripts, in the parent's sys.path.
HELPER = """
import os, sys, time

FACTOR = None
PAYLOAD = b""

def init(factor, payload=b""):
    global FACTOR, PAYLOAD
    FACTOR, PAYLOAD = factor, payload

def init_pickled(payload):
    import pickle
    global FACTOR
    FACTOR = pickle.loads(payload).factor

def job(i):
    return i * FACTOR

def payload_digest():
    import hashlib
    return len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest()

def heavy_modules():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "nvidia", "keras", "tensorflow", "jax"))

def nap(seconds):
    time.sleep(seconds)
    return os.getpid()
"""

# A top-level script without a main guard: it must run once, and compute.
NO_GUARD = """
import os
print("SCRIPT-RAN", os.getpid(), flush=True)
import helper
from detaug.workers import start_pool
pool = start_pool(2, helper.init, (7,))
print("RESULT", sum(pool.map(helper.job, range(10))), flush=True)
print("HEAVY", pool.submit(helper.heavy_modules).result(), flush=True)
print("HIDES", pool.hides_main, flush=True)
"""


@pytest.fixture()
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding ``helper.py``, on this process' sys.path (so in-process pools' workers
    find it too: they get the parent's sys.path)."""
    (tmp_path / "helper.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(workdir), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(workdir: Path, args: list[str], stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], input=stdin, cwd=workdir, env=_env(workdir), capture_output=True, text=True, timeout=timeout, check=False)


def _ppids() -> dict[int, int]:
    """pid -> parent pid of every process (from /proc/*/stat)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            out[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _descendants(pid: int) -> set[int]:
    ppids = _ppids()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in ppids.items() if pp in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an orphan zombie may wait for a PID 1 that
    does not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The pids still running after ``timeout`` seconds (empty as soon as all are gone)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p for p in pids if _running(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def _check_no_guard(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("SCRIPT-RAN") for line in lines) == 1, proc.stdout  # workers did not re-run it
    assert "RESULT 315" in lines, proc.stdout  # 7 * (0 + ... + 9)
    assert "HEAVY []" in lines, proc.stdout  # no DALI / torch / Keras in the workers
    assert "HIDES True" in lines, proc.stdout


# -- no main guard needed ---------------------------------------------------------------------------


def test_script_without_main_guard(workdir: Path) -> None:
    (workdir / "script.py").write_text(NO_GUARD)
    _check_no_guard(_run(workdir, ["script.py"]))


def test_python_dash_c(workdir: Path) -> None:
    _check_no_guard(_run(workdir, ["-c", NO_GUARD]))


def test_standard_input(workdir: Path) -> None:
    _check_no_guard(_run(workdir, ["-"], stdin=NO_GUARD))


def test_plain_spawn_pool_fails_without_guard(workdir: Path) -> None:
    """What start_pool avoids: the same script on a plain spawn ProcessPoolExecutor breaks."""
    script = NO_GUARD.replace(
        "pool = start_pool(2, helper.init, (7,))",
        "import multiprocessing, concurrent.futures as cf\n"
        "pool = cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn'), initializer=helper.init, initargs=(7,))",
    )
    (workdir / "plain.py").write_text(script)
    proc = _run(workdir, ["plain.py"])
    assert proc.returncode != 0 and "BrokenProcessPool" in proc.stderr, proc.stdout + proc.stderr


def test_main_references_fall_back_to_importing_main(workdir: Path) -> None:
    """An initializer, or an object in a payload pickled ahead, defined in the script: the
    workers import the script (which then needs its main guard)."""
    script = textwrap.dedent("""
        print("TOP", flush=True)
        import pickle, helper
        from detaug.workers import start_pool

        def init(factor):
            helper.init(factor)

        class Thing:
            def __init__(self, factor):
                self.factor = factor

        if __name__ == "__main__":
            with start_pool(2, init, (3,)) as pool:
                print("RESULT", sum(pool.map(helper.job, range(4))), pool.hides_main, flush=True)
            with start_pool(1, helper.init_pickled, (pickle.dumps(Thing(5)),)) as pool:
                print("RESULT", sum(pool.map(helper.job, range(4))), pool.hides_main, flush=True)
    """)
    (workdir / "guarded.py").write_text(script)
    proc = _run(workdir, ["guarded.py"])
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("RESULT")] == ["RESULT 18 False", "RESULT 30 False"]
    assert proc.stdout.count("TOP") == 4  # the parent and the workers (as __mp_main__)


def test_main_references_without_a_main_file_are_refused(workdir: Path) -> None:
    """python -c / stdin / Jupyter: a worker cannot import __main__ at all: a clear error now."""
    script = textwrap.dedent("""
        import helper
        from detaug.workers import start_pool
        class Thing:
            factor = 2
        try:
            start_pool(1, helper.init, (Thing(),))
        except ValueError as err:
            print("REFUSED", "Thing" in str(err), "module" in str(err))
    """)
    proc = _run(workdir, ["-"], stdin=script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "REFUSED True True", proc.stdout + proc.stderr


def test_job_from_main_is_refused(workdir: Path) -> None:
    script = textwrap.dedent("""
        from detaug.workers import start_pool
        def f(x):
            return x
        pool = start_pool(1)
        try:
            pool.submit(f, 1)
        except ValueError as err:
            print("REFUSED", "main script" in str(err))
        print("STILL-WORKS", pool.submit(abs, -5).result())
    """)
    proc = _run(workdir, ["-c", script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["REFUSED True", "STILL-WORKS 5"], proc.stdout


def test_references_main(monkeypatch: pytest.MonkeyPatch) -> None:
    main = sys.modules["__main__"]

    def probe() -> None: ...

    probe.__module__, probe.__qualname__ = "__main__", "_detaug_probe"
    monkeypatch.setattr(main, "_detaug_probe", probe, raising=False)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert references_main(pickle.dumps(probe, protocol=protocol)), protocol
        assert references_main(pickle.dumps(["__main__", {"a": probe}, probe], protocol=protocol)), protocol  # memo reuse
        assert references_main(pickle.dumps([b"x", pickle.dumps(probe)], protocol=protocol)), protocol  # pickled ahead
        assert not references_main(pickle.dumps({"__main__": ["__main__", b"__main__"]}, protocol=protocol)), protocol
        assert not references_main(pickle.dumps((os.path.join, ("__main__", 1)), protocol=protocol)), protocol
    assert main_references(pickle.dumps([probe, probe])) == ["_detaug_probe"]


# -- signals: the parent's death, Ctrl-C ------------------------------------------------------------

RUNNING_JOBS = """
import helper, time
from detaug.workers import start_pool
pool = start_pool(WORKERS)
futures = [pool.submit(helper.nap, 30) for _ in range(2 * WORKERS)]
time.sleep(0.2)  # the jobs are running
print("READY", flush=True)
time.sleep(60)
"""

ITERATING = """
import collections, helper
from detaug.workers import start_pool
pool = start_pool(WORKERS)
ahead = collections.deque(pool.submit(helper.nap, 0.01) for _ in range(8))
n = 0
while True:  # a loader's loop: take the oldest job's result, submit one more
    ahead.popleft().result()
    ahead.append(pool.submit(helper.nap, 0.01))
    n += 1
    if n == 3:
        print("READY", flush=True)
"""


def _start_and_signal(workdir: Path, script: str, signum: int, *, group: bool) -> tuple[subprocess.Popen, set[int], str, float]:
    """Run ``script``; when it prints READY, send ``signum`` (to its process group with
    ``group``, as a terminal's Ctrl-C does); its process, descendants, stderr, seconds to exit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=workdir, env=_env(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    err: list[str] = []
    # Read stderr aside: workers left behind would hold it open.
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    try:
        ready = proc.stdout.readline().strip()
        assert ready == "READY", "".join(err) if proc.wait(5) is not None else "no READY"
        family = _descendants(proc.pid)
        start = time.monotonic()
        if group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the parent did not exit within 5 s of signal {signum}")
        seconds = time.monotonic() - start
        left = _wait_gone(family, 5.0)
        assert not left, f"processes left 5 s after the parent's exit: {sorted(left)}"
        reader.join(5)
        return proc, family, "".join(err), seconds
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sigterm_kills_the_workers(workdir: Path) -> None:
    """torchrun's SIGTERM: the parent dies at once (default action), its busy workers with it."""
    proc, family, _, _ = _start_and_signal(workdir, RUNNING_JOBS.replace("WORKERS", "2"), signal.SIGTERM, group=False)
    assert proc.returncode == -signal.SIGTERM
    assert len(family) >= 2  # the workers (and multiprocessing's resource tracker)


def test_sigkill_kills_the_workers(workdir: Path) -> None:
    proc, _, _, _ = _start_and_signal(workdir, RUNNING_JOBS.replace("WORKERS", "2"), signal.SIGKILL, group=False)
    assert proc.returncode == -signal.SIGKILL


def test_ctrl_c_while_iterating(workdir: Path) -> None:
    proc, _, err, seconds = _start_and_signal(workdir, ITERATING.replace("WORKERS", "2"), signal.SIGINT, group=True)
    assert "KeyboardInterrupt" in err, err
    assert "Traceback" in err and err.count("Traceback") == 1, err  # the workers ignored it: no second traceback
    assert proc.returncode != 0 and seconds < 5


def test_ctrl_c_with_busy_workers_exits_promptly(workdir: Path) -> None:
    """Ctrl-C while long jobs run and more are queued: the exit does not wait for them."""
    script = RUNNING_JOBS.replace("WORKERS", "2").replace("time.sleep(60)", "futures[0].result()")
    _, _, err, seconds = _start_and_signal(workdir, script, signal.SIGINT, group=True)
    assert "KeyboardInterrupt" in err, err
    assert seconds < 3, seconds


def test_ctrl_c_loop_subprocesses(workdir: Path) -> None:
    """Ctrl-C during iteration, repeated in fresh processes (one worker each): no hang."""
    script = ITERATING.replace("WORKERS", "1")
    for _ in range(50):
        proc, _, err, seconds = _start_and_signal(workdir, script, signal.SIGINT, group=True)
        assert "KeyboardInterrupt" in err and proc.returncode != 0 and seconds < 5, err


def test_ctrl_c_caught_keeps_the_pool(workdir: Path) -> None:
    """Jupyter's way: Ctrl-C interrupts the loop, the session goes on and uses the pool again
    (the workers, busy or idle, ignored the SIGINT that the terminal sent to the whole group)."""
    script = textwrap.dedent("""
        import collections, helper
        from detaug.workers import start_pool
        pool = start_pool(3)
        ahead = collections.deque([pool.submit(helper.nap, 0.01)])  # some workers idle, some busy
        try:
            for n in range(10**9):
                ahead.popleft().result()
                ahead.append(pool.submit(helper.nap, 0.01))
                if n == 3:
                    print("READY", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        print("AFTER", sum(pool.map(helper.nap, [0.0] * 4, timeout=10)) > 0, flush=True)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=workdir, env=_env(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout.readline().strip() == "READY"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert out.splitlines() == ["INTERRUPTED", "AFTER True"], out + err


@pytest.mark.parametrize("leak", ["future", "semaphore"])
def test_exit_with_a_lock_left_locked_by_ctrl_c(workdir: Path, leak: str) -> None:
    """A Ctrl-C that lands inside ``threading.Condition.__enter__`` (``future.result()``, or the
    executor's semaphore in ``submit``) leaves its lock locked and the executor's manager thread
    blocked on it; ``concurrent.futures`` would then wait for that thread at exit forever (seen:
    1 hang in 200 Ctrl-C on Python 3.12). Simulated here by taking the lock and exiting."""
    script = textwrap.dedent("""
        import time, helper
        from detaug.workers import start_pool
        pool = start_pool(1)
        future = pool.submit(helper.nap, 0.2)
        if LEAK == "future":
            future._condition.acquire()  # as if interrupted right after taking it
        else:
            pool._idle_worker_semaphore._cond.acquire()
        time.sleep(0.4)  # the job ends meanwhile: the manager thread blocks on the lock
        print("EXITING", flush=True)
    """).replace("LEAK", repr(leak))
    start = time.monotonic()
    proc = _run(workdir, ["-c", script], timeout=20)
    assert proc.returncode == 0 and "EXITING" in proc.stdout, proc.stderr
    assert time.monotonic() - start < 5


def test_interrupt_loop_in_process(workdir: Path) -> None:
    """50 times in this process: start a pool, iterate, get SIGINT, stop the pool."""
    import helper

    for _ in range(50):
        pool = start_pool(1)
        workers = set(pool._processes)
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            try:
                ahead = [pool.submit(helper.nap, 0.01) for _ in range(4)]
                while True:
                    ahead.pop(0).result()
                    ahead.append(pool.submit(helper.nap, 0.01))
            finally:
                start = time.monotonic()
                stop_pool(pool, wait=True)
                assert time.monotonic() - start < 2.5
        timer.join()
        assert not _wait_gone(workers, 1.0)


# -- stopping: stragglers, finalizers, threads, big payloads ----------------------------------------


def test_stop_pool_terminates_stragglers(workdir: Path) -> None:
    import helper

    pool = start_pool(2)
    workers = set(pool._processes)
    running = [pool.submit(helper.nap, 30) for _ in range(2)]
    queued = [pool.submit(helper.nap, 30) for _ in range(5)]
    time.sleep(0.3)
    start = time.monotonic()
    stop_pool(pool, wait=True, grace=0.2)
    assert time.monotonic() - start < 2.0
    assert not _wait_gone(workers, 0.5)
    assert all(f.cancelled() for f in queued[1:])  # one may have been in the call queue already
    assert all(f.done() for f in running)


def test_stop_pool_without_waiting_and_with_block(workdir: Path) -> None:
    import helper

    pool = start_pool(1)
    workers = set(pool._processes)
    pool.submit(helper.nap, 30)
    time.sleep(0.2)
    start = time.monotonic()
    stop_pool(pool, wait=False)
    assert time.monotonic() - start < 0.1
    assert not _wait_gone(workers, 4.0)
    stop_pool(pool, wait=True)  # idempotent

    start = time.monotonic()
    with start_pool(1) as pool:
        workers = set(pool._processes)
        pool.submit(helper.nap, 30)
    assert time.monotonic() - start < 3.5
    assert not _wait_gone(workers, 0.5)


def test_garbage_collected_owner_stops_its_pool(workdir: Path) -> None:
    """An owner's ``weakref.finalize(owner, stop_pool, pool, False)`` lets the owner be collected
    and stops the pool; so does dropping the pool itself."""
    import helper

    class Owner:
        def __init__(self) -> None:
            self.pool = start_pool(1)
            weakref.finalize(self, stop_pool, self.pool, False)

    owner = Owner()
    owner.pool.submit(helper.nap, 30)
    workers = set(owner.pool._processes)
    alive = weakref.ref(owner)
    del owner
    gc.collect()
    assert alive() is None
    assert not _wait_gone(workers, 4.0)

    pool = start_pool(1)
    workers = set(pool._processes)
    pool.submit(helper.nap, 30)
    del pool
    gc.collect()
    assert not _wait_gone(workers, 4.0)


def test_pool_started_from_a_short_lived_thread_survives_it(workdir: Path) -> None:
    """The parent-death signal follows the thread that spawned: workers are spawned from a lasting one."""
    import helper

    box = []
    thread = threading.Thread(target=lambda: box.append(start_pool(2, helper.init, (5,))))
    thread.start()
    thread.join()
    pool = box[0]
    try:
        time.sleep(0.2)
        assert list(pool.map(helper.job, range(4))) == [0, 5, 10, 15]
    finally:
        stop_pool(pool)


def test_large_initializer_payload(workdir: Path) -> None:
    import helper

    payload = os.urandom(3 * 1024 * 1024)
    assert len(payload) > PIPE_PAYLOAD_LIMIT
    start = time.monotonic()
    with start_pool(2, helper.init, (1, payload)) as pool:
        results = {pool.submit(helper.payload_digest).result() for _ in range(4)}
    import hashlib

    assert results == {(len(payload), hashlib.sha256(payload).hexdigest())}
    assert time.monotonic() - start < 10


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _ours(pid: int) -> set[str]:
    """The payload segments process ``pid`` made that are still in /dev/shm."""
    return {name for name in _shm_entries() if name.startswith(f"{SHARED_MEMORY_PREFIX}{pid}_")}


def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory is not in /dev/shm here")
def test_large_payload_shared_memory_is_unlinked(workdir: Path) -> None:
    """A payload over the pipe limit goes through a shared memory segment: it is unlinked as
    soon as every worker has read it (the pool still running), and stopping the pool before the
    workers have read it unlinks it too; its semaphore goes with it. Nothing of ours is left."""
    import helper

    payload = os.urandom(4 * PIPE_PAYLOAD_LIMIT)
    for stop_at_once in (False, True):
        pool = start_pool(2, helper.init, (1, payload))
        shared = pool._detaug_state.shared
        assert shared is not None and shared.name.startswith(f"{SHARED_MEMORY_PREFIX}{os.getpid()}_")
        sem_file = "sem." + shared.sem_name.lstrip("/")
        if not stop_at_once:
            assert pool.submit(helper.payload_digest).result(timeout=60)[0] == len(payload)
            assert _wait_until(lambda name=shared.name: name not in _shm_entries(), 10.0), "not unlinked once read"
            assert pool.submit(helper.payload_digest).result(timeout=60)[0] == len(payload)  # the pool goes on
        stop_pool(pool, wait=True)
        del pool
        gc.collect()
        assert shared.name not in _shm_entries() and not _ours(os.getpid())
        assert _wait_until(lambda name=sem_file: name not in _shm_entries(), 5.0), f"{sem_file} left in /dev/shm"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory is not in /dev/shm here")
def test_shared_memory_start_stop_loop_in_a_process_leaves_nothing(workdir: Path) -> None:
    """Start, use and stop pools with a large payload 20 times in a fresh process, then exit:
    no segment of that process is left, and multiprocessing's resource tracker does not warn
    (of leaked segments, or of unlinking one twice)."""
    script = textwrap.dedent("""
        import os, helper
        from detaug.workers import start_pool, stop_pool
        payload = os.urandom(200_000)
        for k in range(20):
            pool = start_pool(1 + k % 2, helper.init, (1, payload))
            if k % 3:
                assert pool.submit(helper.payload_digest).result(timeout=60)[0] == len(payload)
            stop_pool(pool, wait=True)
        print("PID", os.getpid(), flush=True)
    """)
    proc = _run(workdir, ["-c", script], timeout=120)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.split()[1])
    assert not _ours(pid)
    assert "resource_tracker" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr
