"""`python -m lite_runtime.cli.ge_config check FILE... | generate --model_dir DIR --preset P -o OUT |
quantize --model_dir DIR` (console script `lite-ge-config`)."""
from __future__ import annotations

import sys

import click

from lite_runtime.ascend.ge_config import read_ge_config, split_config_paths
from lite_runtime.ascend.ge_config_writer import list_presets, write_export_configs
from lite_runtime.ascend.weight_quant import quantize_export
from lite_runtime.contract.command_line import CONTEXT, entry_point
from lite_runtime.contract.manifest import load_manifest


@click.group(context_settings=CONTEXT)
def command():
    """Check GE config.ini files or generate them for an export."""


@command.command(context_settings=CONTEXT)
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
def check(files):
    """Validate ini files (also the a.ini,b.ini pair)."""
    for path in split_config_paths(files):
        click.echo(read_ge_config(path).summary())


@command.command(context_settings=CONTEXT)
@click.option("--model_dir", required=True, help="Export folder with manifest.json.")
@click.option("--preset", required=True, help=f"One of {', '.join(list_presets())} or an ini path.")
@click.option("--rank_table", default=None, help="Rank table JSON for multi-rank exports.")
@click.option("-o", "--output_dir", required=True)
def generate(model_dir, preset, rank_table, output_dir):
    """Write prefill.ini and increment.ini for an export."""
    prefill, increment = write_export_configs(model_dir, preset, output_dir, rank_table)
    click.echo(f"--config_path {prefill},{increment}")


@command.command(context_settings=CONTEXT)
@click.option("--model_dir", required=True, help="Export folder with manifest.json (target ascend, weights int8).")
@click.option("--converter", default="converter_lite", show_default=True,
              help="MindSpore Lite's converter for Ascend (its path, or its name on PATH).")
def quantize(model_dir, converter):
    """Quantize an export's weights to int8 for GE with Lite's converter (on the Ascend server, once)."""
    for path in quantize_export(load_manifest(model_dir), converter):
        click.echo(path)


main = entry_point(command, "python -m lite_runtime.cli.ge_config")

if __name__ == "__main__":
    sys.exit(main())
