"""What the runtime's users pass: `--predict_data` values, `pipeline(...)` keywords, prompts and
streamers, `--num_threads`, and hand-edited manifests. Each mistake is one project error naming the
value and what is allowed.
"""
import os

import pytest

from lite_runtime.cli.run_infer import read_prompts
from lite_runtime.contract.errors import ConfigError
from test_runtime_errors import assert_one_line_error
from tiny_models import run_cli

TXT_ALLOWED = "allowed: a prompt text, or a .txt file (UTF-8) with one prompt per line"


# --- --predict_data -----------------------------------------------------------------------------------
def test_predict_data_file_that_is_not_txt_is_refused_not_used_as_the_prompt(tmp_path):
    prompts = tmp_path / "prompts.csv"
    prompts.write_text("prompt\nhello world\n", encoding="utf-8")
    result = run_cli(["run_infer_main.py", "--backend", "ms", "--model_dir", str(tmp_path / "no_export"),
                      "--predict_data", str(prompts)])
    assert_one_line_error(result, f"--predict_data {prompts} is a file, not a .txt file", TXT_ALLOWED)
    assert result.stdout == ""


@pytest.mark.parametrize("name", ["prompts.csv", "data/prompts.jsonl", "questions.JSON"])
def test_predict_data_naming_a_missing_data_file_is_refused(tmp_path, name):
    with pytest.raises(ConfigError) as info:
        read_prompts(str(tmp_path / name), None)
    assert str(info.value) == (f"--predict_data file {tmp_path / name} does not exist (and is not a .txt file); "
                               + TXT_ALLOWED)


def test_predict_data_naming_a_folder_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a folder, not a .txt file"):
        read_prompts(str(tmp_path), None)


@pytest.mark.parametrize("prompt", ["What is in data.csv?", "Summarise report.json", "hello", "e.g. this"])
def test_predict_data_prompt_texts_stay_prompts(prompt):
    assert read_prompts(prompt, None) == [prompt]
