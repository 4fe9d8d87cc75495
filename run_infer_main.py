"""Generate text from an export: `python run_infer_main.py --model_dir out/llama --predict_data "..."`
(upstream's name and options; the console script `lite-infer` is the same command)."""
import sys

from lite_runtime.cli.run_infer import main

if __name__ == "__main__":
    sys.exit(main())
