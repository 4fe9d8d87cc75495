"""An OpenAI-compatible HTTP server over one export: `python -m lite_runtime.serve --model_dir DIR`.
The engine (continuous batching over cache rows) is lite_runtime/decode/engine.py, the HTTP side app.py."""
