# `make demo` and `make test` each set up .venv themselves on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# the stamp is keyed on the dependency files: editing either re-installs
STAMP  := $(VENV)/.stamp-$(shell cat pyproject.toml requirements-dev.txt requirements-demo.txt | sha256sum | cut -c1-16)
# `make demo` needs only the run-time dependencies (torch, torchdata, Pillow, fsspec…)
DEMO_STAMP := $(VENV)/.demo-$(shell cat pyproject.toml requirements-demo.txt | sha256sum | cut -c1-16)

.PHONY: venv demo test test-fast lint check bench bench-quick fuzz fuzz-state mutate clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt requirements-demo.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	rm -f $(VENV)/.stamp-*
	touch $@

$(DEMO_STAMP): pyproject.toml requirements-demo.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-demo.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	rm -f $(VENV)/.demo-*
	touch $@

# Azurite (Azure blob emulator) for the Azure tests, from npm into .npm/
AZURITE := .npm/node_modules/.bin/azurite-blob
$(AZURITE):
	command -v npm >/dev/null || { echo "npm not found: the Azure tests need Node.js 20 and npm"; exit 1; }; \
	npm install --prefix .npm --no-audit --no-fund --silent azurite@3.37.0

demo: $(DEMO_STAMP)  ## only the run-time dependencies: about 6 packages and torch
	$(BIN)/shardpipes demo

test: venv $(AZURITE)
	$(BIN)/python -m pytest

test-fast: venv $(AZURITE)  ## skips the slow multi-process tests
	$(BIN)/python -m pytest -m "not slow"

bench: venv  ## shardpipes against its peers: benchmarks/results/latest.{md,json,png}
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

bench-quick: venv  ## the same on tiny data, one repeat (what the smoke test runs)
	$(BIN)/python benchmarks/run.py --quick $(BENCH_ARGS)

FUZZ_SECONDS ?= 120
fuzz: venv  ## mutation-fuzz the tar reader with atheris for FUZZ_SECONDS (crashes: ./crash-*)
	$(BIN)/python fuzz/fuzz_tar.py -max_total_time=$(FUZZ_SECONDS) -timeout=1 -rss_limit_mb=4096 $(FUZZ_ARGS)

FUZZ_EXAMPLES ?= 2000
fuzz-state: venv  ## model-based resume tests (tests/test_state_model.py), FUZZ_EXAMPLES random draws
	SHARDPIPES_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q \
		tests/test_state_model.py -k "topolog or plain" $(FUZZ_ARGS)

# Mutation testing (mutmut 3.8.1, installed here: not in requirements-dev.txt nor in CI).
# Mutates MUTATE_PATHS; each module's tests come from the map in tools/mutate.py unless
# MUTATE_TESTS is given, e.g. MUTATE_PATHS=shardpipes/pipes/shards.py
# MUTATE_TESTS=tests/pipes/test_shards.py. Report: mutants/report.md.
MUTATE_PATHS ?= shardpipes/_core
MUTATE_TESTS ?=
mutate: venv  ## mutation score per module, surviving mutants with diffs in mutants/report.md
	$(BIN)/python -m pip install --quiet --disable-pip-version-check mutmut==3.8.1
	nice -n 19 $(BIN)/python tools/mutate.py --paths $(MUTATE_PATHS) \
		$(if $(strip $(MUTATE_TESTS)),--tests $(MUTATE_TESTS)) $(MUTATE_ARGS)

lint: venv
	$(BIN)/ruff format --check shardpipes tests benchmarks fuzz
	$(BIN)/ruff check shardpipes tests benchmarks fuzz
	$(BIN)/mypy

check: lint test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache benchmarks/.venv-td09 .npm
