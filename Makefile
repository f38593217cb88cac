# memsweep: `make run` and `make test` work on a fresh clone (they create .venv when missing).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of PyTorch 2.13.0 is pinned here: an unpinned torch pulls a multi-GB CUDA build.
TORCH  := torch==2.13.0

.PHONY: install run test lint format bench gpu-check clean

$(STAMP): pyproject.toml Makefile
	@echo "memsweep: creating $(VENV) and installing torch (CPU build) and memsweep; the first time takes a few minutes"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[test,hf,lint]" --config-settings editable_mode=compat
	touch $(STAMP)

install: $(STAMP)

# The default job: a batch sweep of the mlp workload at an emulated capacity, then the frontier;
# the sweep's end writes report.md / report.html into the sweep directory and prints the path.
run: $(STAMP)
	$(VENV)/bin/memsweep sweep sweep=batch capacity=256MiB

test: $(STAMP)
	$(PY) -m pytest -q

# One formatter and linter (ruff, configured in pyproject.toml) and the type checker (mypy) on the
# contract and the worker. `make format` rewrites the files; `make lint` only checks (CI runs it).
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Benchmarks print measured ratios side by side (not timed tests). BENCH=name limits to one.
bench: $(STAMP)
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[bench]" --config-settings editable_mode=compat >/dev/null 2>&1 \
		|| echo "memsweep bench: the optional peers (lightning, accelerate) could not be installed; their columns are skipped"
	$(PY) -m tests.bench.run_all $(BENCH)

# On a machine with a GPU: a small sweep on cuda:0 and checks of the counters.
gpu-check: $(STAMP)
	$(PY) tests/gpu_check.py

clean:
	rm -rf $(VENV) results multirun outputs
