"""Run in its own process (torch apart from MindSpore): a tiny random Llama with a LoRA adapter made by
Hugging Face peft (random, non-zero A and B on q, k, v, o), saved as an HF folder plus a PEFT adapter
folder, the same adapter under MindFormers' LoRA names, and peft's merged model's greedy reference.

usage: python tests/support/lora_models.py OUT_DIR STEPS
Writes OUT_DIR/hf/, OUT_DIR/adapter/ (adapter_config.json, adapter_model.safetensors),
OUT_DIR/mindformers_lora.npz (base + mindpet_delta_lora_a/b tensors), OUT_DIR/reference.npz, prompts.json.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support package
from support.hf_models import BUILDERS, PROMPTS, greedy_reference, mindformers_names, widen  # noqa: E402

RANK, ALPHA = 4, 8
MF_TARGETS = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo"}


def main(out_dir, steps):
    import peft
    import torch
    import transformers
    torch.manual_seed(0)
    torch.set_num_threads(2)
    base = BUILDERS["llama"](transformers).eval()
    widen(base, "llama")
    base.save_pretrained(os.path.join(out_dir, "hf"), safe_serialization=True)
    base_names = mindformers_names("llama", base.state_dict(), base.config)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(MF_TARGETS), init_lora_weights=False,
                             lora_dropout=0.0)
    model = peft.get_peft_model(base, config).eval()
    model.save_pretrained(os.path.join(out_dir, "adapter"))
    lora = {}
    for name, p in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            layer = name.split(".layers.")[1].split(".")[0]
            proj = next(k for k in MF_TARGETS if f".{k}." in name)
            kind = "a" if ".lora_A." in name else "b"
            lora[f"model.layers.{layer}.attention.{MF_TARGETS[proj]}.mindpet_delta_lora_{kind}"] = p.detach().numpy()
    np.savez(os.path.join(out_dir, "mindformers_lora.npz"), **base_names, **lora)
    merged = model.merge_and_unload().eval()
    logits, tokens = greedy_reference(merged, steps)
    np.savez(os.path.join(out_dir, "reference.npz"), logits=logits, tokens=tokens)
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
