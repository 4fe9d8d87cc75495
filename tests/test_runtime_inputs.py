"""What the runtime's users pass: `--predict_data` values, `pipeline(...)` keywords, prompts and
streamers, `--num_threads`, and hand-edited manifests. Each mistake is one project error naming the
value and what is allowed.
"""
import json
import os
import re

import pytest

from lite_runtime import InferConfig
from lite_runtime.cli.run_infer import read_prompts
from lite_runtime.contract.errors import ArtifactError, ConfigError, ValidationError
from support.runtime_checks import assert_one_line_error, edit_manifest, export_dir, tokenizer_model  # noqa: F401 (fixtures)
from support.tiny_models import run_cli

TXT_ALLOWED = "allowed: a prompt text, or a .txt file (UTF-8) with one prompt per line"


# --- --predict_data -----------------------------------------------------------------------------------
@pytest.mark.fast
def test_predict_data_file_that_is_not_txt_is_refused_not_used_as_the_prompt(tmp_path):
    prompts = tmp_path / "prompts.csv"
    prompts.write_text("prompt\nhello world\n", encoding="utf-8")
    result = run_cli(["run_infer_main.py", "--backend", "ms", "--model_dir", str(tmp_path / "no_export"),
                      "--predict_data", str(prompts)])
    assert_one_line_error(result, f"--predict_data {prompts} is a file, not a .txt file", TXT_ALLOWED)
    assert result.stdout == ""


@pytest.mark.fast
@pytest.mark.parametrize("name", ["prompts.csv", "data/prompts.jsonl", "questions.JSON"])
def test_predict_data_naming_a_missing_data_file_is_refused(tmp_path, name):
    with pytest.raises(ConfigError) as info:
        read_prompts(str(tmp_path / name), None)
    assert str(info.value) == (f"--predict_data file {tmp_path / name} does not exist (and is not a .txt file); "
                               + TXT_ALLOWED)


@pytest.mark.fast
def test_predict_data_naming_a_folder_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a folder, not a .txt file"):
        read_prompts(str(tmp_path), None)


