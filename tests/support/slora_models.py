"""Run in its own process (torch apart from MindSpore): a tiny random Llama and two LoRA adapters of
different ranks made by Hugging Face peft (random, non-zero A and B), each saved as a PEFT folder
and as a MindFormers adapter folder's tensors, with peft's greedy reference for the base model and
for each adapter.

usage: python tests/support/slora_models.py OUT_DIR STEPS
Writes OUT_DIR/hf/ (with a tokenizer.model), OUT_DIR/base_mindformers.npz, OUT_DIR/{a1,a2}/ (PEFT),
OUT_DIR/{a1,a2}_mindformers.npz (mindpet_delta_lora_a/b under MindFormers names),
OUT_DIR/reference_{base,a1,a2}.npz, prompts.json; and OUT_DIR/reference_int8_{base,a1,a2}.npz: the same
with the base's linear layers (not the head) quantized to int8 and dequantized (lite_runtime/contract/
quant.py), the adapters in float32 on top, as an int8 SLoRA export runs them.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support package
from support.hf_models import (BUILDERS, PROMPTS, greedy_reference, mindformers_names,  # noqa: E402
                                save_tokenizer, widen)

# name -> (r, alpha, PEFT target modules); a2 also adapts the MLP
ADAPTERS = {"a1": (4, 8, ["q_proj", "k_proj", "v_proj", "o_proj"]),
            "a2": (8, 4, ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"])}
MF_NAMES = {"q_proj": "attention.wq", "k_proj": "attention.wk", "v_proj": "attention.wv", "o_proj": "attention.wo",
            "gate_proj": "feed_forward.w1", "up_proj": "feed_forward.w3", "down_proj": "feed_forward.w2"}


def main(out_dir, steps):
    import peft
    import torch
    import transformers
    torch.manual_seed(0)
    torch.set_num_threads(2)
    base = BUILDERS["llama"](transformers).eval()
    widen(base, "llama")
    base.save_pretrained(os.path.join(out_dir, "hf"), safe_serialization=True)
    save_tokenizer("llama", os.path.join(out_dir, "hf"))
    np.savez(os.path.join(out_dir, "base_mindformers.npz"), **mindformers_names("llama", base.state_dict(), base.config))
    logits, tokens = greedy_reference(base, steps)
    np.savez(os.path.join(out_dir, "reference_base.npz"), logits=logits, tokens=tokens)
    for name, (r, alpha, modules) in ADAPTERS.items():
        config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=modules, init_lora_weights=False,
                                 lora_dropout=0.0)
        model = peft.get_peft_model(base, config).eval()
        with torch.no_grad():      # larger than peft's random init, so that each adapter changes the tokens
            for pname, p in model.named_parameters():
                if ".lora_B." in pname:
                    p.mul_(3.0)
        model.save_pretrained(os.path.join(out_dir, name))
        mf = {}
        for pname, p in model.named_parameters():
            if ".lora_A." in pname or ".lora_B." in pname:
                layer = pname.split(".layers.")[1].split(".")[0]
                proj = next(k for k in MF_NAMES if f".{k}." in pname)
                kind = "a" if ".lora_A." in pname else "b"
                mf[f"model.layers.{layer}.{MF_NAMES[proj]}.mindpet_delta_lora_{kind}"] = p.detach().numpy().copy()
        np.savez(os.path.join(out_dir, f"{name}_mindformers.npz"), **mf)
        logits, tokens = greedy_reference(model, steps)
        np.savez(os.path.join(out_dir, f"reference_{name}.npz"), logits=logits, tokens=tokens)
        base = model.unload().eval()       # the base model again, without this adapter's layers
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f)
    int8_references(base, out_dir, steps)


def int8_references(base, out_dir, steps):
    import peft
    import torch
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from exporter.weights.quantize import quantize
    from lite_runtime.contract.quant import dequantize
    head = base.get_output_embeddings()
    with torch.no_grad():
        for module in base.modules():
            if isinstance(module, torch.nn.Linear) and module is not head:
                w = module.weight.numpy()
                module.weight.copy_(torch.from_numpy(dequantize(*quantize(w, "int8"), w.shape[1])))
    logits, tokens = greedy_reference(base, steps)
    np.savez(os.path.join(out_dir, "reference_int8_base.npz"), logits=logits, tokens=tokens)
    for name in ADAPTERS:
        model = peft.PeftModel.from_pretrained(base, os.path.join(out_dir, name)).eval()
        logits, tokens = greedy_reference(model, steps)
        np.savez(os.path.join(out_dir, f"reference_int8_{name}.npz"), logits=logits, tokens=tokens)
        base = model.unload().eval()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
