"""Write the HCCL rank table of one server (upstream's name and options; `lite-rank-table make`).

    python tools/hccl_tools.py --device_num "[0,8)" --visible_devices "0,1,2,3,4,5,6,7" \
        --server_ip 10.0.0.1 [--device_num_per_node 8] [--device_ips FILE|IP,IP,...] [--output_dir DIR]
"""
import os
import sys

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_CHECKOUT, "lite_runtime")):   # run from a checkout: its own package
    sys.path.insert(0, _CHECKOUT)
from lite_runtime.contract.command_line import entry_point
from lite_runtime.cli.rank_table import make

main = entry_point(make, "hccl_tools.py")

if __name__ == "__main__":
    sys.exit(main())
