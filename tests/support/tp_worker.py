"""Run under the launcher: one rank's greedy decode of fixed prompts, logits saved per rank.

usage (by tests/test_distributed.py):
  python -m lite_runtime.cli.launch --rank_table T --backend ms|mslite -- tests/support/tp_worker.py OUT_DIR STEPS \
      --model_dir EXPORT
With PROMPTS.json SLOTS.json after STEPS (tests/test_slora.py): those prompts, one SLoRA slot per row;
with PROMPTS.json alone, those prompts as tests/support/parity_runner.py decodes them.
(--model_dir, as run_infer_main takes it, tells the launcher the export's form; --num_threads N: Lite's threads
a rank.)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support package
from support.greedy_runner import greedy_run  # noqa: E402


def main(backend, export, out_dir, steps, prompts=None, slots=None, threads=None):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    rank = int(os.environ["RANK_ID"])
    if backend == "ms":
        from mindspore.communication import get_rank, init
        init()
        assert get_rank() == rank, "launcher rank order differs from MindSpore's"
    manifest = load_manifest(export)
    options = {"kv_cache_dtype": "float32"} if manifest.dims.kv_block else {}      # the reference's K/V
    if threads is not None:
        options["num_threads"] = threads
    session = load_session(backend, manifest, rank, **options)
    if prompts is None:
        logits, tokens = greedy_run(session, steps)
    elif slots is None:
        import json
        from support.parity_runner import greedy_prompts
        with open(prompts) as f:
            logits, tokens = greedy_prompts(session, json.load(f), steps)
    else:
        import json
        from support.slora_runner import run
        with open(prompts) as f:
            logits, tokens = run(session, json.load(f), steps, json.loads(slots))
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), logits=logits, tokens=tokens)
    session.close()     # Lite's models before the interpreter exits (under mpiexec: else exit code 11)


if __name__ == "__main__":
    argv = sys.argv[1:]     # OUT_DIR STEPS [PROMPTS SLOTS] --model_dir EXPORT, then the launcher's --backend B ...
    option = lambda name: argv[argv.index(name) + 1]
    args = argv[:next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))]
    threads = int(option("--num_threads")) if "--num_threads" in argv else None
    main(option("--backend"), option("--model_dir"), args[0], int(args[1]), *args[2:4], threads=threads)
