"""Prefix caching, measured: a chat workload whose requests share one long system prompt, sent to the
server with the prefix cache (the server's default, or `--cache_gb`) and without it (`--prefix_cache_gb 0`),
side by side, with the answers checked equal.

    python tools/bench_prefix.py --model_dir output/smollm2_2k [--requests 12] [--system_tokens 1000]
                                 [--max_tokens 16] [--clients 1] [--backend mslite] [--first_alone]
    python tools/bench_prefix.py --model_dir output/smollm2_4k --distinct --kv_cache_gb 2 ...

With --distinct no two prompts share a block: one side only (the cache changes nothing), for the KV store's use
within --kv_cache_gb: every answer's finish reason, the preemptions, the most K/V held and the server's peak RSS.

Each request is the same system message (the words of a fixed text repeated to about
`--system_tokens` tokens through the export's chat template) and its own question; greedy. The
server runs in a process of its own, once without the cache and once with it (the first request
fills it). Printed per side: TTFT p50 / p90 (from sending to the first streamed token), throughput
(generated tokens per second over the run), the cached prompt tokens reported in usage, and on the
paged store (`attention: paged`) the most K/V it held at once (`/metrics`' lite_kv_cache_used_bytes, read
every 20 ms) against one request's prompt; then the ratios. The export needs a context above the system
prompt (e.g. `seq_length: 2048`); with `--clients` as many as its rows, every request is in flight at once.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import click
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tools"))
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402
from served_process import served  # noqa: E402
from lite_runtime.tokenizers import export_tokenizer  # noqa: E402

TEXT = ("The assistant answers questions about the city library. The library opens at nine in the morning and "
        "closes at six in the evening, except on Sundays, when it opens at noon. Members may borrow up to ten "
        "books for three weeks; rare books stay in the reading room. ")
QUESTIONS = ["When does the library open?", "How many books may I borrow?", "Can I take rare books home?",
             "Is the library open on Sunday morning?", "How long may I keep a book?", "When does it close?"]


def chats(tokenizer, system_tokens: int, requests: int, distinct: bool = False) -> list:
    """`distinct`: each system prompt opens with its chat's number, so that no two share a block."""
    per = len(tokenizer.encode(TEXT))
    system = TEXT * max(1, system_tokens // per)
    return [[{"role": "system", "content": (f"Chat {i}. " if distinct else "") + system},
             {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(requests)]


class KVWatch(threading.Thread):
    """The most bytes the server's KV store held at once, from its /metrics, while the run lasts; its capacity
    and the preemptions so far."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.peak, self.done = url + "/metrics", 0.0, threading.Event()
        self.capacity = self.preemptions = 0.0

    def run(self):
        import httpx2
        from prometheus_client.parser import text_string_to_metric_families
        while not self.done.wait(0.02):
            for family in text_string_to_metric_families(httpx2.get(self.url).text):
                value = family.samples[0].value if family.samples else 0.0
                if family.name == "lite_kv_cache_used_bytes":
                    self.peak = max(self.peak, value)
                elif family.name == "lite_kv_cache_capacity_bytes":
                    self.capacity = value
                elif family.name == "lite_preemptions":
                    self.preemptions = value

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


def run_side(model_dir, backend, extra, messages, max_tokens, clients, first_alone=False) -> dict:
    from openai import OpenAI
    with served(model_dir, backend, "bench", extra=list(extra), cwd=REPO, start_timeout=300) as server, \
            KVWatch(server.url) as kv:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)

        def one(chat):
            start, first, text, usage, reason = time.perf_counter(), None, [], None, None
            stream = client.chat.completions.create(model="bench", messages=chat, max_tokens=max_tokens,
                                                    temperature=0, stream=True,
                                                    stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.perf_counter()
                    text.append(chunk.choices[0].delta.content)
                if chunk.choices and chunk.choices[0].finish_reason:
                    reason = chunk.choices[0].finish_reason
                usage = chunk.usage or usage
            return first - start, "".join(text), usage, reason
        started = time.perf_counter()
        first = [one(messages[0])] if first_alone else []
        with ThreadPoolExecutor(clients) as pool:
            results = first + list(pool.map(one, messages[len(first):]))
        seconds = time.perf_counter() - started
        rss = server.rss_bytes(peak=True)
    ttft = np.array([r[0] for r in results])
    tokens = sum(r[2].completion_tokens for r in results if r[2] is not None)
    cached = [getattr(getattr(r[2], "prompt_tokens_details", None), "cached_tokens", 0) for r in results]
    return {"ttft_p50": float(np.median(ttft)), "ttft_p90": float(np.percentile(ttft, 90)),
            "throughput": tokens / seconds, "texts": [r[1] for r in results], "cached": cached,
            "prompt_tokens": results[0][2].prompt_tokens, "kv_peak": kv.peak, "kv_capacity": kv.capacity,
            "preemptions": kv.preemptions, "reasons": collections.Counter(r[3] for r in results), "rss": rss}


@click.command(context_settings=CONTEXT)
@click.option("--model_dir", required=True)
@click.option("--backend", type=click.Choice(["mslite", "ms"]), default="mslite", show_default=True)
@click.option("--requests", type=click.IntRange(2, None), default=12, show_default=True)
@click.option("--system_tokens", type=click.IntRange(16, None), default=1000, show_default=True)
@click.option("--max_tokens", type=click.IntRange(1, None), default=16, show_default=True)
@click.option("--clients", type=click.IntRange(1, None), default=1, show_default=True)
@click.option("--cache_gb", type=float, default=None,
              help="the cached side's --prefix_cache_gb; default: the server's (on a paged export: within its KV store)")
@click.option("--first_alone", is_flag=True, help="send the first request alone, the others after it: a system "
              "prompt the server has answered before")
@click.option("--distinct", is_flag=True, help="no prompt shares a block with another: only the server's default "
              "side runs, for the KV store's use within --kv_cache_gb")
@click.option("--kv_cache_gb", type=click.FloatRange(0, None, min_open=True), default=None,
              help="the server's KV store (default: its own)")
def command(model_dir, backend, requests, system_tokens, max_tokens, clients, cache_gb, first_alone, distinct,
            kv_cache_gb):
    """Time to first token and throughput of a shared-system-prompt chat workload, without and with the
    prefix cache."""
    from lite_runtime.contract.manifest import load_manifest
    manifest = load_manifest(model_dir)
    messages = chats(export_tokenizer(manifest), system_tokens, requests, distinct)
    budget = [] if kv_cache_gb is None else ["--kv_cache_gb", str(kv_cache_gb)]
    if distinct:
        return report_distinct(manifest, run_side(model_dir, backend, budget, messages, max_tokens, clients),
                               requests, clients)
    plain = run_side(model_dir, backend, budget + ["--prefix_cache_gb", "0"], messages, max_tokens, clients,
                     first_alone)
    cached = run_side(model_dir, backend, budget + ([] if cache_gb is None else ["--prefix_cache_gb", str(cache_gb)]),
                      messages, max_tokens, clients, first_alone)
    if plain["texts"] != cached["texts"]:
        differ = [i for i, (a, b) in enumerate(zip(plain["texts"], cached["texts"])) if a != b]
        raise ToolchainError(f"the answers differ with the prefix cache (requests {differ})")
    print(f"{requests} requests, {plain['prompt_tokens']} prompt tokens each (a shared system prompt), "
          f"{max_tokens} new tokens, {clients} client(s){', the first alone' if first_alone else ''}, {backend}; "
          "answers equal: yes")
    for name, side in (("no cache", plain), ("prefix cache", cached)):
        print(f"  {name:13s} TTFT p50 {side['ttft_p50'] * 1e3:8.1f} ms  p90 {side['ttft_p90'] * 1e3:8.1f} ms  "
              f"throughput {side['throughput']:6.2f} tokens/s  cached tokens {sum(side['cached'])}")
    print(f"  ratios (cache / none): TTFT p50 {cached['ttft_p50'] / plain['ttft_p50']:.2f}x, "
          f"throughput {cached['throughput'] / plain['throughput']:.2f}x")
    if cached["kv_peak"]:
        prompt = prompt_bytes(manifest, plain["prompt_tokens"])
        print(f"  most K/V held at once: no cache {plain['kv_peak'] / 2 ** 20:.1f} MiB "
              f"({plain['kv_peak'] / prompt:.2f} prompts' worth), prefix cache {cached['kv_peak'] / 2 ** 20:.1f} MiB "
              f"({cached['kv_peak'] / prompt:.2f}); one prompt {prompt / 2 ** 20:.1f} MiB")


def prompt_bytes(manifest, tokens: int) -> int:
    d = manifest.dims      # the server's default K/V: float16
    return tokens * 2 * d.num_layers * d.kv_heads_per_rank * d.head_dim * 2


def report_distinct(manifest, side: dict, requests: int, clients: int) -> None:
    prompt = prompt_bytes(manifest, side["prompt_tokens"])
    print(f"{requests} requests, about {side['prompt_tokens']} prompt tokens each (no block shared), {clients} "
          f"client(s); finish reasons {dict(side['reasons'])}")
    print(f"  TTFT p50 {side['ttft_p50']:.1f} s  p90 {side['ttft_p90']:.1f} s  throughput {side['throughput']:.2f} "
          f"tokens/s  preemptions {side['preemptions']:.0f}")
    print(f"  KV store {side['kv_capacity'] / 2 ** 30:.2f} GiB, most held at once {side['kv_peak'] / 2 ** 30:.2f} GiB "
          f"({side['kv_peak'] / prompt:.1f} prompts' worth); server peak RSS {side['rss'] / 2 ** 30:.2f} GiB")


main = entry_point(command, "tools/bench_prefix.py")

if __name__ == "__main__":
    sys.exit(main())
