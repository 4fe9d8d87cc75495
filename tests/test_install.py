"""The runtime installed where it is deployed, without this repository: a wheel of the project in a
fresh venv outside the checkout (no system site-packages, dependencies from the package index, no
MindSpore), `lite-setup` extracting Lite 2.0 and compiling the shim into the per-user location, and
`lite-infer` there continuing the demo prompts with the same text as run_infer_main.py in the checkout.
"""
import os
import shutil
import subprocess
import sys

import pytest

from support.tiny_models import REPO, run_cli

WHEEL = os.path.join(REPO, "build", "lite", "wheel", "mindspore_lite-2.0.0-cp37-cp37m-manylinux1_x86_64.whl")
PROMPTS = {"An increasing sequence: one,": " two, three, four, five",     # facts of the demo's corpus
           "The capital of France is": " Paris."}


def _run(args, cwd, env, timeout=600):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args[:3]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, environment): the project's wheel installed into a fresh venv in a temp folder."""
    assert os.path.isfile(WHEEL), f"{WHEEL} is missing: run `make setup` (tools/setup_lite.sh) first"
    root = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LITE_SHIM_LIB")}
    env.update(XDG_DATA_HOME=str(root / "data"), GLOG_v="3")
    src = root / "src"      # the package sources only: building in the checkout would write into build/
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    for package in ("exporter", "lite_runtime"):
        shutil.copytree(os.path.join(REPO, package), src / package, ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"), str(src)], root, env)
    [wheel] = os.listdir(root / "dist")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root, env)
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
          str(root / "dist" / wheel)], root, env)
    return venv, env, root


def test_wheel_in_a_fresh_venv_sets_up_lite_and_generates_as_the_checkout(installed, demo_exports):
    venv, env, root = installed
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    where = _run([str(venv / "bin" / "python"), "-c", "import lite_runtime; print(lite_runtime.__file__)"],
                 root, env).stdout.strip()
    assert where.startswith(str(venv)), where

    setup = _run([str(venv / "bin" / "lite-setup"), "--wheel", WHEEL], root, env)
    shim = root / "data" / "llm-lite-export" / "lite" / "lib" / "liblite_shim.so"
    assert f"built {shim}" in setup.stdout and "extracted 11 libraries" in setup.stdout, setup.stdout
    again = _run([str(venv / "bin" / "lite-setup"), "--wheel", WHEEL], root, env)
    assert "already extracted" in again.stdout and "shim up to date" in again.stdout, again.stdout

    for script, args, message in (
            ("lite-export", ["--config", os.path.join(REPO, "tools", "demo_model", "demo.yaml")],
             "error: lite-export needs MindSpore here (the exporter and backend ms do): pip install "
             "'llm-lite-export[mindspore]'; backend mslite runs without it"),
            ("lite-infer", ["--top_k", "x"],
             "error: Invalid value for '--top_k': 'x' is not a valid integer (see lite-infer --help)")):
        result = subprocess.run([str(venv / "bin" / script)] + args, cwd=root, env=env, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode != 0 and result.stderr == message + "\n", result.stderr

    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    args = ["--model_dir", demo_exports["mslite"], "--backend", "mslite", "--predict_data", str(prompts),
            "--max_new_tokens", "12"]
    deployed = _run([str(venv / "bin" / "lite-infer")] + args, root, env)
    assert "MindSpore Lite 2.0.0 CPU (native binding)" in deployed.stderr, deployed.stderr
    checkout = run_cli(["run_infer_main.py"] + args)
    assert checkout.returncode == 0, checkout.stderr[-2000:]
    assert deployed.stdout == checkout.stdout
    lines = deployed.stdout.splitlines()
    assert [line[:len(p + c)] for line, (p, c) in zip(lines, PROMPTS.items())] == [p + c for p, c in PROMPTS.items()]


@pytest.mark.fast
def test_the_native_binding_looks_in_the_environment_then_the_user_location_then_the_checkout(tmp_path,
                                                                                            monkeypatch):
    from lite_runtime.backends import lite_install
    from lite_runtime.backends.lite_native import shim_path
    monkeypatch.delenv("LITE_SHIM_LIB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    checkout = os.path.join(REPO, "build", "lite", "lib", "liblite_shim.so")
    assert [where for _, where in lite_install.shim_candidates()] == ["the per-user location",
                                                                     "the checkout's build/lite"]
    assert shim_path() == (checkout if os.path.isfile(checkout) else "")
    user = tmp_path / "data" / "llm-lite-export" / "lite" / "lib" / "liblite_shim.so"
    user.parent.mkdir(parents=True)
    user.write_bytes(b"")
    assert shim_path() == str(user)
    monkeypatch.setenv("LITE_SHIM_LIB", str(tmp_path / "elsewhere.so"))
    assert shim_path() == ""      # a variable naming a missing file is not silently passed over
    (tmp_path / "elsewhere.so").write_bytes(b"")
    assert shim_path() == str(tmp_path / "elsewhere.so")
