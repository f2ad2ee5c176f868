"""Writing the output: signals during the write, temporary files of killed runs, I/O errors
that name the output, --version. Real signals and real processes (subprocesses where the
process is meant to die)."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from converters import cli
from converters import atomic_output
from converters.atomic_output import remove_stale_temp_files, temp_path
from converters.coco import write_coco_json
from tests.converters.helpers import make_voc, obj, voc_xml

REPO = Path(__file__).resolve().parents[2]
TEMP = re.compile(r"\.out\.json\.tmp-(\d+)-[0-9a-f]{8}\Z")


def dataset(tmp_path: Path) -> Path:
    return make_voc(tmp_path / "VOC", {"a.xml": voc_xml("a.jpg", (32, 24), [
        obj("cat", (1, 1, 10, 10))])})


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMP.match(p.name))


def small() -> dict:
    return {"images": [{"id": 1}], "annotations": []}


# ---------------------------------------------------------------------------------------------
# In this process: the handlers, restored


def test_temp_file_name_pattern(tmp_path: Path) -> None:
    name = temp_path(tmp_path / "out.json")
    assert name.parent == tmp_path and TEMP.match(name.name)
    assert int(TEMP.match(name.name)[1]) == os.getpid()
    assert temp_path(tmp_path / "out.json") != name


def test_sigint_during_write_removes_temp_and_raises_keyboard_interrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.json"
    path.write_text('{"old": true}', encoding="utf-8")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    seen: list[list[str]] = []

    def fsync_then_ctrl_c(fd: int) -> None:
        seen.append(temps(tmp_path))  # the temporary file exists now
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(atomic_output.os, "fsync", fsync_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        write_coco_json(small(), path)
    assert len(seen) == 1 and len(seen[0]) == 1
    assert temps(tmp_path) == [] and path.read_text(encoding="utf-8") == '{"old": true}'
    assert {s: signal.getsignal(s) for s in before} == before


def test_sigterm_goes_to_the_previous_handler_after_cleanup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminated(Exception):
        pass

    calls: list[tuple[int, list[str]]] = []

    def previous(signum: int, frame: object) -> None:
        calls.append((signum, temps(tmp_path)))
        raise Terminated

    monkeypatch.setattr(atomic_output.os, "fsync",
                        lambda fd: signal.raise_signal(signal.SIGTERM))
    old = signal.signal(signal.SIGTERM, previous)
    try:
        with pytest.raises(Terminated):
            write_coco_json(small(), tmp_path / "out.json")
        assert calls == [(signal.SIGTERM, [])]  # called once, after the temp file went
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, old)
    assert list(tmp_path.iterdir()) == []


def test_previous_handler_that_returns_gives_an_error_naming_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic_output.os, "fsync",
                        lambda fd: signal.raise_signal(signal.SIGTERM))
    old = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with pytest.raises(InterruptedError) as info:
            write_coco_json(small(), tmp_path / "out.json")
    finally:
        signal.signal(signal.SIGTERM, old)
    assert info.value.filename == str(tmp_path / "out.json") and "SIGTERM" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_ignored_signals_stay_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handlers: list[object] = []
    monkeypatch.setattr(atomic_output.os, "fsync",
                        lambda fd: handlers.append(signal.getsignal(signal.SIGTERM)))
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        write_coco_json(small(), tmp_path / "out.json")
    finally:
        signal.signal(signal.SIGTERM, old)
    assert handlers == [signal.SIG_IGN] and json.loads((tmp_path / "out.json").read_bytes())


# ---------------------------------------------------------------------------------------------
# Stale temporary files


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / f".out.json.tmp-{dead_pid()}-0123abcd"
    mine = tmp_path / f".out.json.tmp-{os.getpid()}-0123abcd"
    parent = tmp_path / f".out.json.tmp-{os.getppid()}-0123abcd"
    other = tmp_path / f".other.json.tmp-{dead_pid()}-0123abcd"
    for path in (dead, mine, parent, other):
        path.write_text("half")
    assert remove_stale_temp_files(tmp_path / "out.json") == [dead]
    assert not dead.exists() and mine.exists() and parent.exists() and other.exists()
    assert remove_stale_temp_files(tmp_path / "nowhere" / "out.json") == []
    dead.write_text("half")
    with pytest.warns(RuntimeWarning, match="removed 1 temporary file"):
        write_coco_json(small(), tmp_path / "out.json")
    assert not dead.exists()


# ---------------------------------------------------------------------------------------------
# Real processes: SIGTERM, SIGINT, SIGKILL during the write

SLOW_WRITER = textwrap.dedent("""
    import os, sys, time
    real_fsync = os.fsync
    def slow_fsync(fd):
        real_fsync(fd)
        print("WRITING", flush=True)
        time.sleep(30)
    os.fsync = slow_fsync
    from converters.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def start_slow_writer(root: Path, out: Path) -> subprocess.Popen:
    """voc2coco in a subprocess that stops inside the write (temporary file complete, not yet
    renamed) and says so on stdout."""
    process = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(root), "-o", str(out)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 20)
    line = process.stdout.readline() if ready else ""
    if line.strip() != "WRITING":
        process.kill()
        pytest.fail(f"the writer did not reach the write: {line!r} {process.communicate()}")
    return process


