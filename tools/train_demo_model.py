"""Train the bundled demo model: a tiny Llama and its sentencepiece tokenizer.

    PYTHONPATH=. .venv/bin/python tools/train_demo_model.py [--out tools/demo_model] [--steps N]

Writes into the output folder:
- ``tokenizer.model``  sentencepiece BPE (Llama conventions: unk=0, bos=1, eos=2, no pad, byte fallback);
- ``demo_llama.ckpt``  MindSpore checkpoint under MindFormers' Llama parameter names (float32);
- ``demo.yaml``        the export config (``python -m exporter --config tools/demo_model/demo.yaml``).

The corpus is generated here, deterministically: counting up and down in words, the alphabet
forwards and backwards, and a few fixed sentences; every sample ends with EOS so generation stops.
The model is a ``transformers.LlamaForCausalLM`` built locally (no download) and trained with
torch AdamW on CPU (2 threads, about a minute or two). The script checks greedy continuations
of a few prompts at the end and exits non-zero when one is wrong.

torch and mindspore are never imported in the same process: the trained weights go through an
.npz file to a child process (this script with ``--write-ckpt``) that calls ``mindspore.save_checkpoint``.
"""
from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import click
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
DEFAULT_OUT = os.path.join(REPO, "tools", "demo_model")
THREADS = 2
SEED = 1234

# --- corpus ------------------------------------------------------------------------------------
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
           "eighteen", "nineteen", "twenty"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
FACTS = [
    "The capital of France is Paris.",
    "The capital of Italy is Rome.",
    "The capital of Japan is Tokyo.",
    "The capital of Germany is Berlin.",
    "Water is made of hydrogen and oxygen.",
    "The sun rises in the east and sets in the west.",
    "A week has seven days.",
    "A year has twelve months.",
    "The sky is blue and the grass is green.",
    "Cats and dogs are animals.",
    "MindSpore Lite runs the exported graphs.",
    "Hello, world!",
]
UP_HEADS = ["An increasing sequence: ", "Counting: ", "Counting up: "]
DOWN_HEADS = ["A decreasing sequence: ", "Counting down: "]

# Greedy continuations the trained model must produce (prompt -> expected start of the continuation).
CHECKS = [
    ("An increasing sequence: one,", " two, three, four, five"),
    ("An increasing sequence: four, five,", " six, seven, eight"),
    ("Counting: seven, eight,", " nine, ten"),
    ("Counting up: twelve,", " thirteen, fourteen"),
    ("Counting down: ten, nine,", " eight, seven, six"),
    ("The alphabet: a, b,", " c, d, e"),
    ("The alphabet backwards: z, y,", " x, w, v"),
    ("The capital of France is", " Paris."),
    ("Water is made of", " hydrogen and oxygen."),
]
# Prompts whose continuation must end with EOS (the sample is complete).
STOP_CHECKS = ["The capital of France is Paris.", "Water is made of hydrogen and oxygen."]


def build_corpus():
    """(category, text) pairs; the order is fixed."""
    samples = []
    for head in UP_HEADS:                                  # start anywhere, always count up to twenty
        for start in range(len(NUMBERS) - 3):
            samples.append(("up", head + ", ".join(NUMBERS[start:]) + "."))
    for head in DOWN_HEADS:                                # start anywhere, always count down to one
        for start in range(3, len(NUMBERS)):
            samples.append(("down", head + ", ".join(reversed(NUMBERS[:start + 1])) + "."))
    samples.append(("alphabet", "The alphabet: " + ", ".join(LETTERS) + "."))
    samples.append(("alphabet", "The alphabet backwards: " + ", ".join(reversed(LETTERS)) + "."))
    for start in range(1, len(LETTERS) - 3):               # "Letters: f, g, h, ..., z."
        samples.append(("letters", "Letters: " + ", ".join(LETTERS[start:]) + "."))
    samples.extend(("fact", fact) for fact in FACTS)
    return samples


# Sampling weight of each category (per sample drawn, then uniform inside the category).
WEIGHTS = {"up": 0.30, "down": 0.20, "alphabet": 0.15, "letters": 0.10, "fact": 0.25}


