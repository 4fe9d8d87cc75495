"""User mistakes at run time, through `run_infer_main.py --backend ms` and the library.

Each case starts from a copy of the tiny `io` export, damaged or edited as the case needs. The
tiny export ships no tokenizer, so a tiny sentencepiece model (96 pieces, the tiny model's
vocab_size) is trained here and passed with `--tokenizer_path`.
Every CLI mistake: exit != 0, one `error:` line on stderr naming the facts, no traceback.
"""
import os
import re
import subprocess
import sys

import pytest

from support.runtime_checks import assert_one_line_error, edit_manifest, export_dir, tokenizer_model  # noqa: F401 (fixtures)
from support.tiny_models import (KNOWN_FAMILIES, REPO, VENV_MS20_PYTHON, export_in_subprocess, run_cli, tiny_export_config,
                                 write_yaml)

GRAPHS = {"prefill": "mindir_full_checkpoint/rank_0_graph.mindir",
          "increment": "mindir_inc_checkpoint/rank_0_graph.mindir"}
LONG_PROMPT = " ".join(["hello world"] * 40)    # far more than seq_length 48 tokens


def infer_cli(model_dir, tokenizer, *args):
    argv = ["run_infer_main.py", "--backend", "ms", "--model_dir", model_dir, "--max_new_tokens", "3"]
    if tokenizer:
        argv += ["--tokenizer_path", tokenizer]
    return run_cli(argv + list(args), timeout=180)


# --- a damaged or inconsistent export -----------------------------------------------------------------
def test_missing_graph_file(export_dir, tokenizer_model):
    graph = os.path.join(export_dir, GRAPHS["increment"])
    os.remove(graph)
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world")
    assert_one_line_error(result, graph, "does not exist", "manifest.json")


