"""Where a decode step's time goes on MindSpore Lite: per kernel type (or per kernel) of the graph.

    .venv/bin/python tools/lite_profile.py --model_dir output/demo [--by_name] [--top 30]

Runs one warm greedy request on the `mslite` backend (32-token prompts, 64 new tokens), then times
`--runs` Predicts of the decode graph (of each segment, added up, for a segment export) on the inputs it
last ran with, using Lite's per-kernel
callbacks (which add a little time of their own to each kernel). `--new_tokens 1` profiles the call
that read the prompts instead (a packed step: `--prompt_len` tokens a row, up to the step's 256).
"""
from __future__ import annotations

import os
import sys

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_measure import bench_prompts, run_request  # noqa: E402
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--model_dir", required=True, help="an export folder")
@click.option("--runs", type=int, default=200, show_default=True)
@click.option("--by_name", is_flag=True, help="one line per kernel instead of per kernel type")
@click.option("--top", type=int, default=25, show_default=True, help="lines shown")
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--batch", type=int, default=None, help="rows decoding in the profiled step  [default: the export's]")
@click.option("--lite_format", type=click.Choice(["auto", "ms", "mindir"]), default="auto", show_default=True)
@click.option("--prompt_len", type=int, default=32, show_default=True)
@click.option("--new_tokens", type=int, default=64, show_default=True)
def command(model_dir, runs, by_name, top, threads, batch, lite_format, prompt_len, new_tokens):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.inputs import InputOfInfer
    manifest = load_manifest(model_dir)
    session = load_session("mslite", manifest, num_threads=threads, lite_format=lite_format)
    prompts = bench_prompts(batch or manifest.batch_size, prompt_len, manifest.dims.vocab_size)
    models = session.lite_models
    if not models:
        raise ToolchainError("the official mindspore_lite API ran this export: profiling needs the native binding")
    # the decode graph, or every segment of a segment export (their kernels added up)
    chosen = [models[name] for name in ("increment", "step") if name in models][:1] or list(models.values())
    merged, calls = {}, []

    def profile_once() -> float:
        """On the inputs of the request's last decode step but one, as bound: every row decoding, its prompt
        fed (in chunks of the engine's step budget, which may take many calls at many rows), where the
        request's last call need not be a decode step."""
        calls.append(1)
        if len(calls) == max(1, new_tokens - 2):
            for model in chosen:
                for key, count, us in model.profile(runs, by_name=by_name):
                    seen = merged.get(key, (0, 0.0))
                    merged[key] = (seen[0] + count, seen[1] + us)
        return 0.0
    run_request(session, InputOfInfer.get_inputs(manifest.family, manifest), prompts, max(new_tokens, 2),
                between=profile_once)
    if not merged:
        raise ToolchainError(f"--new_tokens {new_tokens}: the request ended before a decode step to profile; give more")
    rows = sorted(((key, count, us) for key, (count, us) in merged.items()), key=lambda row: -row[2])
    total = sum(us for _, _, us in rows)
    print(f"{'kernel':<60} {'count':>5} {'us/run':>9} {'share':>6}")
    for key, count, us in rows[:top]:
        print(f"{key.replace('Default/net-CausalLM/', ''):<60} {count:>5} {us:>9.1f} {us / total:>6.1%}")
    print(f"{'total (kernels only)':<60} {sum(c for _, c, _ in rows):>5} {total:>9.1f}")


main = entry_point(command, "python tools/lite_profile.py")


if __name__ == "__main__":
    sys.exit(main())
