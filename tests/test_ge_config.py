"""GE config.ini reading, validation, gears and generation (lite_runtime/ascend/ge_config*.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lite_runtime.contract.errors import ConfigError
from lite_runtime.contract.families import FAMILIES, GraphDims
from lite_runtime.ascend.ge_config import PRECISION_MODES, ge_only_sections, parse_ge_config, read_ge_config
from lite_runtime.ascend.ge_config_writer import generate_ini, list_presets, with_rank_table, write_export_configs
from lite_runtime.contract.manifest import GraphEntry, Manifest, graph_relpath, load_manifest

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

REPO = Path(__file__).resolve().parent.parent
PRESETS = sorted((REPO / "ge_configs").glob("*.ini"))
ATLAS_800 = (REPO / "ge_configs" / "atlas_800.ini").read_text()


def rank_table_file(tmp_path: Path, n: int = 2, name: str = "hccl.json") -> str:
    devices = [{"device_id": str(i), "device_ip": f"192.168.0.{100 + i}", "rank_id": str(i)} for i in range(n)]
    data = {"version": "1.0", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": "10.0.0.1", "host_nic_ip": "reserve", "device": devices}]}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def make_export(tmp_path: Path, world_size: int = 1, batch: int = 2, seq: int = 16) -> str:
    family = FAMILIES["llama"]
    dims = GraphDims(batch, seq, 2, 2 // world_size, 8, 64)
    graphs = {kind: GraphEntry([graph_relpath(kind, r) for r in range(world_size)],
                               family.inputs(kind, "io", dims), family.outputs(kind, "io", dims))
              for kind in ("prefill", "increment")}
    folder = tmp_path / "export"
    folder.mkdir()
    Manifest(family="llama", model_config={}, graph_dims=dims.to_json(), kv_cache="io", seq_length=seq, batch_size=batch,
             world_size=world_size, compute_dtype="float32", graphs=graphs, bos_token_id=1, eos_token_id=[2],
             pad_token_id=0, tokenizer=None, mindspore_version="2.0.0", mindir_version="2.0").save(str(folder))
    return str(folder)


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_every_preset_parses_and_validates(preset):
    config = read_ge_config(str(preset))
    if preset.name == "cpu.ini":
        assert config.sections == {} and ge_only_sections(config) == []
        return
    assert config.provider == "ge"
    assert config.get("ascend_context", "plugin_custom_ops") == "All"
    assert config.get("ge_session_options", "ge.exec.precision_mode") == "must_keep_origin_dtype"
    assert config.get("ge_session_options", "ge.externalWeight") == "1"       # keys keep their case
    assert ("ge.exec.formatMode" in config.sections["ge_session_options"]) == (preset.name == "atlas_800t_a2.ini")
    assert ("rank_table_file" in config.sections["ascend_context"]) == ("distributed" in preset.name)
    assert config.is_dynamic == ("dynamic" in preset.name)


def test_presets_are_listed():
    assert {"atlas_800", "atlas_800t_a2", "atlas_800_distributed", "atlas_800_dynamic", "cpu"} <= set(list_presets())


def test_ge_only_sections(tmp_path):
    path = tmp_path / "a.ini"
    path.write_text(ATLAS_800)
    assert ge_only_sections(str(path)) == ["ascend_context", "ge_session_options"]


BAD_INIS = {
    "malformed line": ("[ascend_context]\nprovider=ge\njust some words\n", 3, "malformed line 'just some words'"),
    "semicolon comment": ("[ascend_context]\n; old style\nprovider=ge\n", 2, "malformed line"),
    "key before section": ("provider=ge\n[ascend_context]\n", 1, "comes before any [section]"),
    "unknown section": ("[ascend_context]\nprovider=ge\n\n[ge_options]\nx=1\n", 4,
                        "unknown section [ge_options]; allowed sections: [ascend_context], [ge_session_options]"),
    "duplicate key": ("[ascend_context]\nprovider=ge\nprovider=ge\n", 3, "'provider' appears twice"),
    "duplicate section": ("[ascend_context]\nprovider=ge\n[ascend_context]\n", 3,
                          "section [ascend_context] appears twice"),
    "bad provider": ("# c\n[ascend_context]\nprovider=acl\n", 3, "provider='acl': not allowed; allowed: ge"),
    "bad precision mode": ("[ge_session_options]\nge.externalWeight=1\nge.exec.precision_mode=fp16_please\n", 3,
                           "allowed: " + ", ".join(PRECISION_MODES)),
    "both precision modes": ("[ge_session_options]\nge.exec.precision_mode=force_fp16\n"
                             "ge.exec.precision_mode_v2=fp16\n", 3, "cannot both be set"),
    "bad on/off": ("[ge_session_options]\nge.exec.formatMode=yes\n", 2, "allowed: 0, 1"),
    "continuation line": ("[ascend_context]\nprovider=ge\n  more\n", 2, "continues on an indented line"),
    "inputShape in session": ("[ge_session_options]\nge.inputShape=x:1\n", 2, "belongs in [ge_graph_options]"),
    "gear arity": ("[ge_graph_options]\nge.inputShape=input_ids:-1,-1;batch_valid_length:-1\n"
                   "ge.dynamicDims=1,128,1;1,256\n", 3, "gear 2 '1,256' has 2 value(s) but ge.inputShape has 3 -1"),
    "gears without -1": ("[ge_graph_options]\nge.inputShape=input_ids:1,128\nge.dynamicDims=1,128\n", 3,
                         "ge.inputShape has no -1 dims"),
    "-1 without gears": ("[ge_graph_options]\nge.inputShape=input_ids:1,-1\n", 2, "no ge.dynamicDims"),
    "bad shape": ("[ge_graph_options]\nge.inputShape=input_ids:1,x\n", 2, "dims must be integers"),
    "repeated gear": ("[ge_graph_options]\nge.inputShape=input_ids:1,-1\nge.dynamicDims=128;128\n", 3,
                      "gear 2 '128' repeats gear 1"),
    "bad custom ops": ("[ascend_context]\nplugin_custom_ops=all\n", 2, "allowed: All, None"),
}


@pytest.mark.parametrize("case", sorted(BAD_INIS))
def test_bad_inis_rejected_with_file_line_and_value(tmp_path, case):
    text, line, expected = BAD_INIS[case]
    path = tmp_path / "bad.ini"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_ge_config(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: line {line}:"), message
    assert expected in message


def test_rank_table_file_checked(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=r"line 3: \[ascend_context\] rank_table_file=.*nope.json.*does not exist"):
        parse_ge_config(f"[ascend_context]\nprovider=ge\nrank_table_file={missing}\n", "x.ini")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "server_count": "1", "server_list": [], "status": "completed"}')
    with pytest.raises(ConfigError, match="x.ini: line 2: .* not a valid rank table: .*non-empty list"):
        parse_ge_config(f"[ascend_context]\nrank_table_file={bad}\n", "x.ini")
    good = rank_table_file(tmp_path, 4)
    config = parse_ge_config(f"[ascend_context]\nrank_table_file={good}\n", "x.ini")
    assert len(config.rank_table.ranks) == 4
    config.check_runnable(4)
    with pytest.raises(ConfigError, match="has 4 rank.* world_size 2"):
        config.check_runnable(2)


def test_rank_table_read_late_when_files_were_not_checked(tmp_path):
    good = rank_table_file(tmp_path, 2)
    config = parse_ge_config(f"[ascend_context]\nrank_table_file={good}\n", "x.ini", check_files=False)
    assert config.rank_table is None and "(not read)" in config.summary()
    config.check_runnable(2)
    assert len(config.rank_table.ranks) == 2


def test_unknown_ascend_context_key_is_logged(caplog):
    with caplog.at_level("WARNING", logger="lite_runtime.ascend.ge_config"):
        parse_ge_config("[ascend_context]\nprovider=ge\nrank_tabel_file=x.json\n", "typo.ini")
    assert "typo.ini: line 3" in caplog.text and "'rank_tabel_file'" in caplog.text


@pytest.mark.parametrize("section, key, close", [
    ("ge_session_options", "ge.exec.formatMod", "'ge.exec.formatMode'?"),
    ("ge_graph_options", "ge.inputshape", "'ge.inputShape'?"),
    ("ge_graph_options", "ge.exec.precision_mod", "'ge.exec.precision_mode' in [ge_session_options]?"),
    ("ascend_context", "rank_tabel_file", "'rank_table_file'?"),
])
def test_misspelt_key_is_logged_with_the_known_key_it_is_close_to(caplog, section, key, close):
    with caplog.at_level("WARNING", logger="lite_runtime.ascend.ge_config"):
        parse_ge_config(f"[{section}]\n{key}=1\n", "typo.ini")
    assert len(caplog.records) == 1
    assert "typo.ini: line 2" in caplog.text and f"{key!r}" in caplog.text and f"did you mean {close}" in caplog.text


def test_ge_keys_far_from_known_ones_stay_quiet(caplog):
    """GE has many options this project does not list: only near misses of known keys are reported."""
    with caplog.at_level("WARNING", logger="lite_runtime.ascend.ge_config"):
        parse_ge_config("[ge_session_options]\nge.exec.enableDump=1\nge.exec.formatMode=1\n", "ok.ini")
    assert caplog.text == ""


def test_placeholder_rank_table_refused_at_load_time():
    config = read_ge_config(str(REPO / "ge_configs" / "atlas_800_distributed.ini"))
    with pytest.raises(ConfigError, match="rank_table_file is empty"):
        config.check_runnable(2)
    with pytest.raises(ConfigError, match="world_size|2 ranks"):
        read_ge_config(str(REPO / "ge_configs" / "atlas_800.ini")).check_runnable(2)
    read_ge_config(str(REPO / "ge_configs" / "atlas_800.ini")).check_runnable(1)


def test_gear_selection():
    config = read_ge_config(str(REPO / "ge_configs" / "atlas_800_dynamic.ini"))
    gear = config.pick_gear(1, 200)
    assert gear.shapes == {"input_ids": (1, 256), "batch_valid_length": (1,)}
    assert config.pick_gear(1, 128).shapes["input_ids"] == (1, 128)
    assert config.pick_gear(2, 100).shapes == {"input_ids": (4, 128), "batch_valid_length": (4,)}
    assert config.pick_gear(3, 600).shapes["input_ids"] == (4, 2048)
    with pytest.raises(ConfigError, match=r"no gear holds batch 1 x length 4096 .* 1x128, 1x256"):
        config.pick_gear(1, 4096)
    with pytest.raises(ConfigError, match="no gear holds batch 8"):
        config.pick_gear(8, 1)
    with pytest.raises(ConfigError, match="'tokens' is not a 2-D"):
        config.pick_gear(1, 1, token_input="tokens")


def test_gear_picks_smallest_not_first():
    config = parse_ge_config("[ge_graph_options]\nge.inputShape=tokens:-1,-1\n"
                             "ge.dynamicDims=8,2048;1,1024;1,512;2,512\n", "g.ini")
    assert config.pick_gear(1, 300).shapes["tokens"] == (1, 512)
    assert config.pick_gear(2, 10).shapes["tokens"] == (2, 512)
    assert config.pick_gear(1, 600).index == 1


def test_static_config_has_one_gear():
    config = parse_ge_config("[ge_graph_options]\nge.inputShape=input_ids:2,16;batch_valid_length:2\n", "s.ini")
    assert config.pick_gear(2, 10).shapes["input_ids"] == (2, 16)
    with pytest.raises(ConfigError, match="no gear"):
        config.pick_gear(2, 17)


@pytest.mark.parametrize("kind", ["prefill", "increment"])
def test_generated_ini_round_trips_and_matches_the_export(tmp_path, kind):
    manifest = load_manifest(make_export(tmp_path))
    text = generate_ini(manifest, "atlas_800t_a2", kind=kind)
    path = tmp_path / f"{kind}.ini"
    path.write_text(text)
    config = read_ge_config(str(path))
    expected = {t.name: tuple(t.shape) for t in manifest.graphs[kind].inputs}
    assert config.input_shape == expected
    assert list(config.input_shape) == [t.name for t in manifest.graphs[kind].inputs]
    assert config.input_shape["input_ids"] == ((2, 16) if kind == "prefill" else (2, 1))
    if kind == "increment":
        assert config.input_shape["key_cache_1"] == (2, 2, 16, 8)
    assert config.get("ge_session_options", "ge.exec.formatMode") == "1"
    assert not config.is_dynamic and config.rank_table_file is None
    config.check_runnable(1)


def test_generate_with_rank_table_and_mismatch(tmp_path):
    manifest = load_manifest(make_export(tmp_path, world_size=2))
    table = rank_table_file(tmp_path, 2)
    config = parse_ge_config(generate_ini(manifest, "atlas_800_distributed", rank_table=table), "gen.ini")
    assert config.rank_table_file == str(Path(table).resolve())
    config.check_runnable(2)
    placeholder = parse_ge_config(generate_ini(manifest, "atlas_800"), "gen.ini")
    assert placeholder.rank_table_file == ""
    with pytest.raises(ConfigError, match="has 4 rank.* world_size 2"):
        generate_ini(manifest, "atlas_800", rank_table=rank_table_file(tmp_path, 4, "four.json"))


def test_generate_refuses_bad_presets(tmp_path):
    manifest = load_manifest(make_export(tmp_path))
    with pytest.raises(ConfigError, match="allowed presets: .*atlas_800t_a2"):
        generate_ini(manifest, "atlas_900")
    with pytest.raises(ConfigError, match="dynamic-shape gears"):
        generate_ini(manifest, "atlas_800_dynamic")
    with pytest.raises(ConfigError, match="no \\[ascend_context\\] provider=ge"):
        generate_ini(manifest, "cpu")


def test_with_rank_table_keeps_comments(tmp_path):
    table = rank_table_file(tmp_path, 2)
    dst = tmp_path / "rank_0.ini"
    with_rank_table(str(REPO / "ge_configs" / "atlas_800_distributed.ini"), table, str(dst))
    text = dst.read_text()
    assert text.count("rank_table_file=") == 1 and "# HCCL rank table" in text
    config = read_ge_config(str(dst))
    assert config.rank_table_file == str(Path(table).resolve()) and len(config.rank_table.ranks) == 2
    src = tmp_path / "plain.ini"
    src.write_text("# top\n[ge_session_options]\nge.externalWeight=1\n")
    with_rank_table(str(src), table, str(dst))
    assert read_ge_config(str(dst)).rank_table_file == str(Path(table).resolve())
    with pytest.raises(ConfigError, match="does not exist"):
        with_rank_table(str(src), str(tmp_path / "none.json"), str(dst))


def run_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "lite_runtime.cli.ge_config"] + list(args),
                          capture_output=True, text=True, cwd=cwd)


def test_cli_generate_then_check_pair(tmp_path):
    export = make_export(tmp_path)
    out = tmp_path / "ge"
    run = run_cli("generate", "--model_dir", export, "--preset", "atlas_800", "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"--config_path {out / 'prefill.ini'},{out / 'increment.ini'}"
    run = run_cli("check", f"{out / 'prefill.ini'},{out / 'increment.ini'}")
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.strip().splitlines()) == 2 and "static" in run.stdout


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.ini"
    bad.write_text("[ascend_context]\nprovider=acl\n")
    for args in (("check", str(REPO / "ge_configs" / "cpu.ini"), str(bad)),
                 ("check", str(tmp_path / "missing.ini")),
                 ("generate", "--model_dir", str(tmp_path), "--preset", "atlas_800", "-o", str(tmp_path)),
                 ("frobnicate",)):
        run = run_cli(*args)
        assert run.returncode != 0, args
        assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert "line 2" in run_cli("check", str(bad)).stderr


def test_cli_check_names_the_known_key_a_misspelt_one_is_close_to(tmp_path):
    ini = tmp_path / "typo.ini"
    ini.write_text("[ascend_context]\nprovider=ge\n\n[ge_session_options]\nge.exec.formatMod=1\n")
    run = run_cli("check", str(ini))
    assert run.returncode == 0, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "line 5" in lines[0] and "'ge.exec.formatMod'" in lines[0], run.stderr
    assert "did you mean 'ge.exec.formatMode'?" in lines[0]
    assert run.stdout.startswith(f"{ini}: provider ge")


def test_write_export_configs_writes_both(tmp_path):
    prefill, increment = write_export_configs(make_export(tmp_path), "atlas_800", str(tmp_path / "o"))
    assert read_ge_config(prefill).input_shape["input_ids"] == (2, 16)
    assert read_ge_config(increment).input_shape["input_ids"] == (2, 1)
