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

Schemes: int8 (a float16 scale per 32 inputs, the kernels' default: llama.cpp's Q8_0 grid), int8_channel (a
float32 scale per output channel: `group_size: -1`), int4 (g32 with a min, the kernels'), int8_gptq (int8's
grid, each column's rounding error carried into the later columns by the second moments of the layer's inputs
over --tokens tokens of --calibration, GPTQ's method; not built), each optionally with `+x`.
"""
from __future__ import annotations

import os
import sys

import click
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMES = {"int8": ("int8", 32), "int8_channel": ("int8", -1), "int4": ("int4", 32),    # (weights, group_size)
           "int8_gptq": ("int8", 32)}


def dequantized(w: np.ndarray, scheme: str) -> np.ndarray:
    from exporter.weights.quantize import quantize
    from lite_runtime.contract.quant import dequantize
    weights, group = SCHEMES[scheme]
    return dequantize(*quantize(w, weights, group), w.shape[1], group)


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


def input_moments(model, calibration) -> dict:
    """Per linear layer but the head, X^T X (float64) of its inputs X over the rows of `calibration`."""
    import torch
    moments, hooks = {}, []

    def add(module, args):
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        moments[module] = moments.get(module, 0) + x.T @ x
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module is not model.get_output_embeddings():
            hooks.append(module.register_forward_pre_hook(add))
    with torch.no_grad():
        model(calibration)
    for hook in hooks:
        hook.remove()
    return moments


def error_carried(w, moments, group: int = 32):
    """w (N, K) on int8's grid in groups of `group` (the scales of w's own groups), rounded column by column,
    each column's error spread over the later columns by the inverse of the inputs' moments (damped by 1 % of
    their mean diagonal), so that the layer's output on those inputs moves least."""
    import torch
    w = w.double().clone()
    n, k = w.shape
    h = moments + 0.01 * moments.diagonal().mean() * torch.eye(k, dtype=torch.float64)
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    d = (w.reshape(n, k // group, group).abs().amax(2) / 127).half().double()
    d[d == 0] = 1
    out = torch.empty_like(w)
    for i in range(k):
        scale = d[:, i // group]
        out[:, i] = torch.round(w[:, i] / scale).clamp(-127, 127) * scale
        error = (w[:, i] - out[:, i]) / inverse[i, i]
        w[:, i + 1:] -= error[:, None] * inverse[i, i + 1:][None, :]
    return out.float()


def teacher_forced(gguf: str, scheme: str, batch, targets, calibration=None):
    import torch
    from transformers import AutoModelForCausalLM
    folder, name = os.path.split(os.path.abspath(gguf))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    weights, activations = (scheme.split("+") + [""])[:2]
    moments = input_moments(model, calibration) if weights == "int8_gptq" else {}
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear) or module is head or scheme == "float32":
                continue
            module.weight.copy_(error_carried(module.weight, moments[module]) if moments else
                                torch.from_numpy(dequantized(module.weight.numpy(), weights)))
            if activations == "x":
                module.register_forward_pre_hook(lambda _, a: (torch.from_numpy(rounded(a[0].numpy())),) + a[1:])
        logits = model(batch).logits.double()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
    best = logits.topk(2, -1).values
    return logits.argmax(-1), float(np.exp(nll)), best[..., 0] - best[..., 1]


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--gguf", default=os.path.join(REPO, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
              show_default=True)
@click.option("--text", default=os.path.join(REPO, "README.md"), show_default=True)
@click.option("--tokens", type=int, default=1024, show_default=True)
@click.option("--calibration", default="/usr/share/common-licenses/GPL-3", show_default=True,
              help="int8_gptq's text for the inputs' moments")
@click.argument("schemes", nargs=-1)
def command(gguf, text, tokens, calibration, schemes):
    import torch
    from transformers import AutoTokenizer
    for scheme in schemes:
        if scheme.split("+")[0] not in SCHEMES or scheme.count("+") > 1 or scheme.endswith("+") or \
                ("+" in scheme and not scheme.endswith("+x")):
            raise click.BadParameter(f"{scheme!r}: allowed {', '.join(SCHEMES)}, each optionally with +x",
                                     param_hint="SCHEME")
    torch.set_num_threads(2)
    folder, name = os.path.split(os.path.abspath(gguf))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)

    def slices(path):
        """(inputs, targets): --tokens tokens of the text at `path` in 8 rows."""
        ids = tokenizer(open(path, encoding="utf-8").read())["input_ids"]
        rows = 8
        length = min(tokens, len(ids) - 1) // rows
        flat = torch.tensor(ids[: rows * length + 1])
        return tuple(torch.stack([flat[r * length + s: (r + 1) * length + s] for r in range(rows)]) for s in (0, 1))
    batch, targets = slices(text)
    calibration = slices(calibration)[0] if any(s.startswith("int8_gptq") for s in schemes) else None
    reference, perplexity, margins = teacher_forced(gguf, "float32", batch, targets)
    print(f"teacher-forced over {batch.numel()} tokens of {os.path.basename(text)}; float32's two best logits "
          f"within 0.1 of each other at {100 * (margins < 0.1).double().mean().item():.1f} % of them:")
    print("| weights | top-1 agreement with float32 | perplexity |\n|---|---|---|")
    print(f"| float32 | 100.0 % | {perplexity:.3f} |")
    for scheme in schemes or ("int8_channel", "int8", "int8+x", "int4+x"):
        choices, perplexity, _ = teacher_forced(gguf, scheme, batch, targets, calibration)
        print(f"| {scheme} | {100 * (choices == reference).double().mean().item():.1f} % | {perplexity:.3f} |")
    return 0


main = entry_point(command, "python tools/quant_emulation.py")


if __name__ == "__main__":
    sys.exit(main())
