# Quick start (README.md):
#   make dev    set up .venv, render the dev stack offline and print its capacity plan
#   make test   set up everything the suite needs (venvs, promtool, vLLM CPU build, checkov) and run it
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: dev test setup setup-test lint render-all clean

$(BIN)/vllm-platform: pyproject.toml model-cache/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]' -e './model-cache[test]'
	touch $@

setup: $(BIN)/vllm-platform

dev: setup
	$(BIN)/vllm-platform render dev --out out/dev
	$(BIN)/vllm-platform plan dev

render-all: setup
	for stack in dev staging prod; do $(BIN)/vllm-platform render $$stack --out out/$$stack || exit 1; done

setup-test: setup
	bash scripts/setup-test-tools.sh

lint: setup
	$(BIN)/ruff check .

test: setup-test lint
	$(BIN)/python -m pytest tests model-cache/tests

clean:
	rm -rf out
