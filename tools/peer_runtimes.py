"""The peer side of tools/compare_peers.py; runs in the peers venv (`make peers`), never imports the project.

    python tools/peer_runtimes.py model   OUT_DIR SIZES_JSON   # random HF Llama + tokenizer.json (or .model)
    python tools/peer_runtimes.py ort     HF_DIR OUT_DIR THREADS  # ONNX Runtime GenAI's model builder
    python tools/peer_runtimes.py openvino HF_DIR OUT_DIR         # stateful OpenVINO IR for OpenVINO GenAI
    python tools/peer_runtimes.py measure JOB_JSON OUT_JSON       # one timed request: ort, openvino or transformers
                                                                  # or a served workload: openvino_cb

A measured job times one warm greedy request (EOS ignored) like the project's benchmark: time to
first token (prompt to first new token), the median of the per-step decode times, peak RSS of the
process, and returns the generated ids so the parent can check every runtime gave the same tokens.
`openvino_cb` (tools/bench_serve.py --peers) runs a timed workload of requests through OpenVINO
GenAI's ContinuousBatchingPipeline and returns each request's token ids and their times.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np


def make_model(out_dir: str, sizes: dict) -> None:
    """A random transformers Llama with a word-level tokenizer: normal(0, 0.02) weights (seed 0), the
    decoder layers' matrices scaled by 4 so that the context steers the greedy tokens (at 0.02 they
    repeat one token after a few steps, which would make the tokens check weak).

    `sizes["tokenizer"] == "sentencepiece"` (tools/bench_scale.py) ships a sentencepiece
    `tokenizer.model` of exactly vocab_size pieces instead; `sizes["max_shard_size"]` shards the
    safetensors. The weights are made once, in place (one copy of them in memory, plus the shard
    being written)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=sizes["vocab_size"], hidden_size=sizes["hidden_size"], num_hidden_layers=sizes["num_layers"],
        num_attention_heads=sizes["n_heads"], num_key_value_heads=sizes["n_kv_heads"],
        intermediate_size=sizes["intermediate_size"], rms_norm_eps=sizes["norm_eps"],
        rope_theta=sizes["rope_theta"], max_position_embeddings=sizes["seq_length"],
        tie_word_embeddings=False, bos_token_id=sizes["bos_token_id"], eos_token_id=sizes["eos_token_id"],
        pad_token_id=sizes["pad_token_id"], initializer_range=0.02, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, weight in model.model.layers.named_parameters():
            if "norm" not in name:
                weight.mul_(4.0)
    extra = {"max_shard_size": sizes["max_shard_size"]} if "max_shard_size" in sizes else {}
    model.save_pretrained(out_dir, safe_serialization=True, **extra)
    del model
    if sizes.get("tokenizer") == "sentencepiece":
        _sentencepiece_tokenizer(out_dir, sizes["vocab_size"])
        return
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, sizes["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "pad_token": "<unk>"}, f)


def _sentencepiece_tokenizer(out_dir: str, vocab_size: int) -> None:
    """A Llama-style sentencepiece BPE `tokenizer.model` (<unk> 0, <s> 1, </s> 2, byte fallback) of
    exactly `vocab_size` pieces, trained on generated text (random words of random syllables, seeded:
    enough distinct pairs for every merge; padding with user-defined symbols instead would make them
    added tokens, which the peers' tokenizer conversions take minutes over), and the
    tokenizer_config.json transformers reads it with."""
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + list("aeiou")
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
    sentences = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(60000)]
    prefix = os.path.join(out_dir, "tokenizer")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=vocab_size,
                                   model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   minloglevel=2)
    size = spm.SentencePieceProcessor(model_file=prefix + ".model").get_piece_size()
    if size != vocab_size:
        raise RuntimeError(f"sentencepiece made {size} pieces, not {vocab_size}")
    os.unlink(prefix + ".vocab")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}, f)


# ONNX Runtime GenAI's builder options per precision: int4 in blocks of 32 (our int4's groups) at accuracy
# level 4 (x rounded to int8 for integer products: its fastest CPU path)
ORT_PRECISIONS = {"fp32": [], "int4": ["--extra_options", "int4_block_size=32", "int4_accuracy_level=4"]}


