"""Where an export is written: its temporary folder (named with the exporter's PID), a stop by SIGTERM,
a killed export's leftovers, file modes, a read-only location and an output_dir that is a mount point.
"""
import errno
import os
import signal
import subprocess
import sys

import pytest

from support.export_checks import assert_nothing_left
from support.tiny_models import REPO, error_lines, run_cli, tiny_export_config, write_yaml


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_tracing_stops_cleanly(tiny_ckpt, tmp_path, sig):
    """Ctrl-C, or SIGTERM (a service manager's stop), while MindSpore compiles a graph: one error line,
    non-zero exit, no analyzer dump, nothing left behind (no output, no temporary folder, nothing in
    the working directory)."""
    out = str(tmp_path / "out" / "tiny")
    path = write_yaml(str(tmp_path / "export.yaml"), tiny_export_config(tiny_ckpt[0], out))
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--config", path], cwd=work,
                            env=dict(os.environ, PYTHONPATH=REPO, GLOG_v="3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "read and loaded the weights" in line:
            proc.send_signal(sig)    # the prefill graph is being traced now
            break
    _, rest_err = proc.communicate(timeout=120)
    stderr = "".join(seen) + rest_err
    assert proc.returncode == 1, stderr
    [line] = error_lines(stderr)
    assert line.startswith("error: interrupted"), stderr
    if sig == signal.SIGTERM:
        assert line.startswith("error: interrupted (SIGTERM)"), stderr
    assert "analyze" not in stderr.lower() and "Traceback" not in stderr
    assert os.listdir(work) == [], os.listdir(work)
    assert_nothing_left(out)


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_next_export_removes_temporary_folders_of_killed_exports(tiny_ckpt, tmp_path):
    """A `.export-<pid>-*` folder nobody holds is a killed export's: the next export beside it removes
    it. One held by a running export is left alone, even when its PID is not a live process here
    (an export in another container, another PID namespace, writing to the same volume): here the test
    process holds a folder named with a dead PID, as such an export would."""
    import fcntl
    out = str(tmp_path / "out")
    dead = tmp_path / f".export-{_dead_pid()}-abcd1234"
    elsewhere = tmp_path / f".export-{_dead_pid()}-efgh5678"
    for folder in (dead, elsewhere):
        (folder / "mindir_full_checkpoint").mkdir(parents=True)
        (folder / "mindir_full_checkpoint" / "rank_0_graph.mindir").write_bytes(b"half written")
    held = os.open(elsewhere, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        path = write_yaml(str(tmp_path / "export.yaml"), tiny_export_config(tiny_ckpt[0], out))
        result = run_cli(["-m", "exporter", "--config", path], timeout=180)
    finally:
        os.close(held)
    assert result.returncode == 0, result.stderr
    assert not dead.exists()
    assert (elsewhere / "mindir_full_checkpoint" / "rank_0_graph.mindir").exists()
    assert sorted(os.listdir(tmp_path)) == sorted(["export.yaml", "out", elsewhere.name])


def test_export_modes_follow_the_umask(tiny_ckpt, tmp_path):
    """Under umask 022 every folder of the export is 0755 and every file 0644 (not mkdtemp's 0700 nor
    MindSpore's 0400), so another user can read it."""
    out = str(tmp_path / "out")
    path = write_yaml(str(tmp_path / "export.yaml"), tiny_export_config(tiny_ckpt[0], out))
    result = subprocess.run([sys.executable, "-m", "exporter", "--config", path], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO, GLOG_v="3"), preexec_fn=lambda: os.umask(0o022),
                            timeout=180)
    assert result.returncode == 0, result.stderr
    modes = {os.path.relpath(os.path.join(root, n), out): oct(os.stat(os.path.join(root, n)).st_mode & 0o777)
             for root, dirs, files in os.walk(out) for n in dirs + files}
    modes["."] = oct(os.stat(out).st_mode & 0o777)
    assert "mindir_full_checkpoint/rank_0_graph.mindir" in modes
    wrong = {rel: mode for rel, mode in modes.items()
             if mode != (oct(0o755) if os.path.isdir(os.path.join(out, rel)) else oct(0o644))}
    assert not wrong, wrong


def _read_only(monkeypatch, folder):
    """Make creating anything in `folder` fail as on a read-only filesystem (the tests run as root,
    whom permission bits do not stop), and fail the test if the export starts tracing."""
    import exporter.writing.export as export_module
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if os.path.abspath(path).startswith(str(folder) + os.sep):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_mkdir(path, *args, **kwargs)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(export_module, "_trace_all", lambda *a: pytest.fail("traced before checking output_dir"))


@pytest.mark.parametrize("sub", [[], ["new", "nested"]], ids=["parent_exists", "parents_to_create"])
def test_read_only_output_location_is_one_line_before_tracing(tiny_ckpt, tmp_path, monkeypatch, capsys, sub):
    from exporter.cli import main
    read_only = tmp_path / "ro"
    read_only.mkdir()
    out = str(read_only.joinpath(*sub, "out"))
    path = write_yaml(str(tmp_path / "export.yaml"), tiny_export_config(tiny_ckpt[0], out))
    _read_only(monkeypatch, read_only)
    assert main(["--config", path]) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert line == (f"error: output_dir {out}: the folder {read_only} is not writable (Read-only file system); "
                    "choose a writable output_dir")
    assert os.listdir(read_only) == []


def _old_and_new_export(tmp_path):
    """An older export at `target` (a folder standing for a mount point) and a finished one in `tmp`."""
    target, tmp = tmp_path / "volume", tmp_path / ".export-1-new"
    (target / "mindir_full_checkpoint").mkdir(parents=True)
    (target / "manifest.json").write_text("old")
    (target / "stale.txt").write_text("from the old export")
    (target / "mindir_full_checkpoint" / "rank_0_graph.mindir").write_bytes(b"old graph")
    (tmp / "mindir_full_checkpoint").mkdir(parents=True)
    (tmp / "manifest.json").write_text("new")
    (tmp / "mindir_full_checkpoint" / "rank_0_graph.mindir").write_bytes(b"new graph")
    return str(tmp), str(target)


def _assert_replaced_in_place(tmp, target, inode):
    assert os.stat(target).st_ino == inode   # the same folder, filled again
    assert sorted(os.listdir(target)) == ["manifest.json", "mindir_full_checkpoint"]
    with open(os.path.join(target, "manifest.json")) as f:
        assert f.read() == "new"
    with open(os.path.join(target, "mindir_full_checkpoint", "rank_0_graph.mindir"), "rb") as f:
        assert f.read() == b"new graph"
    assert not os.path.exists(tmp)
    assert sorted(os.listdir(os.path.dirname(target))) == ["volume"]   # no .old-* / .export-* folder


@pytest.mark.fast
def test_replace_dir_fills_a_mount_point_simulated_by_ismount(tmp_path, monkeypatch):
    """An output_dir that is a mount point cannot be renamed: the new export's entries replace the old
    one's inside it (os.path.ismount monkeypatched: tests cannot mount)."""
    from exporter.writing.output_folder import _replace_dir
    tmp, target = _old_and_new_export(tmp_path)
    inode = os.stat(target).st_ino
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: os.path.abspath(p) == target or real_ismount(p))
    _replace_dir(tmp, target)
    _assert_replaced_in_place(tmp, target, inode)


