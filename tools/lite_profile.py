"""Where a decode step's time goes on MindSpore Lite: per kernel type (or per kernel) of the graph.

    .venv/bin/python tools/lite_profile.py --model_dir output/demo [--by_name] [--top 30]

Runs one warm greedy request on the `mslite` backend (32-token prompts, 64 new tokens), then times
`--runs` Predicts of the decode graph on the inputs it last ran with, using Lite's per-kernel
callbacks (which add a little time of their own to each kernel).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_measure import bench_prompts, run_request  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/lite_profile.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", required=True, help="an export folder")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--by_name", action="store_true", help="one line per kernel instead of per kernel type")
    p.add_argument("--top", type=int, default=25, help="lines shown")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lite_format", default="auto", choices=("auto", "ms", "mindir"))
    args = p.parse_args(argv)
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.inputs import InputOfInfer
    try:
        manifest = load_manifest(args.model_dir)
        session = load_session("mslite", manifest, num_threads=args.threads, lite_format=args.lite_format)
        prompts = bench_prompts(manifest.batch_size, 32, manifest.dims.vocab_size)
        run_request(session, InputOfInfer.get_inputs(manifest.family, manifest), prompts, 64)
        models = session.lite_models
        if not models:
            raise ToolchainError("the official mindspore_lite API ran this export: profiling needs the native binding")
        model = models.get("increment") or models["step"]
        rows = model.profile(args.runs, by_name=args.by_name)
    except ToolchainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    total = sum(us for _, _, us in rows)
    print(f"{'kernel':<60} {'count':>5} {'us/run':>9} {'share':>6}")
    for key, count, us in rows[:args.top]:
        print(f"{key.replace('Default/net-CausalLM/', ''):<60} {count:>5} {us:>9.1f} {us / total:>6.1%}")
    print(f"{'total (kernels only)':<60} {sum(c for _, c, _ in rows):>5} {total:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