def build_ort(hf_dir: str, out_dir: str, threads: int, precision: str = "fp32") -> None:
    cache = out_dir + ".cache"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf_dir, "-o", out_dir,
                    "-p", precision, "-e", "cpu", "-c", cache] + ORT_PRECISIONS[precision], check=True)
    shutil.rmtree(cache, ignore_errors=True)
    path = os.path.join(out_dir, "genai_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


class _ExplicitCacheLlama:
    """A torch module over the transformers weights with the cache as explicit inputs and outputs, in
    the layout OpenVINO GenAI drives (input_ids, attention_mask, position_ids, beam_idx, past K/V)."""

    @staticmethod
    def build(model):
        import torch
        import torch.nn.functional as F

        cfg = model.config
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        hd = cfg.hidden_size // heads
        theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
        inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        layers, eps = model.model.layers, cfg.rms_norm_eps

        def rms(x, w):
            return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

        def rotate(x, cos, sin):
            half = x.shape[-1] // 2
            return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

        def shared(x):
            # GQA as transformers' repeat_kv: OpenVINO's paged-attention rewrite (ContinuousBatchingPipeline)
            # matches this pattern, not the attention's enable_gqa (the IR is then refused)
            if heads == kv:
                return x
            b, _, s, _ = x.shape
            return x[:, :, None].expand(b, kv, heads // kv, s, hd).reshape(b, heads, s, hd)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model      # registered, so tracing sees the weights as parameters

            def forward(self, input_ids, attention_mask, position_ids, beam_idx, past):
                b, t = input_ids.shape
                freqs = position_ids[..., None].float() * inv_freq
                emb = torch.cat([freqs, freqs], -1)[:, None]
                cos, sin = emb.cos(), emb.sin()
                p = past[0][0].shape[2]
                causal = torch.arange(p + t)[None, :] <= (p + torch.arange(t))[:, None]
                mask = causal[None, None] & attention_mask[:, None, None, :].bool()
                x = model.model.embed_tokens(input_ids)
                present = []
                for layer, (pk, pv) in zip(layers, past):
                    a = layer.self_attn
                    h = rms(x, layer.input_layernorm.weight)
                    q = a.q_proj(h).view(b, t, heads, hd).transpose(1, 2)
                    k = a.k_proj(h).view(b, t, kv, hd).transpose(1, 2)
                    v = a.v_proj(h).view(b, t, kv, hd).transpose(1, 2)
                    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
                    k = torch.cat([pk.index_select(0, beam_idx), k], 2)
                    v = torch.cat([pv.index_select(0, beam_idx), v], 2)
                    present.append((k, v))
                    o = F.scaled_dot_product_attention(q, shared(k), shared(v), attn_mask=mask)
                    x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, heads * hd))
                    x = x + layer.mlp(rms(x, layer.post_attention_layernorm.weight))
                logits = model.lm_head(rms(x, model.model.norm.weight))
                return logits, tuple(present)
        return Net().eval(), kv, hd


def _zero_state_initializers(ov_model) -> None:
    """Each cache state starts as zeros of shape (batch of input_ids, kv, 0, hd): the CPU plugin needs
    the ReadValue nodes the stateful transformation made to have an initial value."""
    import openvino as ov
    from openvino import opset13 as ops

    ids = next(p for p in ov_model.get_parameters() if p.get_output_tensor(0).get_names() == {"input_ids"})
    batch = ops.gather(ops.shape_of(ids, output_type="i64"), ops.constant([0]), ops.constant(0))
    for op in ov_model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        dims = [batch if i == 0 else ops.constant([d.get_min_length()], dtype=ov.Type.i64)
                for i, d in enumerate(op.get_output_partial_shape(0))]
        zeros = ops.broadcast(ops.constant(0.0, dtype=op.get_output_element_type(0)), ops.concat(dims, 0))
        op.set_arguments([zeros])
    ov_model.validate_nodes_and_infer_types()


