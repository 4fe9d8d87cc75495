"""What every command line of the project shares: user mistakes are one `error:` line on stderr
and a non-zero exit, never a usage block or a traceback."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from lite_runtime.contract.errors import ToolchainError


class OneLineParser(argparse.ArgumentParser):
    """argparse whose argument mistakes are one line (exit 2) instead of the usage block."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def report_errors(run: Callable[[], object]) -> int:
    """Call `run()`; a ToolchainError becomes one `error:` line and exit code 1."""
    try:
        code = run()
    except ToolchainError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0
