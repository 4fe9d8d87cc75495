"""A user script calling pipeline(), started by the launcher on every rank (or alone):
  python -m lite_runtime.cli.launch --rank_table T --backend B -- tests/support/pipeline_worker.py EXPORT OUT_DIR \
      [BACKEND DATA_PARALLEL [--model_dir EXPORT --data_parallel DATA_PARALLEL]]
Without BACKEND: seeded sampling of PROMPTS on backend ms (a multi-rank export). With them: greedy
answers to DP_PROMPTS with `data_parallel=DATA_PARALLEL` (the options after them tell the launcher
the job's form, as run_infer_main's do; a multi-rank export with data parallel needs them). Each rank writes what its pipeline call
returned to OUT_DIR/rank_{RANK_ID}.txt."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from lite_runtime import pipeline  # noqa: E402

PROMPTS = ["one two three", "alpha beta", "five six seven eight nine"]
DP_PROMPTS = ["one two three", "alpha beta", "five six seven eight nine", "ten", "eleven twelve"]

if __name__ == "__main__":
    export, out_dir = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3 and not sys.argv[3].startswith("--"):
        backend, data_parallel = sys.argv[3], int(sys.argv[4])
        pipe = pipeline("text_generation", model=export, backend=backend, data_parallel=data_parallel)
        result = pipe(DP_PROMPTS, max_new_tokens=8)
    else:
        pipe = pipeline("text_generation", model=export, backend="ms")
        result = pipe(PROMPTS, max_new_tokens=10, do_sample=True, top_k=10, seed=3)
    pipe.close()
    with open(os.path.join(out_dir, f"rank_{os.environ.get('RANK_ID', '0')}.txt"), "w") as f:
        json.dump(result, f)