def build_openvino(hf_dir: str, out_dir: str, weights: str = "f32") -> None:
    """`weights`: f32, or int8 / int4 (NNCF's weight compression, asymmetric; int4 in groups of 32, every
    linear layer)."""
    import openvino as ov
    import torch
    import transformers
    from openvino._offline_transformations import apply_make_stateful_transformation
    from openvino_tokenizers import convert_tokenizer

    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    model.requires_grad_(False)
    net, kv, hd = _ExplicitCacheLlama.build(model)
    n = model.config.num_hidden_layers
    past = tuple((torch.zeros(2, kv, 3, hd), torch.zeros(2, kv, 3, hd)) for _ in range(n))
    example = dict(input_ids=torch.ones(2, 2, dtype=torch.long), attention_mask=torch.ones(2, 5, dtype=torch.long),
                   position_ids=torch.tensor([[3, 4], [3, 4]]), beam_idx=torch.arange(2, dtype=torch.int32), past=past)
    with torch.no_grad():
        ov_model = ov.convert_model(net, example_input=example)
    names = ["input_ids", "attention_mask", "position_ids", "beam_idx"]
    names += [f"past_key_values.{i}.{kind}" for i in range(n) for kind in ("key", "value")]
    for port, name in zip(ov_model.inputs, names):
        port.get_tensor().set_names({name})
        dims = [-1] * len(port.get_partial_shape())
        if name.startswith("past_key_values"):
            dims[1], dims[3] = kv, hd
        port.get_node().set_partial_shape(ov.PartialShape(dims))
    outputs = ["logits"] + [f"present.{i}.{kind}" for i in range(n) for kind in ("key", "value")]
    for port, name in zip(ov_model.outputs, outputs):
        port.get_tensor().set_names({name})
    ov_model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(ov_model, dict(zip(names[4:], outputs[1:])))
    _zero_state_initializers(ov_model)
    if weights != "f32":
        import nncf
        mode = {"int8": nncf.CompressWeightsMode.INT8_ASYM, "int4": nncf.CompressWeightsMode.INT4_ASYM}[weights]
        options = dict(group_size=32, ratio=1.0) if weights == "int4" else {}
        ov_model = nncf.compress_weights(ov_model, mode=mode, **options)
    os.makedirs(out_dir, exist_ok=True)
    ov.save_model(ov_model, os.path.join(out_dir, "openvino_model.xml"), compress_to_fp16=False)
    tokenizer, detokenizer = convert_tokenizer(transformers.AutoTokenizer.from_pretrained(hf_dir),
                                               with_detokenizer=True)
    ov.save_model(tokenizer, os.path.join(out_dir, "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, os.path.join(out_dir, "openvino_detokenizer.xml"))
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copy(os.path.join(hf_dir, name), out_dir)


# --- measuring ---------------------------------------------------------------------------------

def _result(load_s, ttft_s, steps_s, tokens, **extra):
    steps_ms = np.asarray(steps_s) * 1e3
    return dict(load_s=load_s, ttft_ms=ttft_s * 1e3, step_ms={"median": float(np.median(steps_ms)),
                "p90": float(np.percentile(steps_ms, 90))}, decode_steps=int(len(steps_ms)),
                tokens=[[int(t) for t in row] for row in tokens],
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, **extra)


def measure_ort(job):
    import onnxruntime_genai as og

    start = time.perf_counter()
    model = og.Model(job["model_dir"])
    load_s = time.perf_counter() - start

    def request(new_tokens):
        prompts = np.asarray(job["prompts"], dtype=np.int32)
        total = prompts.shape[1] + new_tokens
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=total, min_length=total, batch_size=len(prompts))
        clock = time.perf_counter
        start = clock()
        generator = og.Generator(model, params)
        generator.append_tokens(prompts)
        times, tokens = [], []
        while not generator.is_done():
            generator.generate_next_token()
            tokens.append(np.asarray(generator.get_next_tokens()).copy())
            end = clock()
            times.append(end - start)
            start = end
        return times, np.stack(tokens, 1)

    for _ in range(job["warmup"]):
        request(8)
    times, tokens = request(job["new_tokens"])
    return _result(load_s, times[0], times[1:], tokens)


def measure_openvino(job):
    import openvino as ov
    import openvino_genai as genai

    start = time.perf_counter()
    pipe = genai.LLMPipeline(job["model_dir"], "CPU", INFERENCE_NUM_THREADS=job["threads"],
                             INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32", ATTENTION_BACKEND="SDPA")
    load_s = time.perf_counter() - start
    ids = np.asarray(job["prompts"], dtype=np.int64)
    inputs = genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))

    def request(new_tokens):
        config = genai.GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, ignore_eos=True,
                                        do_sample=False)
        result = pipe.generate(inputs, config)
        raw = result.perf_metrics.raw_metrics
        # OpenVINO GenAI's own clocks: time to first token (µs), the time of each new token of the batch (ms).
        steps = np.diff(np.asarray(raw.m_new_token_times)) / 1e3
        durations = [raw.m_times_to_first_token[0] / 1e6] + list(steps)
        return durations, result.tokens

    for _ in range(job["warmup"]):
        request(8)
    times, tokens = request(job["new_tokens"])
    return _result(load_s, times[0], times[1:], tokens)


