"""`python -m lite_runtime.cli.launch --rank_table FILE [--backend ms] -- run_infer_main.py ARGS`
(console script `lite-launch`; or `-- -m lite_runtime.serve ARGS`: rank 0 serves the export).

Starts one process per rank of the rank table; rank 0 keeps the console, the others log to
`--log_dir`; any failing rank stops them all (lite_runtime/distributed/launch.py).
"""
from __future__ import annotations

import logging
import sys

import click

from lite_runtime.contract.command_line import CONTEXT, entry_point
from lite_runtime.distributed.launch import DEFAULT_MASTER_PORT, launch


@click.command(context_settings=dict(CONTEXT, allow_interspersed_args=False), help=__doc__.split("\n\n")[0])
@click.option("--rank_table", required=True, help="the HCCL rank table (hccl_tools.py / merge_hccl.py)")
@click.option("--backend", type=click.Choice(["ms", "mslite"]), default=None,
              help="default: the program's --backend, else mslite")
@click.option("--log_dir", default=None, help="where ranks other than 0 log (default: a new temporary folder)")
@click.option("--timeout", type=float, default=None,
              help="seconds before every rank is stopped; 0: no limit (default: none for a server, else 600)")
@click.option("--server_id", default=None, help="start the ranks of this server of the rank table (its server_id); "
              "default: the server whose address is this host's")
@click.option("--master_port", type=int, default=None, help="first of the ports the job listens on, on the first "
              f"server (the same on every server); default: {DEFAULT_MASTER_PORT} for a table of several servers, "
              "free ports for one")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def command(rank_table, backend, log_dir, timeout, server_id, master_port, program):
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    launch(rank_table, list(program), backend, log_dir, timeout, server_id, master_port)


main = entry_point(command, "python -m lite_runtime.cli.launch")


if __name__ == "__main__":
    sys.exit(main())
