"""`lite-setup [--prefix DIR] [--wheel FILE]` (also `python -m lite_runtime.cli.lite_setup`): install
MindSpore Lite 2.0's C++ runtime and build the shim the `mslite` backend loads (lite_install.py)."""
from __future__ import annotations

import os
import sys

import click

from lite_runtime.backends.lite_install import SHIM_ENV, WHEEL_NAME, install, shim_candidates, user_prefix
from lite_runtime.contract.command_line import CONTEXT, entry_point


@click.command(context_settings=CONTEXT)
@click.option("--prefix", default=None, help="Install here instead of the per-user location "
              "($XDG_DATA_HOME/llm-lite-export/lite, default ~/.local/share/llm-lite-export/lite); the runtime "
              f"then needs ${SHIM_ENV}=PREFIX/lib/liblite_shim.so.")
@click.option("--wheel", default=None, help=f"An already downloaded {WHEEL_NAME} to use (its sha256 is "
              "checked) instead of downloading it with pip.")
@click.option("--cxx", default=lambda: os.environ.get("CXX", "g++"), show_default="$CXX, else g++",
              help="The C++ compiler that builds the shim.")
def command(prefix, wheel, cxx):
    """Download MindSpore Lite 2.0 from PyPI, check its sha256, extract its C++ libraries and build the
    project's shim against them with the system compiler."""
    shim = install(prefix or user_prefix(), wheel, cxx, say=lambda line: click.echo(f"lite-setup: {line}"))
    if shim not in [path for path, _ in shim_candidates()]:
        click.echo(f"lite-setup: the runtime looks for the shim elsewhere; set {SHIM_ENV}={shim}")
    click.echo(f"lite-setup: done; the mslite backend loads {shim}")


main = entry_point(command, "python -m lite_runtime.cli.lite_setup")

if __name__ == "__main__":
    sys.exit(main())
