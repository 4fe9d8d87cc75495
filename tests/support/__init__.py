"""Support code for the tests, not tests itself: tiny models and their checkpoints and export configs
(tiny_models), the family cases and their references (family_cases, hf_models, numpy_references, the
LoRA, SLoRA, GGUF and quantization references), graphs for Lite (lite_graphs, kernel_graphs), the
helpers tests share (serving, tokenizer files, export scripts and checks), and the runners and workers
the tests start as child processes by path (parity_runner, greedy_runner, tp_worker, pipeline_worker,
...), which put tests/ on sys.path themselves so that `support.<module>` imports work there too. Test
modules import it as `from support.<module> import ...` (tests/ is on sys.path under pytest)."""
