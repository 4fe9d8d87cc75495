"""What a long export shows while it runs: each stage with its time, and Ctrl-C that stops cleanly.

MindSpore's graph compiler polls for signals and, on Ctrl-C, aborts with a long analyzer dump and an
`analyze_fail.ir` file in the working directory. While an export runs, SIGINT and SIGTERM (a service
manager's or container's stop) only set a flag; the export checks it between stages and stops there,
removing what it had written.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time

from lite_runtime.contract.errors import ToolchainError

log = logging.getLogger("exporter")
_interrupted = threading.Event()
_SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
_received = []


class Interrupted(ToolchainError):
    pass


@contextlib.contextmanager
def stage(what: str):
    """Log `what` with its duration when it ends; stop first if Ctrl-C was pressed."""
    check_interrupt()
    start = time.perf_counter()
    yield
    log.info("%s (%.1f s)", what, time.perf_counter() - start)
    check_interrupt()


def check_interrupt(outcome: str = "the export stopped and removed what it had written") -> None:
    if _interrupted.is_set():
        name = _SIGNAL_NAMES.get(_received[-1], "a signal") if _received else "a signal"
        raise Interrupted(f"interrupted ({name}): {outcome}")


@contextlib.contextmanager
def deferred_interrupts():
    """SIGINT and SIGTERM set a flag instead of raising inside MindSpore or killing the process
    (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _interrupted.clear()
    _received.clear()

    def handler(signum, _frame):
        _received.append(signum)
        _interrupted.set()
    previous = {sig: signal.signal(sig, handler) for sig in _SIGNAL_NAMES}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
