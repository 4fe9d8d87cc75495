"""The export's folder, written as one transaction: an export never leaves a half-written folder that
looks valid.

The export is assembled in a temporary folder beside `output_dir` and renamed into place at the end
(`export_folder`). The temporary folder's name holds the exporter's PID (`.export-<pid>-xxxx`), and the
exporter holds a lock on it while it writes: one left by a killed export, which nobody holds, is
removed by the next export beside it. Upstream's `infer:` copies of the graphs are written once the
export is in place (`write_infer_copies`).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import tempfile
from typing import Dict, Iterator, List

from lite_runtime.contract.errors import ConfigError
from lite_runtime.contract.hashes import file_sha256
from lite_runtime.contract.manifest import MANIFEST_NAME, Manifest, copy_manifest, copy_manifest_path, graph_relpath
from lite_runtime.contract.mindir import SPLIT_GRAPH_SUFFIX
from exporter.config.mindformers import MF_DEFAULT_OUTPUT_DIR
from exporter.config.schema import ExportConfig
from exporter.writing.progress import check_interrupt

log = logging.getLogger("exporter")
TEMP_PREFIX = ".export-"
_TEMP_PID = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-")
_held: Dict[str, int] = {}     # the temporary folders this process holds (_hold), and their descriptors


@contextlib.contextmanager
def export_folder(config: ExportConfig) -> Iterator[str]:
    """A temporary folder to write the export into (made first, so a folder that cannot be written is
    found before any tracing); moved to `output_dir` when the block ends, removed with the parent
    folders it made when the block fails."""
    parent = os.path.dirname(os.path.abspath(config.output_dir)) or "."
    created = _missing_folders(parent)
    tmp = _make_temp_dir(config, parent, created)
    try:
        yield tmp
        _follow_umask(tmp)
        _replace_dir(tmp, config.output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise
    finally:
        _release(tmp)


def check_room(folder: str, needed: int, what: str, source: str) -> None:
    """Refuse, before writing them, `needed` bytes that `folder`'s file system has no room for (Lite's
    converter reports a full disk only as "Common error code")."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise ConfigError(f"{source}: {what} needs about {needed / 2**30:.1f} GiB in {os.path.dirname(folder)} "
                          f"and its file system has {free / 2**30:.1f} GiB free: free some space or give an "
                          "output_dir on a larger disk")


def default_output_note(config: ExportConfig) -> str:
    return (f"MindFormers' default output_dir {MF_DEFAULT_OUTPUT_DIR} of the working directory: "
            f"{config.source} sets no output_dir")


def check_output_dir(config: ExportConfig) -> None:
    path = config.output_dir
    where = f" ({default_output_note(config)})" if config.output_dir_default else ""
    fix = "set output_dir in the yaml or give --output_dir" if config.output_dir_default else \
        "choose another folder or empty it"
    if os.path.isfile(path):
        raise ConfigError(f"output_dir {path}{where} is a file; {fix}")
    if os.path.isdir(path) and os.listdir(path) and not os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        raise ConfigError(f"output_dir {path}{where} exists and is not an export (no {MANIFEST_NAME}); "
                          f"refusing to overwrite it: {fix}")


def check_infer_copies(config: ExportConfig) -> None:
    """The `infer:` copy paths can be written: found before the tracing, not after it."""
    for key in ("prefill_model_path", "increment_model_path"):
        dest = getattr(config.infer, key)
        if not dest:
            continue
        where = f"{config.source}: infer.{key} {dest}"
        if os.path.isdir(dest):
            raise ConfigError(f"{where} is a folder; give the path of the graph file to write (…/name.mindir)")
        folder = os.path.dirname(os.path.abspath(dest))
        while not os.path.isdir(folder):
            if os.path.lexists(folder):
                raise ConfigError(f"{where}: {folder} is a file, not a folder; choose another path")
            folder = os.path.dirname(folder)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"{where}: the folder {folder} is not writable; choose a writable path")


def _make_temp_dir(config: ExportConfig, parent: str, created: List[str]) -> str:
    """The export's temporary folder in `parent` (made first, so a folder that cannot be written is
    found before any tracing)."""
    folder = parent
    try:
        os.makedirs(parent, exist_ok=True)
        if os.path.ismount(config.output_dir):   # written entry by entry at the end (_replace_dir): probe it
            folder = config.output_dir
            os.rmdir(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=folder))
            folder = parent
        _remove_stale_temp_dirs(parent)
        tmp = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=parent)
        _hold(tmp)
        return tmp
    except OSError as e:
        _remove_empty(created)
        while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        raise ConfigError(f"output_dir {config.output_dir}: the folder {folder} is not writable ({e.strerror}); "
                          "choose a writable output_dir") from None


def _follow_umask(folder: str) -> None:
    """Give the export the modes the umask asks for: mkdtemp makes its folder 0700 and MindSpore writes
    graphs 0400, which other users (a service account) could not read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)


def _hold(folder: str) -> None:
    """Lock `folder` for as long as this process lives: the kernel drops the lock when the process ends,
    however it ends, so a folder nobody holds is a killed export's, even one of another container
    (another PID namespace, where its PID means nothing) writing to the same volume."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:      # a file system without locks: the next export goes by the PID alone
        os.close(fd)
        return
    _held[folder] = fd


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's live process
        return True
    return True


def _release(folder: str) -> None:
    fd = _held.pop(folder, None)
    if fd is not None:
        os.close(fd)