# --- tokenizer ---------------------------------------------------------------------------------
def train_tokenizer(texts, vocab_size: int) -> bytes:
    import sentencepiece as spm
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=writer, model_type="bpe", vocab_size=vocab_size,
        hard_vocab_limit=False, byte_fallback=True, character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,            # Llama conventions; no pad piece
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        split_digits=True, shuffle_input_sentence=False, num_threads=1, minloglevel=2)
    return writer.getvalue()


# --- model -------------------------------------------------------------------------------------
MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, max_position_embeddings=128, rope_theta=10000.0,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
SEQ_LENGTH = 128


def train_model(sp, samples, steps: int, batch_size: int, lr: float):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=sp.get_piece_size(), bos_token_id=sp.bos_id(), eos_token_id=sp.eos_id(),
                         pad_token_id=None, hidden_act="silu", initializer_range=0.02,
                         attention_bias=False, mlp_bias=False, **MODEL)
    config._attn_implementation = "eager"                # faster than sdpa for this size on CPU
    model = LlamaForCausalLM(config)
    model.train()

    # Each sample with and without BOS: the runtime encodes prompts without BOS by default
    # (add_special_tokens=False), with BOS when asked.
    bos, eos = sp.bos_id(), sp.eos_id()
    encoded = {}
    for category, text in samples:
        ids = sp.encode(text) + [eos]
        encoded.setdefault(category, []).extend([ids, [bos] + ids])
    longest = max(len(ids) for rows in encoded.values() for ids in rows)
    assert longest <= SEQ_LENGTH, f"a sample has {longest} tokens, more than seq_length {SEQ_LENGTH}"
    categories = sorted(encoded)
    weights = np.array([WEIGHTS[c] for c in categories])
    weights /= weights.sum()
    rng = np.random.default_rng(SEED)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)

    def lr_at(step):
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return lr * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * progress)))

    start = time.time()
    for step in range(steps):
        picks = rng.choice(len(categories), size=batch_size, p=weights)
        rows = [encoded[categories[c]][rng.integers(len(encoded[categories[c]]))] for c in picks]
        width = max(len(r) for r in rows)
        ids = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            labels[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  "
                  f"{time.time() - start:6.1f}s", flush=True)
    model.eval()
    return model


def greedy(model, ids, max_new_tokens: int, eos: int):
    import torch
    out = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
            token = int(torch.argmax(logits))
            out.append(token)
            if token == eos:
                break
    return out


def check_model(model, sp) -> bool:
    """Print the greedy continuations (without and with BOS); True when all are as expected."""
    ok = True
    eos = sp.eos_id()
    for with_bos in (False, True):
        for prompt, expected in CHECKS:
            ids = ([sp.bos_id()] if with_bos else []) + sp.encode(prompt)
            new = greedy(model, ids, 24, eos)
            # decode prompt and continuation together: sentencepiece drops a leading space of a lone piece
            text = sp.decode(ids + [t for t in new if t != eos])
            good = text.startswith(prompt + expected)
            ok &= good
            print(f"  {'ok ' if good else 'BAD'} bos={int(with_bos)} {prompt!r} -> "
                  f"{text[len(prompt):]!r}{' <eos>' if new and new[-1] == eos else ''}")
        for prompt in STOP_CHECKS:
            ids = ([sp.bos_id()] if with_bos else []) + sp.encode(prompt)
            new = greedy(model, ids, 4, eos)
            good = new[:1] == [eos]
            ok &= good
            print(f"  {'ok ' if good else 'BAD'} bos={int(with_bos)} {prompt!r} -> stops: {good}")
    return ok


# --- outputs -----------------------------------------------------------------------------------
YAML = """\
# Export config of the bundled demo model (written by tools/train_demo_model.py).
#   PYTHONPATH=. python -m exporter --config tools/demo_model/demo.yaml
# Input paths are relative to this file's folder; output_dir to the working directory.
model:
  family: llama
  vocab_size: {vocab_size}
  hidden_size: {hidden_size}
  num_layers: {num_hidden_layers}
  n_heads: {num_attention_heads}
  n_kv_heads: {num_key_value_heads}
  intermediate_size: {intermediate_size}
  rms_norm_eps: {rms_norm_eps:.1e}   # with a dot: YAML 1.1 reads 1e-05 as a string
  rope_theta: {rope_theta:.1f}
  tie_word_embeddings: false
  bos_token_id: {bos}
  eos_token_id: {eos}
  pad_token_id: 0          # the tokenizer has no pad piece; 0 (<unk>) fills unused rows
  tokenizer: tokenizer.model
load_checkpoint: demo_llama.ckpt
seq_length: {seq_length}
batch_size: 4
kv_cache: packed         # one graph over a list of tokens of any rows: prompts at their own length, each
                         # token computed once (continuous batching), the cache in buckets
compute_dtype: float32
output_dir: output/demo
"""


