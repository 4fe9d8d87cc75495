"""transformers' greedy tokens and logits of an HF folder with its linear layers' weights replaced by
their quantized-then-dequantized values (lite_runtime/contract/quant.py), the head and the embedding kept
in float32 as the exporter keeps them, and for int4 each layer's input rounded as the kernels round it
(activation_rounding.py): the reference a quantized export must give. Run in its own process (torch):
    python tests/quant_reference.py HF_DIR SCHEME GROUP_SIZE STEPS OUT.npz
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from activation_rounding import round_activations  # noqa: E402
from hf_models import greedy_reference  # noqa: E402
from lite_runtime.contract.quant import dequantize, quantize  # noqa: E402


def main(hf_dir, scheme, group, steps, out):
    import torch
    import transformers
    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not head:
                storage, constants = quantize(module.weight.numpy(), scheme, group)
                deq = dequantize(storage, constants, module.weight.shape[1], group)
                module.weight.copy_(torch.from_numpy(deq))
                if scheme == "int4":
                    module.register_forward_pre_hook(
                        lambda _, args: (torch.from_numpy(round_activations(args[0].numpy())),) + args[1:])
                count += 1
    assert count, "no linear layer found"
    logits, tokens = greedy_reference(model, steps)
    np.savez(out, logits=logits, tokens=tokens)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
