"""The tests' exports, each run by the exporter's own command line (`python -m exporter --config X`'s
`main`) in a long-lived exporter process per interpreter (MindSpore 2.10's, MindSpore 2.0's) of each test
worker: importing MindSpore and setting up its graph mode took 3-4 s of each export, a tenth of the suite.
Each export gets the caller's environment and its own stdout and stderr (file descriptors 1 and 2, so
MindSpore's C++ log too), and its exit code, as a process of its own would; a worker that dies or hangs is
replaced. What only a fresh process shows (the console script, exit codes of the interpreter, the memory
of one export) is tested with `run_cli` instead."""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import tempfile
from typing import Dict, NamedTuple

SERVE = r"""
import json, os, sys, traceback
from exporter.cli import main
replies = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    request = json.loads(line)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    try:
        code = main(["--config", request["config"]])
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush(); sys.stderr.flush()
    for fd, old in zip((1, 2), saved):
        os.dup2(old, fd)
        os.close(old)
    replies.write(json.dumps({"code": 0 if code is None else code if isinstance(code, int) else 1}) + "\n")
    replies.flush()
"""


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


class _Worker:
    def __init__(self, python: str, cwd: str):
        self.process = subprocess.Popen([python, "-c", SERVE], cwd=cwd, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env=dict(os.environ, PYTHONPATH=cwd, GLOG_v="3"))

    def export(self, config: str, env: Dict[str, str], cwd: str, timeout: float) -> Result:
        with tempfile.TemporaryDirectory() as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            request = {"config": config, "env": env, "cwd": cwd, "stdout": out, "stderr": err}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], timeout)
            reply = self.process.stdout.readline() if ready else ""
            if not reply:
                self.close()
                raise RuntimeError(f"the export worker ({self.process.args[0]}) "
                                   + ("died" if ready else f"took over {timeout} s") + f" exporting {config}:\n"
                                   + (open(err).read()[-3000:] if os.path.exists(err) else ""))
            return Result(json.loads(reply)["code"], open(out).read(), open(err).read())

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_workers: Dict[str, _Worker] = {}


def export(config: str, python: str, cwd: str, env: Dict[str, str], timeout: float = 300) -> Result:
    """`python -m exporter --config CONFIG` in `python`'s export worker."""
    worker = _workers.get(python)
    if worker is None or worker.process.poll() is not None:
        worker = _workers[python] = _Worker(python, cwd)
    try:
        return worker.export(config, env, cwd, timeout)
    except RuntimeError:
        _workers.pop(python, None)
        raise


@atexit.register
def _close_all():
    for worker in _workers.values():
        worker.close()
