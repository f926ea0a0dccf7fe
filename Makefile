# GEM Pipeline. Two commands for a newcomer: `make demo` and `make test`; `make test-fast` while editing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export GEM_HOME ?= $(CURDIR)/lakehouse

.PHONY: demo test test-fast ui lint lock clean

# The environment: exact pins from requirements.lock, installed --no-deps (torchrec would otherwise
# pull the CUDA fbgemm-gpu and an old torchmetrics), then the project, then Delta's jars.
$(VENV)/.installed: pyproject.toml requirements.lock jobs/delta-jars.pom.xml jobs/install_delta_jars.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==26.3
	$(BIN)/pip install --quiet --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m jobs.install_delta_jars $(VENV)/jars
	touch $@

demo: $(VENV)/.installed
	$(BIN)/gem demo

# The whole suite, as CI runs it: tests/unit, tests/e2e (marked slow) and tests/system (marked system).
test: $(VENV)/.installed
	$(BIN)/python -m pytest -q --durations=20

# The unit tier for the edit-test loop, under 3 minutes on 2 cores: no end-to-end run, no system service.
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -q --durations=10 -m "not slow and not system"

ui: $(VENV)/.installed
	home=$${DAGSTER_HOME:-$(GEM_HOME)/dagster}; mkdir -p $$home; \
	test -f $$home/dagster.yaml || cp dagster_project/dagster.yaml $$home/; \
	DAGSTER_HOME=$$home $(BIN)/dagster dev -w workspace.yaml

# What CI checks besides the tests: ruff's rules, ruff's format and the import contracts of pyproject.toml
# (the layers). .pre-commit-config.yaml runs the same on every commit.
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Regenerate requirements.lock after changing a pin in pyproject.toml.
lock: $(VENV)/.installed
	$(BIN)/pip freeze --all --exclude-editable | grep -v "^pip==" > requirements.lock

clean:
	rm -rf $(VENV) lakehouse