@pytest.mark.parametrize("signum, returncode, message", [
    (signal.SIGTERM, -signal.SIGTERM, ""),
    (signal.SIGINT, 130, "voc2coco: interrupted while writing"),
])
def test_signal_during_write_leaves_no_temp_file(tmp_path: Path, signum: int, returncode: int,
                                                 message: str) -> None:
    root = dataset(tmp_path)
    out = tmp_path / "out" / "out.json"
    process = start_slow_writer(root, out)
    assert len(temps(out.parent)) == 1
    process.send_signal(signum)
    _, err = process.communicate(timeout=20)
    assert process.returncode == returncode, err
    assert message in err
    assert list(out.parent.iterdir()) == []  # no output, no temporary file


def test_temp_file_of_a_killed_run_is_removed_by_the_next(tmp_path: Path) -> None:
    root = dataset(tmp_path)
    out = tmp_path / "out.json"
    process = start_slow_writer(root, out)
    process.kill()  # SIGKILL: no handler runs
    process.communicate(timeout=20)
    left = temps(tmp_path)
    assert len(left) == 1 and int(TEMP.match(left[0])[1]) == process.pid
    completed = subprocess.run([sys.executable, "-m", "converters.cli", str(root), "-o",
                                str(out)], cwd=REPO, capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    assert f"voc2coco: removed {tmp_path / left[0]}, left by a killed run" in completed.stderr
    assert temps(tmp_path) == [] and len(json.loads(out.read_bytes())["images"]) == 1


# ---------------------------------------------------------------------------------------------
# I/O errors name the output


def test_full_disk_names_the_output(tmp_path: Path) -> None:
    """A file-size limit makes the write fail with EFBIG, as a full disk fails with ENOSPC."""
    root = make_voc(tmp_path / "VOC", {f"{i:03d}.xml": voc_xml(f"{i:03d}.jpg", (32, 24), [
        obj("cat", (1, 1, 10, 10))]) for i in range(40)})
    out = tmp_path / "out.json"

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    completed = subprocess.run([sys.executable, "-m", "converters.cli", str(root), "-o",
                                str(out), "-q"], cwd=REPO, capture_output=True, text=True,
                               check=False, preexec_fn=limit)
    assert completed.returncode == 2
    assert completed.stderr == f"voc2coco: error: cannot write {out}: File too large\n"
    assert list(tmp_path.iterdir()) == [root]


def test_enospc_from_the_api_names_the_output(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")  # what fsync says on a full disk

    monkeypatch.setattr(atomic_output.os, "fsync", full)
    with pytest.raises(OSError) as info:
        write_coco_json(small(), tmp_path / "out.json")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []
    root = dataset(tmp_path / "d")
    code = cli.main([str(root), "-o", str(tmp_path / "out.json"), "-q"])
    assert code == 2


def test_output_under_a_file_names_the_output(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out.json"
    assert cli.main([str(dataset(tmp_path)), "-o", str(out), "-q"]) == 2
    assert capsys.readouterr().err == (f"voc2coco: error: cannot write {out}: Not a directory "
                                       f"({tmp_path / 'file'} is a file)\n")
    with pytest.raises(NotADirectoryError) as info:
        write_coco_json(small(), out)
    assert info.value.filename == str(out)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_names_the_output(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        out = folder / "out.json"
        assert cli.main([str(dataset(tmp_path)), "-o", str(out), "-q"]) == 2
        assert capsys.readouterr().err == (f"voc2coco: error: cannot write {out}: "
                                           "Permission denied\n")
    finally:
        folder.chmod(0o755)


def test_unlistable_annotations_folder_is_one_line_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from converters import voc_inputs

    def denied(path: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(voc_inputs.os, "scandir", denied)
    root = dataset(tmp_path)
    assert cli.main([str(root), "-o", str(tmp_path / "o.json")]) == 2
    assert capsys.readouterr().err == (f"voc2coco: error: {root / 'Annotations'}: "
                                       "Permission denied\n")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert re.fullmatch(r"voc2coco \(detaug \S+\)\n", capsys.readouterr().out)
    completed = subprocess.run([sys.executable, "-m", "converters.cli", "--version"], cwd=REPO,
                               capture_output=True, text=True, check=False)
    assert completed.returncode == 0 and completed.stdout.startswith("voc2coco (detaug ")