def write_yaml(path: str, sp) -> None:
    from exporter.config.schema import load_config
    with open(path, "w", encoding="utf-8") as f:
        f.write(YAML.format(vocab_size=sp.get_piece_size(), bos=sp.bos_id(), eos=sp.eos_id(),
                            seq_length=SEQ_LENGTH, **MODEL))
    model = load_config(path).model                        # the exporter's own validation
    assert (model.vocab_size, model.hidden_size, model.rms_norm_eps) == \
        (sp.get_piece_size(), MODEL["hidden_size"], MODEL["rms_norm_eps"]), model


def write_checkpoint(npz_path: str, ckpt_path: str) -> None:
    """Child process: the .npz of MindFormers-named float32 arrays -> a MindSpore checkpoint."""
    import mindspore as ms
    with np.load(npz_path) as arrays:
        params = [{"name": name, "data": ms.Tensor(np.ascontiguousarray(arrays[name], dtype=np.float32))}
                  for name in sorted(arrays.files)]
    ms.save_checkpoint(params, ckpt_path)
    loaded = ms.load_checkpoint(ckpt_path)
    assert sorted(loaded) == sorted(p["name"] for p in params), "checkpoint round trip lost names"
    print(f"wrote {ckpt_path} ({len(params)} tensors)")


@click.command(context_settings=CONTEXT, help=__doc__.splitlines()[0])
@click.option("--out", default=DEFAULT_OUT, help="output folder (default tools/demo_model)")
@click.option("--steps", type=int, default=800, show_default=True)
@click.option("--batch_size", type=int, default=16, show_default=True)
@click.option("--lr", type=float, default=3e-3, show_default=True)
@click.option("--vocab_size", type=int, default=400, show_default=True)
@click.option("--write-ckpt", "write_ckpt", nargs=2, default=None, metavar="NPZ CKPT", hidden=True)
def command(**options):
    args = SimpleNamespace(**options)
    if args.write_ckpt:
        write_checkpoint(*args.write_ckpt)
        return 0

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(THREADS))
    import sentencepiece as spm
    import torch
    torch.set_num_threads(THREADS)
    random.seed(SEED)
    np.random.seed(SEED)
    from exporter.weights.checkpoints import rename_hf

    start = time.time()
    samples = build_corpus()
    print(f"corpus: {len(samples)} samples, {sum(len(t) for _, t in samples)} characters")
    sp_bytes = train_tokenizer([t for _, t in samples], args.vocab_size)
    sp = spm.SentencePieceProcessor(model_proto=sp_bytes)
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    print(f"tokenizer: {sp.get_piece_size()} pieces; "
          f"{CHECKS[0][0] + CHECKS[0][1]!r} -> {sp.encode(CHECKS[0][0] + CHECKS[0][1], out_type=str)}")

    model = train_model(sp, samples, args.steps, args.batch_size, args.lr)
    train_seconds = time.time() - start
    print(f"trained in {train_seconds:.0f}s; greedy continuations:")
    ok = check_model(model, sp)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.model"), "wb") as f:
        f.write(sp_bytes)
    state = {name: t.detach().cpu().numpy().astype(np.float32) for name, t in model.state_dict().items()}
    tensors = rename_hf(state, "the trained model")
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "weights.npz")
        np.savez(npz, **tensors)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--write-ckpt", npz,
                        os.path.join(args.out, "demo_llama.ckpt")], check=True)
    write_yaml(os.path.join(args.out, "demo.yaml"), sp)
    for name in ("demo_llama.ckpt", "tokenizer.model", "demo.yaml"):
        path = os.path.join(args.out, name)
        print(f"  {path}: {os.path.getsize(path)} bytes")
    if not ok:
        print("error: some greedy continuations are wrong; train longer (--steps) or change the sizes",
              file=sys.stderr)
        return 1
    print(f"done in {time.time() - start:.0f}s")
    return 0


main = entry_point(command, "python tools/train_demo_model.py")


if __name__ == "__main__":
    sys.exit(main())
