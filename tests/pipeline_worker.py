"""A user script calling pipeline() on a multi-rank export, started by the launcher:
  python -m lite_runtime.distributed.launch --rank_table T --backend ms -- tests/pipeline_worker.py EXPORT OUT_DIR
Each rank writes the texts it generated to OUT_DIR/rank_{RANK_ID}.txt."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lite_runtime import pipeline  # noqa: E402

PROMPTS = ["one two three", "alpha beta", "five six seven eight nine"]

if __name__ == "__main__":
    export, out_dir = sys.argv[1], sys.argv[2]
    pipe = pipeline("text_generation", model=export, backend="ms")
    result = pipe(PROMPTS, max_new_tokens=10, do_sample=True, top_k=10, seed=3)
    with open(os.path.join(out_dir, f"rank_{os.environ['RANK_ID']}.txt"), "w") as f:
        json.dump(result, f)