@pytest.mark.fast
def test_replace_dir_fills_a_folder_whose_rename_is_busy_simulated_ebusy(tmp_path, monkeypatch):
    """Renaming the old export away fails with EBUSY (as for a mount point os.path.ismount misses):
    the entries are moved instead (os.rename monkeypatched to fail so)."""
    from exporter.writing.output_folder import _replace_dir
    tmp, target = _old_and_new_export(tmp_path)
    inode = os.stat(target).st_ino
    real_rename = os.rename

    def rename(src, dst, *args, **kwargs):
        if os.path.abspath(src) == target:
            raise OSError(errno.EBUSY, "Device or resource busy", src)
        return real_rename(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, "rename", rename)
    _replace_dir(tmp, target)
    _assert_replaced_in_place(tmp, target, inode)


STOPPED_WHILE_COPYING = """
import os, runpy, signal, sys
import exporter.writing.output_folder as export
link_or_copy = export._link_or_copy
def copy_then_stop(src, dest):      # a service manager's SIGTERM arriving during the first infer: copy
    link_or_copy(src, dest)
    os.kill(os.getpid(), signal.SIGTERM)
export._link_or_copy = copy_then_stop
sys.argv = ["exporter"] + sys.argv[1:]
runpy.run_module("exporter", run_name="__main__")
"""


def test_sigterm_while_writing_the_infer_copies_removes_them_and_keeps_the_export(tiny_ckpt, tmp_path):
    out, copies = str(tmp_path / "out"), tmp_path / "copies"
    infer = {"prefill_model_path": str(copies / "tiny_prefill_graph.mindir"),
             "increment_model_path": str(copies / "tiny_inc_graph.mindir")}
    path = write_yaml(str(tmp_path / "export.yaml"), tiny_export_config(tiny_ckpt[0], out, infer=infer))
    result = run_cli(["-c", STOPPED_WHILE_COPYING, "--config", path], timeout=180)
    assert result.returncode == 1, result.stderr
    [line] = error_lines(result.stderr)
    assert line == (f"error: interrupted (SIGTERM): the export in {out} is complete; the infer: copies begun "
                    "were removed"), line
    assert os.listdir(copies) == []
    from lite_runtime.contract.manifest import load_manifest
    load_manifest(out).verify_files()
