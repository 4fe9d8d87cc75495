"""Shared by the run-time error tests: a tiny sentencepiece model for the tiny export (a fixture), a
private copy of its io export (a fixture), a manifest edit, and the one-line error check."""
import io
import json
import os
import shutil

import pytest

WORDS = ("the quick brown fox jumps over lazy dog hello world this is a tiny tokenizer one two three four "
         "five six seven eight nine ten red green blue yellow cat bird fish tree house river").split()


@pytest.fixture(scope="module")
def tokenizer_model(tmp_path_factory):
    import sentencepiece as spm
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, vocab_size=96,
                                   model_type="bpe", pad_id=0, bos_id=1, eos_id=2, unk_id=3, minloglevel=2)
    path = str(tmp_path_factory.mktemp("tokenizer") / "tokenizer.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    return path


@pytest.fixture
def export_dir(tiny_exports, tmp_path):
    """A private copy of the tiny io export, free to damage."""
    folder = str(tmp_path / "export")
    shutil.copytree(tiny_exports["io"], folder)
    return folder


def edit_manifest(folder, change):
    path = os.path.join(folder, "manifest.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    change(data)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


def assert_one_line_error(result, *facts):
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith("error:"), lines[0]
    for fact in facts:
        assert str(fact) in lines[0], f"{fact!r} missing from: {lines[0]}"
    return lines[0]