@pytest.mark.fast
def test_predict_data_file_bom_is_not_part_of_the_first_prompt(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("\ufeffhello world\nsecond\n".encode("utf-8"))
    assert read_prompts(str(prompts), None) == ["hello world", "second"]


@pytest.mark.fast
@pytest.mark.parametrize("prompt", ["What is in data.csv?", "Summarise report.json", "hello", "e.g. this"])
def test_predict_data_prompt_texts_stay_prompts(prompt):
    assert read_prompts(prompt, None) == [prompt]


# --- prompts and streamers ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_pipe(tiny_exports, tokenizer_model):
    from lite_runtime import pipeline
    pipe = pipeline(model=tiny_exports["io"], backend="ms", tokenizer_path=tokenizer_model)
    yield pipe
    pipe.close()


@pytest.mark.parametrize("inputs", [None, 42, {"text": "hello"}])
def test_inputs_that_are_not_prompts_are_named(tiny_pipe, inputs):
    with pytest.raises(ValidationError) as info:
        tiny_pipe(inputs, max_new_tokens=2)
    assert str(info.value) == f"inputs must be a prompt (str) or a list of prompts, got {inputs!r}"


def test_streamer_without_put_and_end_is_named(tiny_pipe):
    streamer = object()
    with pytest.raises(ValidationError) as info:
        tiny_pipe("hello", max_new_tokens=2, streamer=streamer)
    assert f"streamer {streamer!r} has no put(new_ids) and end() methods" in str(info.value)


def test_iterator_streamer_with_too_few_rows_is_named_and_ended(tiny_pipe):
    from lite_runtime.decode.streamers import TextIteratorStreamer
    streamer = TextIteratorStreamer(tiny_pipe.tokenizer, batch_size=1, timeout=5)
    with pytest.raises(ValidationError) as info:
        tiny_pipe(["hello", "one two"], max_new_tokens=2, streamer=streamer)
    assert "TextIteratorStreamer(batch_size=1)" in str(info.value) and "2 prompts" in str(info.value)
    assert "batch_size=2" in str(info.value)
    assert list(streamer) == []     # ended: a consumer thread is not left waiting


def test_transformers_text_streamer_prints_the_answer(tiny_pipe, capsys):
    """transformers' TextStreamer gets the prompt, then one token array per step, as from its own
    generate; with skip_prompt it prints exactly the new text."""
    from transformers import TextStreamer
    expected = tiny_pipe("one two three", max_new_tokens=6)[0]["text_generation_text"][0]
    capsys.readouterr()
    streamed = tiny_pipe("one two three", max_new_tokens=6,
                         streamer=TextStreamer(tiny_pipe.tokenizer, skip_prompt=True))
    printed = capsys.readouterr().out
    assert streamed[0]["text_generation_text"][0] == expected
    assert printed.strip() and expected.endswith(printed.strip()), (printed, expected)


def test_transformers_streamer_with_two_prompts_is_refused(tiny_pipe):
    from transformers import TextStreamer
    with pytest.raises(ValidationError, match="streams one prompt; this request has 2"):
        tiny_pipe(["hello", "one"], max_new_tokens=2, streamer=TextStreamer(tiny_pipe.tokenizer))


# --- pipeline(...) keywords -----------------------------------------------------------------------------
def test_pipeline_takes_generation_keywords_as_defaults_of_its_calls(tiny_exports, tokenizer_model, tiny_pipe):
    """Upstream passes add_special_tokens and is_sample_acceleration to pipeline(...); they, and the other
    generation keywords, are the defaults of every call, which a call's own keyword overrides."""
    from lite_runtime import pipeline
    pipe = pipeline(model=tiny_exports["io"], backend="ms", tokenizer_path=tokenizer_model, add_special_tokens=False,
                    is_sample_acceleration=True, max_new_tokens=1)
    try:
        assert pipe("one two") == tiny_pipe("one two", add_special_tokens=False, max_new_tokens=1)
        assert pipe("one two", max_new_tokens=4) == tiny_pipe("one two", add_special_tokens=False, max_new_tokens=4)
        assert pipe("one two") != pipe("one two", max_new_tokens=4)
    finally:
        pipe.close()


def test_unknown_call_keyword_is_named(tiny_pipe):
    with pytest.raises(ConfigError, match="unknown keyword 'top_n'; allowed: do_sample, top_k"):
        tiny_pipe("hello", top_n=3)


# --- threads and manifests ----------------------------------------------------------------------------
@pytest.mark.fast
def test_num_threads_zero_is_refused(tmp_path):
    result = run_cli(["run_infer_main.py", "--model_dir", str(tmp_path), "--predict_data", "hello",
                      "--num_threads", "0"])
    assert_one_line_error(result, "--num_threads 0", "give 1 or more")
    with pytest.raises(ConfigError, match="num_threads must be an integer >= 1, got 0"):
        InferConfig(model_dir=str(tmp_path), num_threads=0)


@pytest.mark.parametrize("key, facts", [
    ("family", ["is malformed: it has no family", "required keys: family, model_config"]),
    ("graphs", ["is malformed: it has no graphs", "required keys"]),
])
def test_hand_edited_manifest_missing_a_key_is_named(export_dir, key, facts):
    from lite_runtime import pipeline
    edit_manifest(export_dir, lambda data: data.pop(key))
    with pytest.raises(ArtifactError) as info:
        pipeline(model=export_dir, backend="ms")
    assert os.path.join(export_dir, "manifest.json") in str(info.value)
    for fact in facts:
        assert fact in str(info.value)


@pytest.mark.parametrize("change, fact", [
    (lambda data: data["graphs"].pop("increment"), "graphs has no increment entry (kv_cache io needs prefill, "
                                                   "increment)"),
    (lambda data: data.update(colour="blue"), "unknown key colour"),
])
def test_hand_edited_manifest_other_damage_is_named(export_dir, change, fact):
    from lite_runtime import pipeline
    edit_manifest(export_dir, change)
    with pytest.raises(ArtifactError, match=re.escape(fact)):
        pipeline(model=export_dir, backend="ms")


@pytest.mark.fast
def test_generation_options_are_checked_once_and_travel_as_they_are():
    """One GenerationOptions for pipeline keywords, run_infer_main's options and other ranks: checked on
    construction, changed by keyword (unknown ones refused), the same after a round trip through JSON."""
    from lite_runtime.api.generation_options import GenerationOptions
    from lite_runtime.contract.errors import ConfigError, ValidationError
    options = GenerationOptions(do_sample=True, top_k=3, seed=7, adapter_id=["a", "b"])
    assert GenerationOptions.from_json(json.loads(json.dumps(options.to_json()))) == options
    assert options.updated(top_k=5).top_k == 5 and options.top_k == 3
    assert options.sampling().top_k == 3 and options.sampling().seed == 7
    with pytest.raises(ConfigError, match="unknown keyword 'top_n'"):
        options.updated(top_n=2)
    # the server's fields map onto the same SamplingParams, in its own terms for greedy and top-k off
    from lite_runtime.serve.protocol import CompletionRequest
    given = dict(top_p=0.9, seed=3, min_p=0.1, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.1,
                 logit_bias={5: 2.0}, min_tokens=2)
    served = CompletionRequest(model="m", prompt="hi", temperature=0.7, top_k=-1, **given).sampling()
    assert served == GenerationOptions(do_sample=True, top_k=0, temperature=0.7, **given).sampling()
    assert CompletionRequest(model="m", prompt="hi", temperature=0).sampling() == GenerationOptions(top_k=0).sampling()
    with pytest.raises(ValidationError, match="top_p"):
        GenerationOptions(top_p=0)
    with pytest.raises(ValidationError, match="max_new_tokens"):
        GenerationOptions(max_new_tokens=0)
