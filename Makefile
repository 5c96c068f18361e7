# Quick start (README.md):
#   make dev    set up .venv, render the dev stack offline and print its capacity plan (without the
#               pinned charts in the chart cache, it renders our objects and every release's values and
#               lists the releases it could not expand)
#   make test   set up everything the suite needs (venvs, promtool, vLLM CPU build, checkov, the Go
#               programs of the deploy tests via tools/build.sh) and run it, in lanes that overlap
#               the Go build, the Python set-up, the deploy tests and the rest (scripts/run-suite.sh)
#   make charts download and verify the pinned Helm charts into the chart cache (needs the network;
#               `vllm-platform charts pull --from-git DIR` builds them from git mirrors instead)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: dev test setup setup-test lint render-all charts clean

$(BIN)/vllm-platform: pyproject.toml model-cache/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test]' -e './model-cache[test]'
	touch $@

setup: $(BIN)/vllm-platform

dev: setup
	$(BIN)/vllm-platform render dev --out out/dev --allow-missing-charts
	$(BIN)/vllm-platform plan dev

render-all: setup
	for stack in dev staging prod; do $(BIN)/vllm-platform render $$stack --out out/$$stack || exit 1; done

charts: setup
	$(BIN)/vllm-platform charts pull

setup-test: setup
	bash scripts/setup-test-tools.sh
	@# A program that cannot be built is named by build.sh; the deploy tests that need it say so.
	bash tools/build.sh || echo "tools/build.sh: not every program was built (see above)"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache --no-logo

test:
	bash scripts/run-suite.sh

clean:
	rm -rf out
