"""`python -m exporter --config X.yaml | --model_dir DIR`: parses arguments, calls `export`."""
from __future__ import annotations

import logging
import sys

import click

from lite_runtime.errors import ToolchainError
from .config import find_model_dir_config, load_config


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "--config_path", "config_path", type=str, default=None,
              help="Export yaml (model, weights, seq_length, batch_size, output_dir, ...).")
@click.option("--model_dir", type=str, default=None, help="A folder holding exactly one yaml and its weights.")
@click.option("--output_dir", type=str, default=None, help="Override output_dir of the yaml.")
@click.option("--batch_size", type=int, default=None, help="Override batch_size of the yaml.")
@click.option("--verbose", is_flag=True, help="Log MindSpore's progress too.")
def main(config_path, model_dir, output_dir, batch_size, verbose):
    """Export a causal LLM to prefill + increment MindIR graphs and a manifest."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("exporter").setLevel(logging.INFO)
    try:
        if (config_path is None) == (model_dir is None):
            raise click.UsageError("give exactly one of --config and --model_dir")
        config = load_config(config_path or find_model_dir_config(model_dir))
        if output_dir is not None:
            config.output_dir = output_dir
        if batch_size is not None:
            config.batch_size = batch_size
        from .export import export
        out = export(config)
    except ToolchainError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    click.echo(out)
