"""The paged KV store within a budget (kv_cache_gb) on real Lite: requests submitted together beyond what it
holds are preempted (newest first) and fed again, giving the greedy tokens they get without a budget; every
block comes back when they end (a cached prefix keeps only its own); a budget below one sequence is one line."""
import os

import pytest

from support.runtime_checks import assert_one_line_error
from support.tiny_models import REPO, run_cli

RUNNER = os.path.join(REPO, "tests", "support", "kv_budget_runner.py")


def run(export, blocks, prefix_bytes=0, dtype="float16"):
    result = run_cli([RUNNER, export, str(blocks), str(prefix_bytes), dtype])
    assert result.returncode == 0, result.stderr[-3000:]
    return eval(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def unbounded(demo_exports):
    return run(demo_exports["mslite_paged"], 0)


def test_preempted_requests_give_the_tokens_they_get_without_a_budget(demo_exports, unbounded):
    assert unbounded["preemptions"] == 0 and unbounded["held"] == 0
    assert unbounded["total"] == 4 * 8           # every row's seq_length: 4 rows of 128 positions in blocks of 16
    bounded = run(demo_exports["mslite_paged"], 10)          # 10 of the 8 blocks one sequence needs
    assert bounded["total"] == 10 and bounded["preemptions"] > 0
    assert bounded["tokens"] == unbounded["tokens"] and bounded["reasons"] == unbounded["reasons"]
    assert bounded["held"] == 0 and all(len(t) > 40 for t in bounded["tokens"])


def test_int8_k_v_give_the_demo_model_its_float16_tokens_within_a_budget(demo_exports, unbounded):
    """int8 K/V (a scale per run of 32 values of a position and head): the demo model's confident greedy tokens, preempted or not."""
    bounded = run(demo_exports["mslite_paged"], 10, 0, "int8")
    assert bounded["total"] == 10 and bounded["preemptions"] > 0
    assert bounded["tokens"] == unbounded["tokens"] and bounded["held"] == 0


def test_cached_prefixes_live_within_the_budget_and_keep_only_their_blocks(demo_exports, unbounded):
    cached = run(demo_exports["mslite_paged"], 12, 64 << 20)
    assert cached["total"] == 12 and cached["tokens"] == unbounded["tokens"]
    assert cached["held"] == len(cached["entries"]) <= 12


def test_a_budget_below_one_sequence_is_one_line(demo_exports):
    result = run_cli(["run_infer_main.py", "--model_dir", demo_exports["mslite_paged"], "--predict_data", "hi",
                      "--kv_cache_gb", "0.00001"], timeout=180)
    assert_one_line_error(result, "kv_cache_gb 1e-05 holds 2 blocks of 16 positions", "seq_length 128 needs 8",
                          "allowed: 3.1e-05 or more")


def test_the_server_within_a_budget_answers_every_request_and_counts_preemptions(demo_exports):
    """Five greedy completions at once on a store of 10 blocks: each the text it gets alone; /metrics shows the
    preemptions and the store's use."""
    import re
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor
    from openai import OpenAI
    from served_process import served
    from support.prefix_cache_runner import PROMPTS
    prompts = PROMPTS + [PROMPTS[0][:40], PROMPTS[1] + " and"]
    export = demo_exports["mslite_paged"]
    with served(export, "mslite", "demo", extra=["--kv_cache_gb", f"{10 * 4096 / 2 ** 30!r}"], cwd=REPO) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

        def complete(prompt):
            return client.completions.create(model="demo", prompt=prompt, max_tokens=80, temperature=0).choices[0]
        alone = [complete(p) for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(complete, prompts))
        metrics = urllib.request.urlopen(server.url + "/metrics").read().decode()
    assert [c.text for c in together] == [c.text for c in alone]
    assert [c.finish_reason for c in together] == [c.finish_reason for c in alone]
    preempted = float(re.search(r"^lite_preemptions_total (\S+)$", metrics, re.M).group(1))
    assert preempted > 0, metrics
    assert re.search(r"^lite_kv_cache_capacity_bytes 40960\.0$", metrics, re.M), metrics
    # the rows gave every block back: what the store still holds is the prefix cache's (on by default; which
    # prompts it keeps at the end depends on how the five requests interleaved)
    used, cached = (float(re.search(rf"^{name} (\S+)$", metrics, re.M).group(1))
                    for name in ("lite_kv_cache_used_bytes", "lite_prefix_cache_bytes"))
    assert used == cached, metrics
