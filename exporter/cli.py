"""`python -m exporter --config X.yaml | --model_dir DIR` (console script `lite-export`): parses
arguments, calls `export`."""
from __future__ import annotations

import dataclasses
import logging
import os

import click

from lite_runtime.contract.command_line import CONTEXT, entry_point
from exporter.config.schema import find_model_dir_config, load_config

PROG = "python -m exporter"


@click.command(context_settings=CONTEXT)
@click.option("--config", "--config_path", "config_path", type=str, default=None,
              help="Export yaml (model, weights, seq_length, batch_size, output_dir, ...).")
@click.option("--model_dir", type=str, default=None, help="A folder holding exactly one yaml and its weights.")
@click.option("--output_dir", type=str, default=None, help="Override output_dir of the yaml.")
@click.option("--batch_size", type=int, default=None, help="Override batch_size of the yaml.")
@click.option("--verbose", is_flag=True, help="Add MindSpore's own log (its info and warnings) to the stage lines; "
              "without it MindSpore prints only its errors (GLOG_v=3, unless GLOG_v is set).")
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
    # MindSpore's own log, C++ and Python, reads GLOG_v when MindSpore loads (below, in export): its warnings
    # (deprecations, `... exceeds 1G`) are not the user's to act on, so only its errors show unless --verbose
    # or the caller's own GLOG_v asks for more.
    if verbose:
        os.environ["GLOG_v"] = "1"
    else:
        os.environ.setdefault("GLOG_v", "3")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("exporter").setLevel(logging.INFO)
    if (config_path is None) == (model_dir is None):
        raise click.UsageError("give exactly one of --config and --model_dir")
    config = load_config(config_path or find_model_dir_config(model_dir))
    overrides = {k: v for k, v in (("output_dir", output_dir), ("batch_size", batch_size)) if v is not None}
    if output_dir is not None:
        overrides["output_dir_default"] = False
    if overrides:   # replace() validates the overridden values like the yaml's own
        config = dataclasses.replace(config, **overrides)
    from exporter.writing.export import export
    click.echo(export(config))


main = entry_point(command, PROG)
