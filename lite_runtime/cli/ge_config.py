"""`python -m lite_runtime.cli.ge_config check FILE... | generate --model_dir DIR --preset P -o OUT`."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from lite_runtime.ascend.ge_config import read_ge_config, split_config_paths
from lite_runtime.ascend.ge_config_writer import list_presets, write_export_configs
from lite_runtime.cli.cli_common import OneLineParser, report_errors


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineParser(prog="python -m lite_runtime.cli.ge_config",
                           description="Check GE config.ini files or generate them for an export.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    check = sub.add_parser("check", help="validate ini files (also the a.ini,b.ini pair)")
    check.add_argument("files", nargs="+", metavar="FILE")
    gen = sub.add_parser("generate", help="write prefill.ini and increment.ini for an export")
    gen.add_argument("--model_dir", required=True, help="export folder with manifest.json")
    gen.add_argument("--preset", required=True, help=f"one of {', '.join(list_presets())} or an ini path")
    gen.add_argument("--rank_table", default=None, help="rank table JSON for multi-rank exports")
    gen.add_argument("-o", "--output_dir", required=True)
    args = parser.parse_args(argv)

    def run():
        if args.command == "check":
            for path in split_config_paths(args.files):
                print(read_ge_config(path).summary())
        else:
            prefill, increment = write_export_configs(args.model_dir, args.preset, args.output_dir, args.rank_table)
            print(f"--config_path {prefill},{increment}")
    return report_errors(run)


if __name__ == "__main__":
    sys.exit(main())
