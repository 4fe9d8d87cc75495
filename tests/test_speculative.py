"""Speculative decoding (prompt lookup, verified in one packed step) keeps the text: on every family's
tiny model, greedy tokens with guesses equal transformers' (or the numpy reference's) on `ms`, on real
Lite as one .ms and as one rank's segments; guesses that are partly wrong on purpose give the same
tokens; sampling with a seed gives the plain run's tokens. The server's --speculative gives
pipeline()'s text and reports its guesses in /metrics; a bad value is one line."""
import json
import os
import re
import urllib.request

import numpy as np
import pytest

from support.family_cases import FAMILIES, reference
from support.serving import PROMPTS, client, pipeline_texts  # noqa: F401 (a fixture)
from support.tiny_models import REPO, run_cli


@pytest.mark.fast
def test_guesses_follow_the_latest_earlier_ngram():
    from lite_runtime.decode.speculation import Speculation
    guess = Speculation(k=4)
    assert guess.propose([1, 2, 3, 4, 5, 9, 2, 3, 4], 10) == [5, 9, 2, 3]     # the 3-gram 2 3 4
    assert guess.propose([6, 2, 3, 8, 1, 3], 10) == []                       # no 2-gram: 1 3 is new
    assert guess.propose([6, 1, 3, 8, 1, 3], 10) == [8, 1, 3]                # the 2-gram 1 3
    assert guess.propose([7, 1, 8, 7, 1, 9, 7, 1], 10) == [9, 7, 1]          # the latest 7 1
    assert guess.propose([1, 2, 3, 4, 5, 9, 2, 3, 4], 2) == [5, 9]           # the room left
    assert guess.propose([1, 2, 3], 10) == [] and guess.propose([5], 10) == []
    assert Speculation(k=4, min_ngram=1).propose([1, 2, 3, 7, 3], 10) == [7, 3]    # single tokens, if asked


@pytest.mark.parametrize("value", ["draft:out/small", "ngram:0", "ngram:x", "lookup"])
def test_a_bad_speculative_value_is_one_line(demo_exports, value):
    result = run_cli(["-m", "lite_runtime.serve", "--model_dir", demo_exports["ms"], "--backend", "ms",
                      "--speculative", value])
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and value in lines[0] and "ngram" in lines[0], result.stderr


def speculate(backend, export, prompts, folder, name, steps):
    path = folder / f"{name}_prompts.json"
    path.write_text(json.dumps([list(map(int, p)) for p in prompts]))
    result = run_cli([os.path.join(REPO, "tests", "support", "speculative_runner.py"), backend, export, str(path), str(steps)])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", ["packed", "lite_packed", "lite_segments_packed"])
@pytest.mark.parametrize("family", FAMILIES)
def test_speculation_keeps_the_reference_tokens(hf_family, family_export, family, variant):
    folder = hf_family(family)
    prompts, _, ref_tokens = reference(folder)
    backend = "mslite" if variant.startswith("lite") else "ms"
    want = np.asarray(ref_tokens).tolist()
    got = speculate(backend, family_export(family, variant), prompts, folder, f"spec_{variant}", len(want[0]))
    for run in ("plain", "ngram", "oracle"):
        assert got[run] == want, f"{family} {variant} {run}: greedy tokens differ from the reference"
    proposed, accepted = got["oracle_stats"]
    assert 0 < accepted < proposed, got["oracle_stats"]      # both kinds of guesses were verified
    assert got["sampled_ngram"] == got["sampled_plain"]


# The demo model continues counting: from the second round on, prompt lookup guesses the words
COUNTING = "Counting: one, two, three, four, five, six, seven, eight, nine, ten, one, two, three,"


@pytest.fixture(scope="module")
def prompts_and_texts(demo_exports, pipeline_texts):
    """PROMPTS + [COUNTING] and their plain greedy continuations by pipeline() on `ms`."""
    from lite_runtime import pipeline
    pipe = pipeline("text_generation", model=demo_exports["ms"], backend="ms")
    counted = pipe(COUNTING, max_new_tokens=10, add_special_tokens=True)[0]["text_generation_text"][0]
    return PROMPTS + [COUNTING], pipeline_texts + [counted[len(COUNTING):]]


def test_the_server_speculates_with_the_same_text(demo_exports, prompts_and_texts):
    from served_process import served as serve_process
    from support.lite_process import ensure_lite_installed
    ensure_lite_installed()
    prompts, expected = prompts_and_texts
    with serve_process(demo_exports["mslite"], "mslite", "demo", cwd=REPO, extra=["--speculative", "ngram:3"]) as server:
        api = client(server.url)
        texts = [api.completions.create(model="demo", prompt=p, max_tokens=10, temperature=0).choices[0].text
                 for p in prompts]
        streamed = "".join(c.choices[0].text for c in api.completions.create(
            model="demo", prompt=COUNTING, max_tokens=10, temperature=0, stream=True) if c.choices)
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
    assert texts == expected and streamed == expected[-1]
    proposed = float(re.search(r"^lite_speculative_proposed_tokens_total (\S+)", metrics, re.M).group(1))
    accepted = float(re.search(r"^lite_speculative_accepted_tokens_total (\S+)", metrics, re.M).group(1))
    assert 0 < accepted <= proposed, (accepted, proposed)


def test_pipeline_speculates_with_the_same_text_streamed_or_not(demo_exports, prompts_and_texts):
    """pipeline(speculative=...) on the demo model: its texts, and a streamer given each confirmed token
    in its own step (transformers' TextStreamer prints the same text)."""
    from transformers import TextStreamer
    from lite_runtime import pipeline
    prompts, expected = prompts_and_texts
    pipe = pipeline("text_generation", model=demo_exports["ms"], backend="ms", speculative="ngram:3")
    answers = pipe(prompts, max_new_tokens=10, add_special_tokens=True)
    assert [a["text_generation_text"][0][len(p):] for a, p in zip(answers, prompts)] == expected
    assert sum(engine.speculated.accepted for engine in pipe._engines.values()) > 0
    printed = []

    class Collect(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            printed.append(text)
    pipe(COUNTING, max_new_tokens=10, add_special_tokens=True, streamer=Collect(pipe.tokenizer, skip_prompt=True))
    assert "".join(printed).strip() == expected[-1].strip()


@pytest.mark.fast
def test_a_bad_speculative_keyword_is_refused_naming_it():
    from lite_runtime.api.generation_options import GenerationOptions
    from lite_runtime.contract.errors import ToolchainError
    with pytest.raises(ToolchainError, match="speculative 'lookup'.*ngram"):
        GenerationOptions(speculative="lookup")
