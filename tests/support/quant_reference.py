"""transformers' greedy tokens and logits of an HF folder with its linear layers' weights replaced by
their quantized-then-dequantized values (lite_runtime/contract/quant.py), the head and the embedding kept
in float32 as the exporter keeps them: the reference a quantized export must give. Run in its own process
(torch):
    python tests/support/quant_reference.py HF_DIR SCHEME GROUP_SIZE STEPS OUT.npz [SHARES [HEAD [EMBEDDING
                                                                                           [ACTIVATIONS]]]]
With SHARES (tensor parallel ranks), the row-parallel layers (o_proj, down_proj: their input is split
across ranks) are quantized share by share along the input, as each rank does.
With HEAD int8, the head is quantized to int8 too; with EMBEDDING int8, the embedding. A tied head stays tied
when both have the same scheme, as exported (the head reads the embedding's table), else it is a weight of its own.
With ACTIVATIONS int8 (int8 weights in groups of 32), the input of each linear layer quantized in groups of 32
(the runtime's int8_activations): per row and run of 32 inputs, d = max |x| / 127, x replaced by round(x / d) d.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
from support.hf_models import greedy_reference  # noqa: E402
from exporter.weights.quantize import quantize  # noqa: E402
from lite_runtime.contract.quant import dequantize  # noqa: E402


ROW_PARALLEL = ("o_proj", "down_proj")


def per_share(function, array, shares):
    """`function` applied to each of `shares` equal blocks of `array`'s last axis, joined again."""
    return np.concatenate([function(part) for part in np.split(array, shares, axis=-1)], axis=-1)


def quantized_input(module, inputs):
    """A forward pre-hook: the layer's input as int8 in runs of 32 (float32 steps, ties to even) times its scales."""
    import torch
    x = inputs[0]
    runs = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    d = runs.abs().amax(-1, keepdim=True) / 127.0
    inverse = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    return (torch.round(runs * inverse) * d).reshape(x.shape),


def main(hf_dir, scheme, group, steps, out, shares=1, head_scheme="float32", embedding_scheme="float32",
         activations="float32"):
    import torch
    import transformers
    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head.weight is embed.weight
    count = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if module is head:
                if not (tied and head_scheme == embedding_scheme):      # a weight of its own, as exported
                    w = module.weight.numpy().copy()
                    if head_scheme != "float32":
                        w = dequantize(*quantize(w, head_scheme, group), w.shape[1], group)
                    module.weight = torch.nn.Parameter(torch.from_numpy(w))
            elif isinstance(module, torch.nn.Linear):
                n = shares if name.endswith(ROW_PARALLEL) else 1

                def dequantized(w):
                    return dequantize(*quantize(w, scheme, group), w.shape[1], group)
                module.weight.copy_(torch.from_numpy(per_share(dequantized, module.weight.numpy(), n)))
                count += 1
                if activations == "int8" and module.in_features % 32 == 0:     # grouped int8: Q8_0's blocks
                    module.register_forward_pre_hook(quantized_input)
    assert count, "no linear layer found"
    if embedding_scheme != "float32":       # in place: a head still tied to it follows
        with torch.no_grad():
            w = embed.weight.numpy()
            embed.weight.copy_(torch.from_numpy(dequantize(*quantize(w, embedding_scheme, group), w.shape[1], group)))
    logits, tokens = greedy_reference(model, steps)
    np.savez(out, logits=logits, tokens=tokens)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], *map(int, sys.argv[6:7]),
         *sys.argv[7:10])
