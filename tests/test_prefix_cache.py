"""Prefix caching on the engine's host-owned cache: prompts sharing a prefix get the greedy tokens they
get without the cache (the demo model, `ms` and real Lite), the shared blocks are reused (and said in
usage.prompt_tokens_details.cached_tokens and /metrics), and the store stays within its bytes."""
import os
import re
import urllib.request

import pytest

from support.prefix_cache_runner import PROMPTS, compare, prompt_ids, run_each_alone
from support.tiny_models import REPO
from lite_runtime.tokenizers import export_tokenizer


@pytest.mark.parametrize("backend", ["ms", "mslite", "mslite_paged"])
def test_prompts_sharing_a_prefix_get_their_uncached_tokens(demo_exports, backend, tmp_path):
    """mslite_paged: the cached prefix's blocks of the kernels' paged store, given to the next row by reference;
    there the prompts submitted together reuse them too (the later ones wait for the blocks being computed)."""
    from lite_runtime.decode.prefix_cache import BLOCK
    if backend.startswith("mslite"):       # Lite's process must not import mindspore: the same check in a child
        from support.tiny_models import run_cli
        result = run_cli([os.path.join(REPO, "tests", "support", "prefix_cache_runner.py"), demo_exports[backend]])
        assert result.returncode == 0, result.stderr[-2000:]
        plain, cached, together = eval(result.stdout)
    else:
        plain, cached, together = compare(demo_exports[backend])
    tokenizer_ids = prompt_ids(demo_exports[backend])
    assert [t for t, _ in cached] == [t for t, _ in plain]
    assert [n for _, n in plain] == [0, 0, 0]
    shared = len(tokenizer_ids[0]) - len(tokenizer_ids[0]) % BLOCK     # whole blocks both prompts hold
    common = next(i for i, (a, b) in enumerate(zip(tokenizer_ids[0], tokenizer_ids[1])) if a != b)
    assert cached[0][1] == 0 and cached[1][1] == common - common % BLOCK > 0
    assert cached[2][1] == min(shared, (len(tokenizer_ids[2]) - 1) // BLOCK * BLOCK) > 0
    assert [t for t, _ in together] == [t for t, _ in plain]
    if backend == "mslite_paged":
        assert [n for _, n in together] == [n for _, n in cached]
    else:       # host arrays: a prompt is stored once it is whole, after the others have started theirs
        assert [n for _, n in together] == [0, 0, 0]


def test_the_store_keeps_within_its_bytes_dropping_the_least_recent(demo_exports):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine
    ids = prompt_ids(demo_exports["ms"])
    session = load_session("ms", load_manifest(demo_exports["ms"]))
    one = Engine(session, threaded=False, prefix_cache_bytes=64 << 20)
    run_each_alone(one, ids[:1])
    size = one.prefix.bytes            # one prompt's K/V
    other = export_tokenizer(load_manifest(demo_exports["ms"])).encode(
        "Counting down: ten, nine, eight, seven, six, five, four, three, two, one, ten, nine, eight, seven, six,",
        add_special_tokens=True)
    assert len(other) // 16 == len(ids[0]) // 16        # as many whole blocks: as many bytes
    small = Engine(session, threaded=False, prefix_cache_bytes=int(size * 1.5))
    run_each_alone(small, [ids[0], other])
    assert small.prefix.bytes == size and small.prefix.evictions == 1     # ids[0]'s K/V made room for other's
    assert run_each_alone(small, [ids[0]])[0][1] == 0 and small.prefix.evictions == 2
    assert run_each_alone(small, [ids[1]])[0][1] > 0              # ids[0]'s again: what ids[1] shares with it is reused


@pytest.mark.parametrize("backend, extra", [("ms", ["--prefix_cache_gb", "0.05"]), ("mslite_paged", [])])
def test_the_server_reports_cached_tokens_and_counts_hits(demo_exports, backend, extra):
    """mslite_paged: on by default, within the paged store."""
    from openai import OpenAI
    from served_process import served
    with served(demo_exports[backend], backend.split("_")[0], "demo", extra=extra, cwd=REPO) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        first = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=8, temperature=0)
        second = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=8, temperature=0)
        metrics = urllib.request.urlopen(server.url + "/metrics").read().decode()
    assert second.choices[0].text == first.choices[0].text
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert re.search(r"^lite_prefix_cache_hits_total 1\.0$", metrics, re.M), metrics
