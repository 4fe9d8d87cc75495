"""An OpenAI-compatible HTTP server over one export: `python -m lite_runtime.serve --model_dir DIR`.
The engine (continuous batching over cache rows) is in engine.py, the HTTP side in app.py."""
