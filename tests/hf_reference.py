"""Run in its own process (torch and MindSpore are kept apart): make a tiny random Hugging Face
Llama with GQA, save it as safetensors, and record transformers' greedy tokens and logits.

usage: python tests/hf_reference.py OUT_DIR STEPS
Writes OUT_DIR/hf (config.json, model.safetensors) and OUT_DIR/reference.npz.
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

PROMPTS = [[1, 15, 27, 3, 9, 44], [1, 8], [1, 60, 61, 5, 33, 70, 71, 12, 13]]


def main(out_dir: str, steps: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():   # default init is tiny; widen it so logits differ meaningfully
        for p in model.parameters():
            p.mul_(4.0) if p.dim() > 1 else p.add_(0.05 * torch.randn_like(p))
    hf_dir = os.path.join(out_dir, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    logits_all, tokens_all = [], []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        step_logits, tokens = [], []
        with torch.no_grad():
            for _ in range(steps + 1):
                last = model(ids).logits[0, -1].float().numpy()
                step_logits.append(last)
                nxt = int(last.argmax())
                tokens.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        logits_all.append(np.stack(step_logits))
        tokens_all.append(tokens)
    np.savez(os.path.join(out_dir, "reference.npz"), logits=np.stack(logits_all), tokens=np.array(tokens_all))
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
