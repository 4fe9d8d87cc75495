"""What every command line of the project shares (all are click commands): user mistakes are one
`error:` line on stderr and a non-zero exit, never a usage block or a traceback.

`run_command` is the one place that turns a ToolchainError (exit 1) or an argument mistake (exit 2)
into that line; the exporter's CLI uses it too (the runtime never imports the exporter).
"""
from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace
from typing import List, Optional, Sequence

import click

from lite_runtime.contract.errors import ToolchainError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


class UpstreamBool(click.ParamType):
    """Upstream's booleans given as strings: `--use_past True`, `--do_sample false`, 1/0, yes/no."""
    name = "True|False"

    def convert(self, value, param, ctx):
        if isinstance(value, bool):
            return value
        lowered = str(value).strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        self.fail(f"expected True or False, got {value!r}", param, ctx)


BOOL = UpstreamBool()


class SpacedList(click.Option):
    """An option taking its values after one flag, as argparse's nargs="+" did (`--batch 1 8`; with
    `empty_ok`, nargs="*": the flag alone is no value); click reads them as the repeated flag
    (`--batch 1 --batch 8`, also accepted) into a tuple."""

    def __init__(self, *names, empty_ok: bool = False, **kwargs):
        super().__init__(*names, multiple=True, **kwargs)
        self.empty_ok = empty_ok


def spread_lists(command: click.Command, argv: Sequence[str]) -> List[str]:
    """`--batch 1 8 --steps 4` -> `--batch 1 --batch 8 --steps 4` for the command's SpacedList options."""
    lists = {name: param for param in command.params if isinstance(param, SpacedList) for name in param.opts}
    out: List[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":
            return out + list(argv[i - 1:])
        if token not in lists:
            out.append(token)
            continue
        values = []
        while i < len(argv) and not (argv[i].startswith("-") and not _NEGATIVE.fullmatch(argv[i])):
            values.append(argv[i])
            i += 1
        if not values and not lists[token].empty_ok:
            out.append(token)        # the flag without a value: click names the mistake
        for value in values:
            out += [token, value]
    return out


_NEGATIVE = re.compile(r"-\d+(\.\d*)?")


def parse_options(command: click.Command, argv: Sequence[str]) -> SimpleNamespace:
    """The command's options from `argv` as attributes, without running it (tests, callers of a tool)."""
    with command.make_context(command.name, spread_lists(command, list(argv))) as ctx:
        return SimpleNamespace(**ctx.params)


def run_command(command: click.Command, argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Run a click command; returns its exit code (the command's own int result, else 0)."""
    prog = _console_script_name() or prog or command.name
    argv = spread_lists(command, sys.argv[1:] if argv is None else list(argv))
    try:
        result = command.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.UsageError as e:
        return fail(f"{e.format_message().rstrip('.')} (see {prog} --help)", 2)
    except click.ClickException as e:
        return fail(e.format_message(), e.exit_code or 1)
    except click.Abort:
        return fail("aborted", 1)
    except ToolchainError as e:
        return fail(e, 1)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "mindspore":
            raise
        return fail(f"{prog} needs MindSpore here (the exporter and backend ms do): pip install "
                    "'llm-lite-export[mindspore]'; backend mslite runs without it", 1)
    return result if isinstance(result, int) else 0


def fail(message, code: int) -> int:
    """Print `error: MESSAGE` as one line on stderr and return `code`."""
    click.echo("error: " + " ".join(str(message).split()), err=True)
    return code


def entry_point(command: click.Command, prog: Optional[str] = None):
    """A `main(argv=None) -> int` for console_scripts, `python -m` and the upstream-named shims."""
    def main(argv: Optional[Sequence[str]] = None) -> int:
        return run_command(command, argv, prog)
    main.__doc__ = f"Run `{prog or command.name}`; returns the exit code."
    return main


def _console_script_name() -> Optional[str]:
    """`lite-infer` when run as that console script; None under `python -m` or a .py file."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name.startswith("lite-") else None
