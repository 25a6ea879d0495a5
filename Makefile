# The two commands a new user runs: `make demo` and `make test`.
# Both create the virtual environment and install the package on first use.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ibe-pubsub demo

test: lint
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/ibe-pubsub bench crypto --json bench/crypto.json