def measure_transformers(job):
    import torch
    import transformers

    torch.set_num_threads(job["threads"])
    start = time.perf_counter()
    model = transformers.LlamaForCausalLM.from_pretrained(job["model_dir"], torch_dtype=torch.float32).eval()
    load_s = time.perf_counter() - start
    prompts = torch.tensor(job["prompts"])

    def request(new_tokens):
        times, clock = [], [time.perf_counter()]

        class Timer(transformers.StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                now = time.perf_counter()
                times.append(now - clock[0])
                clock[0] = now
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        clock[0] = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 stopping_criteria=transformers.StoppingCriteriaList([Timer()]))
        return times, out[:, prompts.shape[1]:].numpy()

    for _ in range(job["warmup"]):
        request(8)
    times, tokens = request(job["new_tokens"])
    return _result(load_s, times[0], times[1:], tokens)


def measure_openvino_cb(job):
    """The workload `job["jobs"]` ([{arrival s, ids, max_tokens}]) through ContinuousBatchingPipeline,
    driven as a server's loop drives it: each request is added at its arrival (at the first step
    boundary after it), one `step()` at a time while any is unfinished, each new token stamped when
    the step that made it returns. Greedy, the model's EOS honoured (as the project's server does)."""
    import openvino as ov
    import openvino_genai as genai

    scheduler = genai.SchedulerConfig()
    # max_num_seqs binds only in the vLLM-like mode: with dynamic_split_fuse (the default) every
    # request that arrives decodes at once, up to max_num_batched_tokens of them (measured: 64).
    scheduler.dynamic_split_fuse = False
    scheduler.max_num_seqs = job["max_num_seqs"]
    # in this mode a step takes whole prompts: it refuses one longer than max_num_batched_tokens (256 by default)
    scheduler.max_num_batched_tokens = max(scheduler.max_num_batched_tokens, max(len(j["ids"]) for j in job["jobs"]))
    scheduler.cache_size = job["cache_gb"]
    scheduler.enable_prefix_caching = False
    properties = dict(INFERENCE_NUM_THREADS=job["threads"], INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
    start = time.perf_counter()
    pipe = genai.ContinuousBatchingPipeline(job["model_dir"], scheduler, "CPU", properties)
    load_s = time.perf_counter() - start
    eos = pipe.get_config().eos_token_id

    def config(max_tokens):
        return genai.GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos)

    def tensor(ids):
        return ov.Tensor(np.asarray([ids], dtype=np.int64))

    work = job["jobs"]
    pipe.generate([tensor(work[0]["ids"])], [config(2)])          # warm
    tokens, stamps = [[] for _ in work], [[] for _ in work]
    handles, pending = {}, sorted(range(len(work)), key=lambda i: work[i]["arrival"])
    start = time.perf_counter()
    while pending or pipe.has_non_finished_requests():
        now = time.perf_counter() - start
        while pending and work[pending[0]]["arrival"] <= now:
            i = pending.pop(0)
            handles[i] = pipe.add_request(i, tensor(work[i]["ids"]), config(work[i]["max_tokens"]))
        if not pipe.has_non_finished_requests():
            time.sleep(max(0.0, work[pending[0]]["arrival"] - now))
            continue
        pipe.step()
        now = time.perf_counter() - start
        for i, handle in list(handles.items()):
            while handle.can_read():
                for output in handle.read().values():
                    tokens[i] += [int(t) for t in output.generated_ids]
                    stamps[i] += [now] * len(output.generated_ids)
            if handle.get_status() != genai.GenerationStatus.RUNNING and not handle.can_read():
                del handles[i]
    return dict(load_s=load_s, tokens=tokens, stamps=stamps, eos=int(eos), scheduler=scheduler.to_string(),
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)


MEASURE = {"ort": measure_ort, "openvino": measure_openvino, "transformers": measure_transformers,
           "openvino_cb": measure_openvino_cb}


def main(argv):
    command, args = argv[0], argv[1:]
    if command == "model":
        make_model(args[0], json.loads(args[1]))
    elif command == "ort":
        build_ort(args[0], args[1], int(args[2]), *args[3:4])
    elif command == "openvino":
        build_openvino(args[0], args[1], *args[2:3])
    elif command == "measure":
        with open(args[0], encoding="utf-8") as f:
            job = json.load(f)
        result = MEASURE[job["runtime"]](job)
        with open(args[1], "w", encoding="utf-8") as f:
            json.dump(result, f)
    else:
        raise SystemExit(f"unknown command {command!r}; allowed: model, ort, openvino, measure")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
