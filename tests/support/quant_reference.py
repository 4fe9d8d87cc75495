"""transformers' greedy tokens and logits of an HF folder with its linear layers' weights replaced by
their quantized-then-dequantized values (lite_runtime/contract/quant.py), the head and the embedding kept
in float32 as the exporter keeps them, and for int4 each layer's input rounded as the kernels round it
(activation_rounding.py): the reference a quantized export must give. Run in its own process (torch):
    python tests/support/quant_reference.py HF_DIR SCHEME GROUP_SIZE STEPS OUT.npz [SHARES [HEAD]]
With SHARES (tensor parallel ranks), the row-parallel layers (o_proj, down_proj: their input is split
across ranks) are quantized, and their input rounded, share by share along the input, as each rank does.
With HEAD int8, the head is quantized to int8 too (a tied head apart from the embedding, which stays float32).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
from support.activation_rounding import round_activations  # noqa: E402
from support.hf_models import greedy_reference  # noqa: E402
from lite_runtime.contract.quant import dequantize, quantize  # noqa: E402


ROW_PARALLEL = ("o_proj", "down_proj")


def per_share(function, array, shares):
    """`function` applied to each of `shares` equal blocks of `array`'s last axis, joined again."""
    return np.concatenate([function(part) for part in np.split(array, shares, axis=-1)], axis=-1)


def main(hf_dir, scheme, group, steps, out, shares=1, head_scheme="float32"):
    import torch
    import transformers
    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    count = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if module is head and head_scheme != "float32":
                # a weight of its own: a head tied to the embedding is quantized apart from it, as exported
                w = module.weight.numpy()
                module.weight = torch.nn.Parameter(torch.from_numpy(dequantize(*quantize(w, head_scheme), w.shape[1])))
            elif isinstance(module, torch.nn.Linear) and module is not head:
                n = shares if name.endswith(ROW_PARALLEL) else 1

                def dequantized(w):
                    return dequantize(*quantize(w, scheme, group), w.shape[1], group)
                module.weight.copy_(torch.from_numpy(per_share(dequantized, module.weight.numpy(), n)))
                if scheme == "int4":
                    module.register_forward_pre_hook(lambda _, args, n=n: (
                        torch.from_numpy(per_share(round_activations, args[0].numpy(), n)),) + args[1:])
                count += 1
    assert count, "no linear layer found"
    logits, tokens = greedy_reference(model, steps)
    np.savez(out, logits=logits, tokens=tokens)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], *map(int, sys.argv[6:7]),
         *sys.argv[7:8])