def test_damaged_graph_file(export_dir, tokenizer_model):
    graph = os.path.join(export_dir, GRAPHS["prefill"])
    with open(graph, "r+b") as f:
        f.seek(-16, os.SEEK_END)
        byte = f.read(1)
        f.seek(-16, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world")
    assert_one_line_error(result, graph, "sha256", "export again")


def test_unknown_manifest_format_version(export_dir, tokenizer_model):
    edit_manifest(export_dir, lambda m: m.update(format_version=99))
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world")
    assert_one_line_error(result, os.path.join(export_dir, "manifest.json"), "format_version 99",
                          "format_version 3")


def test_export_of_the_retired_dynamic_kv_mode_is_refused_with_the_command_that_exports_it_again(
        export_dir, tokenizer_model):
    edit_manifest(export_dir, lambda m: m.update(kv_cache="dynamic"))
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world")
    assert_one_line_error(result, export_dir, "kv_cache dynamic", "retired", "kv_cache: packed",
                          "python -m exporter --config <your yaml>")


def _retype_caches(manifest):
    inputs = manifest["graphs"]["increment"]["inputs"]
    inputs[3]["dtype"] = "float16"     # value_cache_0: the first mismatch
    inputs[4]["dtype"] = "float16"     # key_cache_1


def _reshape_token_input(manifest):
    manifest["graphs"]["increment"]["inputs"][0]["shape"] = [3, 2]


@pytest.mark.parametrize("change, facts", [
    (_retype_caches, ["graph input 3", "has dtype float32", "value_cache_0 float16 (3, 2, 48, 8)"]),
    (_reshape_token_input, ["graph input 0", "has shape (3, 1)", "input_ids int32 (3, 2)"]),
], ids=["dtype", "shape"])
def test_graph_inputs_differ_from_manifest(export_dir, tokenizer_model, change, facts):
    edit_manifest(export_dir, change)
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world")
    line = assert_one_line_error(result, os.path.join(export_dir, GRAPHS["increment"]), *facts)
    assert "key_cache_1" not in line


def test_model_dir_that_does_not_exist(tmp_path, tokenizer_model):
    missing = str(tmp_path / "no" / "such" / "export")
    result = infer_cli(missing, tokenizer_model, "--predict_data", "hello world")
    assert_one_line_error(result, missing, "does not exist")


def test_export_without_tokenizer_needs_tokenizer_path(export_dir):
    result = infer_cli(export_dir, None, "--predict_data", "hello world")
    assert_one_line_error(result, export_dir, "no tokenizer", "tokenizer_path")


# --- bad arguments ------------------------------------------------------------------------------------
def test_unknown_family_in_model_name(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--model_name", "gpt5_7b", "--predict_data", "hello")
    assert_one_line_error(result, "'gpt5'", "gpt5_7b",
                          KNOWN_FAMILIES)


def test_seq_length_other_than_the_exports(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--seq_length", "1024", "--predict_data", "hello")
    assert_one_line_error(result, "infer_seq_length 1024", "seq_length 48")


def test_lite_compatible_export_on_backend_ms_is_refused_before_loading(tiny_ckpt, tokenizer_model, tmp_path):
    """A MindSpore 2.0 export (the one Lite reads) crashes MindSpore 2.10's compiler with a long C++ trace."""
    out = str(tmp_path / "ms20")
    yaml_path = write_yaml(str(tmp_path / "ms20.yaml"), tiny_export_config(tiny_ckpt[0], out))
    export_in_subprocess(yaml_path, python=VENV_MS20_PYTHON)
    result = infer_cli(out, tokenizer_model, "--predict_data", "hello world")
    assert_one_line_error(result, out, "written by MindSpore 2.0", "for MindSpore Lite",
                          "export with the .venv environment (`make export CONFIG=...`) for backend ms")
    assert "AbstractBasePtr" not in result.stderr


def test_float16_step_graphs_are_refused_on_lite_cpu_before_loading(tiny_ckpt, tokenizer_model, tmp_path):
    """Lite 2.0 on CPU fails every float16 step graph at Predict ("Common error code")."""
    from support.lite_process import ensure_lite_installed
    ensure_lite_installed()
    out = str(tmp_path / "f16")
    cfg = tiny_export_config(tiny_ckpt[0], out, kv_cache="packed", compute_dtype="float16")
    export_in_subprocess(write_yaml(str(tmp_path / "f16.yaml"), cfg), python=VENV_MS20_PYTHON)
    result = infer_cli(out, tokenizer_model, "--predict_data", "hello world", "--backend", "mslite")
    assert_one_line_error(result, out, "float16 with kv_cache packed", "compute_dtype float32", "kv_cache io")


def test_unknown_backend(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--backend", "nosuch", "--predict_data", "hello")
    assert_one_line_error(result, "'nosuch'", "allowed: ms, mslite")


@pytest.mark.fast
@pytest.mark.parametrize("args, facts", [
    (["--top_k", "abc"], ["'--top_k'", "'abc'", "integer"]),
    (["--truncate", "maybe"], ["'--truncate'", "'maybe'", "True or False"]),
    (["--no_such_flag", "1"], ["No such option '--no_such_flag'"]),
], ids=["int", "bool", "unknown"])
def test_bad_arguments(args, facts):
    result = run_cli(["run_infer_main.py", "--predict_data", "hello", *args])
    assert_one_line_error(result, *facts)
    assert "Usage:" not in result.stdout + result.stderr


@pytest.mark.fast
def test_help_gives_every_option_a_help_line_and_its_default():
    from lite_runtime.cli.run_infer import command
    result = run_cli(["run_infer_main.py", "--help"])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    blocks = re.split(r"\n  (?=-)", result.stdout.split("\nOptions:\n", 1)[1])
    helps = {block.split()[0].rstrip(","): " ".join(block.split()) for block in blocks}
    options = [p for p in command.params if p.name != "help"]
    assert len(options) >= 35
    for option in options:
        text = helps.get(option.opts[0])
        assert text is not None, f"{option.opts[0]} missing from --help"
        assert "default" in text and len(text) > len(option.opts[0]) + 30, text
        if option.default not in (None, "") and "(default: " in text:
            assert f"(default: {option.default})" in text, text
    assert "(default: 128)" in helps["--max_output_length"] and "(default: mslite)" in helps["--backend"]
    assert "text_generation_result.txt" in helps["--save_result"] and "(default: False)" in helps["--save_result"]


def test_blank_prompt_file(export_dir, tokenizer_model, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("   \n\n\t \n", encoding="utf-8")
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", str(prompts))
    assert_one_line_error(result, "--predict_data", str(prompts), "no prompt")


def test_prompt_file_that_is_not_utf8(export_dir, tokenizer_model, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("one two\n".encode() + b"caf\xe9 \xff\xfe\n")
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", str(prompts))
    assert_one_line_error(result, str(prompts), "not UTF-8", "0xe9", "offset 11")


def test_empty_prompt_is_an_error_not_interactive_mode(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "")
    assert_one_line_error(result, "--predict_data is empty")


def test_no_prompt_and_no_terminal_is_refused_not_a_hang(export_dir, tokenizer_model):
    argv = ["run_infer_main.py", "--backend", "ms", "--model_dir", export_dir, "--tokenizer_path", tokenizer_model]
    with open(os.devnull) as devnull:
        result = subprocess.run([sys.executable] + argv, cwd=REPO, stdin=devnull, capture_output=True, text=True,
                                timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert_one_line_error(result, "--predict_data", "--interactive")


def test_over_long_prompt_is_refused_then_truncated_on_request(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", LONG_PROMPT)
    assert_one_line_error(result, "tokens but the graph's seq_length is 48", "at most 47 prompt tokens",
                          "truncate")
    # Kept: its last 47 tokens, so generation runs up to the very end of the cache.
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", LONG_PROMPT, "--truncate", "True",
                       "--max_new_tokens", "8")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "dropped its first" in result.stderr
    assert result.stdout.startswith(LONG_PROMPT)


def test_over_long_prompt_is_refused_before_any_output_naming_each_surfaces_spelling(export_dir, tokenizer_model):
    """run_infer_main names its option (`--truncate True`), pipeline() its keyword (`truncate=True`); the command
    refuses before printing anything of the prompt (streamed and chat answers used to echo it first)."""
    from lite_runtime import pipeline
    from lite_runtime.contract.errors import ValidationError
    for how in ([], ["--stream", "True"], ["--chat", "True"]):
        result = infer_cli(export_dir, tokenizer_model, "--predict_data", LONG_PROMPT, *how)
        line = assert_one_line_error(result, "seq_length is 48", "--truncate True")
        assert "truncate=True" not in line and result.stdout == "", (how, result.stdout)
    generator = pipeline(model=export_dir, backend="ms", tokenizer_path=tokenizer_model)
    try:
        with pytest.raises(ValidationError, match="seq_length is 48") as refused:
            generator(LONG_PROMPT, max_new_tokens=2)
        assert "pass truncate=True" in str(refused.value) and "--truncate" not in str(refused.value)
    finally:
        generator.close()


def warnings_of(result, *facts):
    """stderr lines holding every fact (the run summary line is there too)."""
    return [line for line in result.stderr.splitlines() if all(str(f) in line for f in facts)]


def test_max_length_above_seq_length_is_said_not_clamped_silently(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world", "--max_length", "1000")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert len(warnings_of(result, "--max_length 1000", "seq_length 48")) == 1, result.stderr
    assert result.stdout.startswith("hello world")


def test_max_length_at_or_below_the_prompt_is_an_error_not_an_empty_answer(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world one two", "--max_length", "3")
    line = assert_one_line_error(result, "max_length is 3", "nothing is left to generate")
    count = int(re.search(r"prompt 0 has (\d+) tokens", line).group(1))
    assert count >= 3 and f"max_length above {count}" in line
    assert result.stdout == ""


def test_batch_size_other_than_the_exports_is_said(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world", "--batch_size", "8")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert len(warnings_of(result, "--batch_size 8", "the export's batch size 3 is used", "batches of 3")) == 1
    quiet = infer_cli(export_dir, tokenizer_model, "--predict_data", "hello world", "--batch_size", "3")
    assert quiet.returncode == 0 and not warnings_of(quiet, "--batch_size"), quiet.stderr


def test_save_result_writes_one_line_per_prompt_in_the_working_directory(export_dir, tokenizer_model, tmp_path):
    import ast
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe quick brown fox\n", encoding="utf-8")
    workdir = tmp_path / "work"
    workdir.mkdir()
    argv = [os.path.join(REPO, "run_infer_main.py"), "--backend", "ms", "--model_dir", export_dir, "--tokenizer_path",
            tokenizer_model, "--max_new_tokens", "3", "--predict_data", str(prompts)]
    result = run_cli(argv + ["--save_result", "True"], cwd=str(workdir), timeout=180)
    assert result.returncode == 0, result.stderr
    lines = (workdir / "text_generation_result.txt").read_text(encoding="utf-8").splitlines()
    assert [ast.literal_eval(line) for line in lines] == [{"text_generation_text": [text]}
                                                          for text in result.stdout.splitlines()]
    assert lines[0].startswith("{'text_generation_text': ['hello world")
    os.remove(workdir / "text_generation_result.txt")
    assert run_cli(argv, cwd=str(workdir), timeout=180).returncode == 0
    assert os.listdir(workdir) == []            # not without --save_result (default False)


def test_defaults_and_model_name_common_run(export_dir, tokenizer_model):
    """No --config_path (None) and --model_name common: the export's own settings are used."""
    result = infer_cli(export_dir, tokenizer_model, "--model_name", "common", "--predict_data", "hello world")
    assert result.returncode == 0, result.stderr
    assert [ln.split(":")[0] for ln in result.stderr.strip().splitlines()] == ["ms"]   # the run summary only
    assert result.stdout.startswith("hello world")


# --- the library --------------------------------------------------------------------------------------
@pytest.mark.fast
def test_infer_config_unknown_keyword():
    from lite_runtime import InferConfig
    from lite_runtime.contract.errors import ConfigError
    with pytest.raises(ConfigError) as info:
        InferConfig(foo=1, model_dir="x")
    message = str(info.value)
    assert "unknown keyword 'foo'" in message
    assert "allowed:" in message and "model_dir" in message and "tokenizer_path" in message


def test_dynamic_true_needs_a_packed_export(export_dir, tokenizer_model):
    result = infer_cli(export_dir, tokenizer_model, "--dynamic", "True", "--predict_data", "hello")
    assert_one_line_error(result, "dynamic=True needs an export with kv_cache packed", "kv_cache 'io'")


@pytest.mark.fast
@pytest.mark.parametrize("model", ["no/such/dir", "no/such/llama2_7b", "missing.mindir"])
def test_pipeline_reports_a_missing_path_not_an_unknown_model(model):
    from lite_runtime import pipeline
    from lite_runtime.contract.errors import ArtifactError
    with pytest.raises(ArtifactError) as info:
        pipeline(model=model, backend="ms")
    message = str(info.value)
    assert model in message and "does not exist" in message
    assert "famil" not in message


def test_pipeline_refuses_an_empty_prompt(export_dir, tokenizer_model):
    from lite_runtime import pipeline
    from lite_runtime.contract.errors import ValidationError
    generator = pipeline(model=export_dir, backend="ms", tokenizer_path=tokenizer_model)
    try:
        for prompt in (" ", "", ["hello", "\n"]):
            with pytest.raises(ValidationError, match="empty"):
                generator(prompt, max_new_tokens=2)
        assert generator("hello", max_new_tokens=2)[0]["text_generation_text"][0].startswith("hello")
    finally:
        generator.close()


def test_pipeline_from_an_export_yaml_and_from_a_model_name_with_config(export_dir, tokenizer_model, tmp_path):
    """Upstream forms: pipeline(model="x.yaml") and pipeline(model="llama2_7b", config="x.yaml"); the yaml's
    infer: graph copies, else the export in its output_dir, are what runs."""
    from lite_runtime import pipeline
    yaml_path = tmp_path / "run_llama.yaml"
    yaml_path.write_text(f"output_dir: {export_dir}\nmodel:\n  family: llama\n")
    by_folder = pipeline(model=export_dir, backend="ms", tokenizer_path=tokenizer_model)("one two", max_new_tokens=3)
    by_yaml = pipeline(model=str(yaml_path), backend="ms", tokenizer_path=tokenizer_model)("one two", max_new_tokens=3)
    by_name = pipeline(model="llama2_7b", config=str(yaml_path), backend="ms",
                       tokenizer_path=tokenizer_model)("one two", max_new_tokens=3)
    assert by_yaml == by_folder == by_name


@pytest.mark.fast
@pytest.mark.parametrize("yaml_text, facts", [
    ("infer:\n  prefill_model_path: {d}/p.mindir\n  increment_model_path: {d}/i.mindir\n",
     ["infer.prefill_model_path", "p.mindir", "does not exist", "export first"]),
    ("infer:\n  prefill_model_path: {d}/p.mindir\n", ["infer.increment_model_path is missing"]),
    ("output_dir: {d}/empty\n", ["names no graphs", "holds no export", "export first"]),
])
def test_pipeline_yaml_says_exactly_what_is_missing(tmp_path, yaml_text, facts):
    from lite_runtime import pipeline
    from lite_runtime.contract.errors import ToolchainError
    yaml_path = tmp_path / "run.yaml"
    yaml_path.write_text(yaml_text.format(d=tmp_path))
    with pytest.raises(ToolchainError) as info:
        pipeline(model=str(yaml_path), backend="ms")
    for fact in facts:
        assert fact in str(info.value), (fact, str(info.value))


def test_a_json_schema_the_export_cannot_follow_is_one_line(export_dir, tokenizer_model, demo_exports, tmp_path):
    """--json_schema: a file that is not a schema; a two-graph export (no engine); a sentencepiece tokenizer."""
    schema = tmp_path / "schema.json"
    schema.write_text("[1, 2]")
    assert_one_line_error(infer_cli(export_dir, tokenizer_model, "--predict_data", "hi", "--json_schema", str(schema)),
                          "--json_schema", "not a JSON schema")
    schema.write_text('{"type": "object"}')
    assert_one_line_error(infer_cli(export_dir, tokenizer_model, "--predict_data", "hi", "--json_schema", str(schema)),
                          "json_schema", "kv_cache packed", "'io'")
    assert_one_line_error(infer_cli(demo_exports["ms"], None, "--predict_data", "hi", "--json_schema", str(schema)),
                          "json_schema", "tokenizer.json", "tokenizer.model")
