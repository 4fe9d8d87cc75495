"""The building blocks of decoder models and the assembled `CausalLM` (decoder.py)."""