def _remove_stale_temp_dirs(parent: str) -> None:
    """Remove the temporary folders in `parent` of exports that were killed: those nobody holds."""
    for name in os.listdir(parent):
        match = _TEMP_PID.match(name)
        if not match:
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:      # a running export's
            continue
        except OSError:              # no locks on this file system
            if _process_alive(int(match.group(1))):
                continue
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed %s, left by an export (pid %s) that was killed", path, match.group(1))


def _missing_folders(path: str) -> List[str]:
    """`path` and those of its ancestors that do not exist yet, deepest first."""
    missing = []
    while path and not os.path.exists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _remove_empty(folders: List[str]) -> None:
    """Undo `os.makedirs` of a failed export: remove the folders it created, deepest first, while empty."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return


def _replace_dir(tmp: str, target: str) -> None:
    """Move the finished export into place; an older export at `target` is replaced whole. A `target`
    that cannot be renamed (a mount point, such as a container volume) gets the export's entries instead."""
    if os.path.ismount(target):
        _move_entries(tmp, target)
        return
    old = None
    if os.path.exists(target):
        old = target + ".old-" + os.path.basename(tmp)
        try:
            os.rename(target, old)
        except OSError as e:
            if e.errno not in (errno.EBUSY, errno.EXDEV):
                raise
            _move_entries(tmp, target)
            return
    os.rename(tmp, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _move_entries(tmp: str, target: str) -> None:
    """Replace the entries of `target` (an older export, checked by `check_output_dir`) by those of `tmp`.
    The manifest goes out first and in last, so a folder left half-moved is never taken for an export."""
    for name in sorted(os.listdir(target), key=lambda n: n != MANIFEST_NAME):
        path = os.path.join(target, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    for name in sorted(os.listdir(tmp), key=lambda n: n == MANIFEST_NAME):
        shutil.move(os.path.join(tmp, name), os.path.join(target, name))
    os.rmdir(tmp)


def write_infer_copies(config: ExportConfig, manifest: Manifest) -> None:
    """Upstream `infer.prefill_model_path` / `increment_model_path`: copies of the rank-0 graphs (with
    their weight data files, if any), each with `<copy>.manifest.json` beside it: the export's
    manifest with paths relative to that folder (the copies for their graphs, the export's files for
    the rest), so the runtime runs the copies by their paths alone. One such file per copy, named
    after it: copies of several exports may share a folder."""
    copies, hashes = {}, {}
    outcome = f"the export in {config.output_dir} is complete; the infer: copies begun were removed"
    try:
        for kind, dest in (("prefill", config.infer.prefill_model_path),
                           ("increment", config.infer.increment_model_path)):
            name = graph_relpath(kind, 0)
            src = os.path.join(config.output_dir, name)
            if dest and os.path.realpath(dest) != os.path.realpath(src):   # not the export's own graph
                check_interrupt(outcome)
                os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
                copies[name] = dest
                if manifest.external_data.get(name):
                    hashes[name] = _copy_split_graph(src, dest, name, copies)
                else:
                    _link_or_copy(src, dest)
        for name in (graph_relpath(kind, 0) for kind in ("prefill", "increment")):
            if name not in copies:
                continue
            check_interrupt(outcome)
            folder = os.path.dirname(os.path.abspath(copies[name]))
            pointer = copy_manifest(manifest, config.output_dir, copies, folder, hashes)
            manifest_name = os.path.basename(copy_manifest_path(copies[name]))
            pointer.save(folder, manifest_name + ".tmp")
            os.replace(os.path.join(folder, manifest_name + ".tmp"), os.path.join(folder, manifest_name))
        check_interrupt(outcome)
    except BaseException:
        _remove_copies(copies)
        raise


def _remove_copies(copies: dict) -> None:
    """The copies `write_infer_copies` began (graphs, data files, their `.tmp` and `.manifest.json`)."""
    for path in copies.values():
        for leftover in (path, path + ".tmp", copy_manifest_path(path), copy_manifest_path(path) + ".tmp"):
            if os.path.lexists(leftover):
                os.remove(leftover)
        if path.endswith(".mindir"):
            shutil.rmtree(path[:-len(".mindir")].removesuffix(SPLIT_GRAPH_SUFFIX) + "_variables", ignore_errors=True)


def _copy_split_graph(src: str, dest: str, name: str, copies: dict) -> str:
    """Copy a graph whose weights are external data: its data files go to `<dest stem>_variables/`
    (the prefill and increment copies may share a folder, and each export graph's data folder is
    `rank_0_variables`), and the copy's graph records their new location. Returns its sha256."""
    from lite_runtime.contract.mindir import write_relocated
    stem = os.path.basename(dest)[: -len(".mindir")] if dest.endswith(".mindir") else os.path.basename(dest)
    if stem.endswith(SPLIT_GRAPH_SUFFIX):
        stem = stem[: -len(SPLIT_GRAPH_SUFFIX)]
    folder = os.path.dirname(os.path.abspath(dest))
    locations = write_relocated(src, dest + ".tmp", stem + "_variables")
    for old, new in locations.items():
        os.makedirs(os.path.dirname(os.path.join(folder, new)), exist_ok=True)
        _link_or_copy(os.path.join(os.path.dirname(src), old), os.path.join(folder, new))
        copies[os.path.normpath(os.path.join(os.path.dirname(name), old))] = os.path.join(folder, new)
    os.replace(dest + ".tmp", dest)
    return file_sha256(dest)


def _link_or_copy(src: str, dest: str) -> None:
    """`dest` as a hard link to `src` where the file system allows (a data file of a large model is
    gigabytes), else a copy; replaced atomically."""
    tmp = dest + ".tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
