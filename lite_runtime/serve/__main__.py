"""`python -m lite_runtime.serve`: the server's command (lite_runtime/cli/serve.py)."""
import sys

from lite_runtime.cli.serve import main

sys.exit(main())
