"""`python -m exporter --config X.yaml | --model_dir DIR`: parses arguments, calls `export`."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys

import click

from lite_runtime.contract.errors import ConfigError, ToolchainError
from exporter.config.schema import find_model_dir_config, load_config

PROG = "python -m exporter"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "--config_path", "config_path", type=str, default=None,
              help="Export yaml (model, weights, seq_length, batch_size, output_dir, ...).")
@click.option("--model_dir", type=str, default=None, help="A folder holding exactly one yaml and its weights.")
@click.option("--output_dir", type=str, default=None, help="Override output_dir of the yaml.")
@click.option("--batch_size", type=int, default=None, help="Override batch_size of the yaml.")
@click.option("--verbose", is_flag=True, help="Add MindSpore's own log to the stage lines.")
@click.option("--list_families", "--list-families", "list_families", is_flag=True,
              help="List the model families, the Hugging Face model_types and MindFormers types each accepts.")
def command(config_path, model_dir, output_dir, batch_size, verbose, list_families):
    """Export a causal LLM to prefill + increment MindIR graphs and a manifest."""
    if list_families:
        from exporter.families import family_table
        click.echo(f"{'family':<10} {'aliases':<28} {'HF model_type':<14} MindFormers types")
        for name, aliases, hf, mf in family_table():
            click.echo(f"{name:<10} {aliases or '-':<28} {hf:<14} {mf}")
        return
    if verbose:   # MindSpore's own log (its C++ side reads GLOG_v when it loads)
        os.environ["GLOG_v"] = "1"
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("exporter").setLevel(logging.INFO)
    try:
        if (config_path is None) == (model_dir is None):
            raise ConfigError(f"give exactly one of --config and --model_dir (see {PROG} --help)")
        config = load_config(config_path or find_model_dir_config(model_dir))
        overrides = {k: v for k, v in (("output_dir", output_dir), ("batch_size", batch_size)) if v is not None}
        if output_dir is not None:
            overrides["output_dir_default"] = False
        if overrides:   # replace() validates the overridden values like the yaml's own
            config = dataclasses.replace(config, **overrides)
        from exporter.build.export import export
        out = export(config)
    except ToolchainError as e:
        _fail(e, 1)
    click.echo(out)


def main(argv=None):
    """The CLI; argument mistakes are one `error:` line too (click would print its usage block)."""
    try:
        code = command.main(args=argv, prog_name=PROG, standalone_mode=False)
    except click.UsageError as e:
        _fail(f"{e.format_message().rstrip('.')} (see {PROG} --help)", 2)
    except click.Abort:
        _fail("aborted", 1)
    sys.exit(code or 0)


def _fail(message, code: int):
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    click.echo("error: " + " ".join(lines), err=True)
    sys.exit(code)
