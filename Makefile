# The two commands a new user runs: `make demo` and `make test`.
# Both create the virtual environment and install the package on first use.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench

# pip shows what it collects and installs; the last line says how long it all took.
$(STAMP): pyproject.toml
	@echo "Installing ibe-pubsub and its development extras into $(VENV)" \
		"(first run only; a few minutes)"
	@start=$$(date +%s) && \
	$(PYTHON) -m venv $(VENV) && \
	$(VENV)/bin/pip install --quiet --upgrade pip && \
	$(VENV)/bin/pip install -e '.[dev]' && \
	echo "Installed in $$(( $$(date +%s) - start )) s: $(VENV)/bin/ibe-pubsub" \
		"(to call it as ibe-pubsub: source $(VENV)/bin/activate)"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ibe-pubsub demo

# Three processes run the test files side by side (most of their time is spent waiting
# for the processes they start, so three keep two cores busier than two do); the
# timing-sensitive tests (marked serial: they bound delays and deadlines) run after them,
# alone on the machine. Each lists its 15 slowest tests (the suite must stay under 15 minutes).
test: lint
	$(VENV)/bin/python -m pytest -q -n 3 --dist loadfile -m "not serial" --durations=15
	$(VENV)/bin/python -m pytest -q -m serial --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/ibe-pubsub bench crypto --json bench/crypto.json
