"""A server in a child process, for the tools and tests that drive it from outside as clients do (not
part of the product: `python -m lite_runtime.serve` is)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from lite_runtime.contract.errors import ToolchainError
from lite_runtime.distributed.process_group import free_port


@dataclass
class ServerProcess:
    url: str                    # http://127.0.0.1:PORT
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_bytes(self, peak: bool = False) -> int:
        """The server's resident set size now (or its peak so far)."""
        field = "VmHWM:" if peak else "VmRSS:"
        with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith(field))
        return kb * 1024

    def thread_seconds(self) -> dict:
        """CPU seconds (user + system) each of the server's threads has used so far: {thread id: seconds}; the
        main thread (id = pid) runs the event loop and the HTTP side."""
        seconds, tick = {}, os.sysconf("SC_CLK_TCK")
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat", encoding="ascii") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:     # a thread that ended meanwhile
                continue
            seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / tick     # utime, stime
        return seconds


@contextlib.contextmanager
def served(model_dir: str, backend: str = "mslite", name: str = "model", extra: Sequence[str] = (),
           cwd: Optional[str] = None, start_timeout: float = 120.0, stop_timeout: float = 60.0,
           output=subprocess.PIPE, launcher: Sequence[str] = ()) -> Iterator[ServerProcess]:
    """`python -m lite_runtime.serve` on a free port of 127.0.0.1, yielded once /health answers; stopped by
    SIGTERM on leaving. With `launcher` (its options: --rank_table FILE ...) the server runs on rank 0 of a
    launched run, and `proc` is the launcher. A server that does not start, or does not exit 0 when
    stopped, raises ToolchainError with its output."""
    port = free_port()
    launch = [sys.executable, "-m", "lite_runtime.cli.launch", *launcher, "--"] if launcher else [sys.executable]
    proc = subprocess.Popen(launch + ["-m", "lite_runtime.serve", "--model_dir", model_dir, "--backend", backend,
                                      "--port", str(port), "--served_model_name", name, *extra], cwd=cwd,
                            env=dict(os.environ, GLOG_v="3"), stdout=output, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    said = proc.communicate()[0] if output == subprocess.PIPE else ""
                    raise ToolchainError(f"the server of {model_dir} did not start within {start_timeout:.0f} s: "
                                         f"{said or '(see its output)'}") from None
                time.sleep(0.2)
        yield ServerProcess(url, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            said, code = proc.communicate(timeout=stop_timeout)[0], proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            said, code = proc.communicate()[0], "none (killed)"
    if code != 0:
        raise ToolchainError(f"the server of {model_dir} exited with code {code} when stopped: {said or ''}")
