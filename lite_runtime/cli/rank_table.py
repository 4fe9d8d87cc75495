"""`python -m lite_runtime.cli.rank_table make | merge | check` (console script `lite-rank-table`):
HCCL rank tables. `make` and `merge` take upstream hccl_tools.py's and merge_hccl.py's options;
tools/hccl_tools.py and tools/merge_hccl.py are those two commands under their upstream names."""
from __future__ import annotations

import logging
import sys

import click

from lite_runtime.ascend.rank_table import load_rank_table
from lite_runtime.ascend.rank_table_writer import DEFAULT_HCCN_CONF, make_rank_table, merge_files
from lite_runtime.contract.command_line import CONTEXT, entry_point


@click.group(context_settings=CONTEXT)
def command():
    """Make, merge and check HCCL rank tables."""


@command.command(context_settings=CONTEXT)
@click.option("--device_num", default="[0,8)", show_default=True, help="Logical device range.")
@click.option("--visible_devices", default="0,1,2,3,4,5,6,7", show_default=True,
              help="Physical ids, by logical index.")
@click.option("--server_ip", default=None, help="This server's IP (default: from the host name).")
@click.option("--device_num_per_node", type=int, default=8, show_default=True)
@click.option("--device_ips", default=None, help="IP,IP,... one per device used, or an hccn.conf file.")
@click.option("--hccn_conf", default=None,
              help=f"hccn.conf to read (default {DEFAULT_HCCN_CONF} when hccn_tool is not on PATH).")
@click.option("--output_dir", default=".", show_default=True)
def make(**options):
    """Write the rank table of this server and print its path."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    click.echo(make_rank_table(**options))


@command.command(context_settings=CONTEXT)
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--output_dir", default=".", show_default=True)
def merge(files, output_dir):
    """Merge per-server rank tables (servers in file order, ranks renumbered) and print the path."""
    click.echo(merge_files(files, output_dir))


@command.command(context_settings=CONTEXT)
@click.argument("file")
def check(file):
    """Validate FILE and print its servers, devices and ranks."""
    click.echo(load_rank_table(file).summary())


main = entry_point(command, "python -m lite_runtime.cli.rank_table")

if __name__ == "__main__":
    sys.exit(main())
