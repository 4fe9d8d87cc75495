"""Which weight scheme is worth a kernel: accuracy of schemes emulated in transformers, before building any.

    .venv/bin/python tools/quant_emulation.py [--gguf build/models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--text README.md] [--tokens 1024] [SCHEME ...]

The model is read by transformers from the GGUF (dequantized to float32); each scheme replaces every
linear layer's weight but the head's by its quantized-then-dequantized values (the scheme's storage,
rounding to nearest) and, with `+x`, rounds each layer's input to int8 per run of 32 along it
(d = max|x| / 127, as llama.cpp's Q8_0 activations do; the project's int4 kernels did until 2026-11-28).
Teacher-forced over --tokens tokens of the text, cut into 8 rows, as `tools/bench_quant.py --accuracy`
measures exports:
prints each scheme's top-1 agreement with float32 and its perplexity.

Schemes: int8 (per output channel, the kernels'), int8_g32 (a float32 scale per 32 inputs, llama.cpp's
Q8_0 grid), int4 (g32 with a min, the kernels'), each optionally with `+x`.
"""
from __future__ import annotations

import os
import sys

import click
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMES = ("int8", "int8_g32", "int4")


def dequantized(w: np.ndarray, scheme: str) -> np.ndarray:
    from lite_runtime.contract.quant import dequantize, quantize
    if scheme == "int8_g32":
        n, k = w.shape
        groups = w.reshape(n, k // 32, 32)
        d = np.abs(groups).max(-1, keepdims=True) / 127
        d[d == 0] = 1
        return (np.clip(np.rint(groups / d), -127, 127) * d).reshape(n, k).astype(np.float32)
    return dequantize(*quantize(w, scheme, 32), w.shape[1], 32)


def rounded(x: np.ndarray) -> np.ndarray:
    """x rounded to int8 per run of 32 along its last axis (a shorter last run as it is)."""
    k = x.shape[-1]
    out = np.empty_like(x)
    for start in range(0, k, 32):
        run = x[..., start:start + 32]
        d = np.abs(run).max(-1, keepdims=True) / 127
        d = np.where(d == 0, 1, d).astype(np.float32)
        out[..., start:start + 32] = np.rint(run / d) * d
    return out


def teacher_forced(gguf: str, scheme: str, batch, targets):
    import torch
    from transformers import AutoModelForCausalLM
    folder, name = os.path.split(os.path.abspath(gguf))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    weights, activations = (scheme.split("+") + [""])[:2]
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear) or module is head or scheme == "float32":
                continue
            module.weight.copy_(torch.from_numpy(dequantized(module.weight.numpy(), weights)))
            if activations == "x":
                module.register_forward_pre_hook(lambda _, a: (torch.from_numpy(rounded(a[0].numpy())),) + a[1:])
        logits = model(batch).logits.double()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
    return logits.argmax(-1), float(np.exp(nll))


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--gguf", default=os.path.join(REPO, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
              show_default=True)
@click.option("--text", default=os.path.join(REPO, "README.md"), show_default=True)
@click.option("--tokens", type=int, default=1024, show_default=True)
@click.argument("schemes", nargs=-1)
def command(gguf, text, tokens, schemes):
    import torch
    from transformers import AutoTokenizer
    for scheme in schemes:
        if scheme.split("+")[0] not in SCHEMES or scheme.count("+") > 1 or scheme.endswith("+") or \
                ("+" in scheme and not scheme.endswith("+x")):
            raise click.BadParameter(f"{scheme!r}: allowed {', '.join(SCHEMES)}, each optionally with +x",
                                     param_hint="SCHEME")
    torch.set_num_threads(2)
    folder, name = os.path.split(os.path.abspath(gguf))
    ids = AutoTokenizer.from_pretrained(folder, gguf_file=name)(open(text, encoding="utf-8").read())["input_ids"]
    rows = 8
    length = min(tokens, len(ids) - 1) // rows
    flat = torch.tensor(ids[: rows * length + 1])
    batch = torch.stack([flat[r * length: (r + 1) * length] for r in range(rows)])
    targets = torch.stack([flat[r * length + 1: (r + 1) * length + 1] for r in range(rows)])
    reference, perplexity = teacher_forced(gguf, "float32", batch, targets)
    print(f"teacher-forced over {rows * length} tokens of {os.path.basename(text)}:")
    print("| weights | top-1 agreement with float32 | perplexity |\n|---|---|---|")
    print(f"| float32 | 100.0 % | {perplexity:.3f} |")
    for scheme in schemes or ("int8", "int8_g32", "int8_g32+x", "int4+x"):
        choices, perplexity = teacher_forced(gguf, scheme, batch, targets)
        print(f"| {scheme} | {100 * (choices == reference).double().mean().item():.1f} % | {perplexity:.3f} |")
    return 0


main = entry_point(command, "python tools/quant_emulation.py")


if __name__ == "__main__":
    sys.exit(main())
