"""Speculative decoding with a draft model (`--speculative draft:DIR[:K]`, lite_runtime/decode/draft.py) keeps
the text: on llama's tiny model, on `ms` and on real Lite (a process without mindspore), the target's own
export as its draft has every guess accepted, another model with the same tokenizer (the same folder with
noise added to its weights) has some rejected, and both give transformers' greedy tokens and the plain
run's seeded samples.
Drafts that cannot guess for the target are refused in one line."""
import dataclasses
import json
import os
import shutil
import sys

import numpy as np
import pytest

from support.family_cases import BATCH, SEQ, reference
from support.tiny_models import REPO, VENV_MS20_PYTHON, export_in_subprocess, run_cli, write_yaml

VARIANTS = ["packed", "lite_packed"]


@pytest.fixture(scope="session")
def other_llama(hf_family):
    """variant -> an export of llama's tiny model with noise added to its weights (the tokenizer file the same)."""
    made = {}

    def get(variant):
        if variant not in made:
            from safetensors.numpy import load_file, save_file
            folder = hf_family("llama")
            hf = folder / "hf_other"
            if not hf.exists():
                shutil.copytree(folder / "hf", hf)
                rng = np.random.default_rng(1)
                weights = {name: w + 0.05 * w.std() * rng.standard_normal(w.shape).astype(w.dtype)
                           for name, w in load_file(str(hf / "model.safetensors")).items()}
                save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
            lite = variant.startswith("lite")
            cfg = {"model": {"hf_dir": str(hf)}, "seq_length": SEQ, "batch_size": BATCH, "kv_cache": "packed",
                   "output_dir": str(folder / f"export_other_{variant}"), **({"lite_ms": True} if lite else {})}
            made[variant] = export_in_subprocess(write_yaml(str(folder / f"other_{variant}.yaml"), cfg),
                                                 python=str(VENV_MS20_PYTHON) if lite else sys.executable)
        return made[variant]
    return get


def with_draft(variant, target, draft, folder, name):
    """tests/support/speculative_runner.py with a draft: plain, draft and sampled runs of the reference prompts,
    twice (the second time in reverse, so that rows are reused by other prompts), and the reference's
    tokens of each."""
    prompts, _, ref_tokens = reference(folder)
    prompts, want = prompts + prompts[::-1], np.asarray(ref_tokens).tolist()
    want += want[::-1]
    path = folder / f"{name}_prompts.json"
    path.write_text(json.dumps([list(map(int, p)) for p in prompts]))
    backend = "mslite" if variant.startswith("lite") else "ms"
    result = run_cli([os.path.join(REPO, "tests", "support", "speculative_runner.py"), backend, target, str(path),
                      str(len(want[0])), draft])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), want


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_target_as_its_own_draft_has_every_guess_accepted(hf_family, family_export, variant):
    target = family_export("llama", variant)
    got, want = with_draft(variant, target, target, hf_family("llama"), f"draft_self_{variant}")
    assert got["plain"] == want and got["draft"] == want, "greedy tokens with the draft differ from the reference"
    proposed, accepted = got["draft_stats"]
    assert 0 < proposed == accepted, got["draft_stats"]
    assert got["sampled_draft"] == got["sampled_plain"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_another_model_as_draft_keeps_the_reference_tokens(hf_family, family_export, other_llama, variant):
    target, draft = family_export("llama", variant), other_llama(variant)
    got, want = with_draft(variant, target, draft, hf_family("llama"), f"draft_other_{variant}")
    assert got["draft"] == want, "greedy tokens with the draft differ from the reference"
    proposed, accepted = got["draft_stats"]
    assert 0 < accepted < proposed, got["draft_stats"]      # right and wrong guesses were both verified
    # the cache it kept guessed as the whole text fed afresh would have
    assert got["draft_stats"] == got["fresh_stats"]
    assert got["sampled_draft"] == got["sampled_plain"]


@pytest.mark.fast
def test_the_draft_forgets_what_its_rows_no_longer_share():
    """A row's kept cache is the prefix its held tokens share with the new text; the rest is fed."""
    from lite_runtime.decode.draft import DraftModel

    class Recorder:      # a stand-in session: records the fed tokens, its logits favour token 7
        manifest = dataclasses.make_dataclass("M", ["pad_token_id", "seq_length", "batch_size"])(0, 48, 2)
        fed = []

        def step(self, tokens, counts, past):
            self.fed.append([(int(p), tokens[r, :c].tolist()) for r, (c, p) in enumerate(zip(counts, past)) if c])
            logits = np.zeros((2, 10), np.float32)
            logits[:, 7] = 1
            return logits

    draft = DraftModel(Recorder(), k=3)
    assert draft.guess({0: ([1, 2, 3], 5), 1: ([4, 5], 2)}) == {0: [7, 7, 7], 1: [7, 7]}
    assert draft.held == [[1, 2, 3, 7, 7], [4, 5, 7]]
    Recorder.fed.clear()
    # row 0 kept its first guess only; row 1 holds a new request that shares its first token
    assert draft.guess({0: ([1, 2, 3, 7, 9], 1), 1: ([4, 6, 6], 3)}) == {0: [7], 1: [7, 7, 7]}
    assert Recorder.fed[0] == [(4, [9]), (1, [6, 6])]
    assert draft.held == [[1, 2, 3, 7, 9], [4, 6, 6, 7, 7]]
    Recorder.fed.clear()
    # a text the row holds whole: its last token is fed again, for the logits after it
    assert draft.guess({0: ([1, 2, 3, 7, 9], 1)}) == {0: [7]} and Recorder.fed == [[(4, [9])]]


@pytest.mark.parametrize("value", ["draft:/nonexistent", "draft:/tmp:0", "draft:"])
def test_a_bad_draft_value_is_one_line(demo_exports, value):
    result = run_cli(["-m", "lite_runtime.serve", "--model_dir", demo_exports["ms"], "--backend", "ms",
                      "--speculative", value], timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and value in lines[0] and "draft:DIR" in lines[0], result.stderr


def refused(target, draft):
    """The server's one line for `--speculative draft:DRAFT` on TARGET (it must not start)."""
    result = run_cli(["-m", "lite_runtime.serve", "--model_dir", target, "--backend", "ms", "--port", "0",
                      "--speculative", f"draft:{draft}"], timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    return lines[0]


def test_a_draft_with_another_vocabulary_is_refused(family_export, demo_exports):
    target = family_export("llama", "packed")
    line = refused(target, demo_exports["ms"])
    assert target in line and demo_exports["ms"] in line and "vocabularies" in line, line


def test_a_draft_with_another_tokenizer_file_is_refused(family_export, demo_exports):
    """The same vocabulary size is not enough: the tokenizer files' hashes must match too."""
    from lite_runtime.contract.errors import ConfigError
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.draft import check_draft
    target = load_manifest(family_export("llama", "packed"))
    demo = load_manifest(demo_exports["ms"])
    draft = dataclasses.replace(target, root=demo.root, tokenizer=demo.tokenizer)
    with pytest.raises(ConfigError, match="different tokenizer files"):
        check_draft(draft, target, "--speculative draft:X")
    check_draft(target, target, "--speculative draft:X")


def test_a_glm_target_refuses_a_draft(family_export):
    target = family_export("glm", "packed")
    line = refused(target, target)
    assert target in line and "attend both ways" in line and "ngram" in line, line
