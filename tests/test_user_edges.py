"""Small edges a new user meets first (issue 60): what an export prints besides its own stage lines."""
import os
import subprocess
import sys

from support.tiny_models import REPO

DEMO_YAML = os.path.join(REPO, "tools", "demo_model", "demo.yaml")


def export_demo(tmp_path, *options):
    """The toy demo model exported by MindSpore 2.10 as a user runs it: without GLOG_v (conftest sets it)."""
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}
    env["PYTHONPATH"] = REPO
    out = str(tmp_path / ("out" + "".join(options)))
    return subprocess.run([sys.executable, "-m", "exporter", "--config", DEMO_YAML, "--output_dir", out, *options],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_an_export_prints_mindspores_warnings_only_with_verbose(tmp_path):
    """MindSpore's own log (`[WARNING] ME(...) ... is deprecated`, a large net's `... exceeds 1G`) is not the
    user's to act on: without --verbose the export's stderr is its stage lines only."""
    verbose = export_demo(tmp_path, "--verbose")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    # MindSpore 2.10 warns while this model exports: what the quiet run must leave out
    assert "[WARNING] ME" in verbose.stderr, verbose.stderr[-3000:]
    quiet = export_demo(tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    others = [line for line in quiet.stderr.splitlines() if not line.startswith("exporter: ")]
    assert not others, "\n".join(others[:5])
