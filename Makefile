# memsweep: `make run` and `make test` work on a fresh clone (they create .venv when missing).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# PyTorch 2.13.0 is pinned here. From PyPI on Linux x86-64 this is a CUDA build (GBs); for the CPU-only
# build set TORCH_INDEX=https://download.pytorch.org/whl/cpu. The build installed is printed either way.
TORCH  := torch==2.13.0
TORCH_INDEX ?=

.PHONY: install run test lint format docs bench gpu-check gpu-wheels slurm-up slurm-down clean
# Say which PyTorch build the venv holds (CPU-only is named as such; never a GPU claim).
SAY_BUILD := import torch; b = ("CUDA " + torch.version.cuda) if torch.version.cuda else ("ROCm " + torch.version.hip) if torch.version.hip else "CPU-only"; print(f"memsweep: PyTorch {torch.__version__}, a {b} build, in $(VENV)")

$(STAMP): pyproject.toml Makefile
	@echo "memsweep: creating $(VENV) and installing $(TORCH) ($(if $(TORCH_INDEX),from $(TORCH_INDEX),PyPI's build for this platform)) and memsweep; the first time takes a few minutes"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[test,hf,lora,lint,docs]"
	touch $(STAMP)

install: $(STAMP)
	@$(PY) -c '$(SAY_BUILD)'

# The default job: a batch sweep of the mlp workload at an emulated capacity, then the frontier;
# the sweep's end writes report.md / report.html into the sweep directory and prints the path.
run: $(STAMP)
	@$(PY) -c '$(SAY_BUILD)'
	$(VENV)/bin/memsweep sweep sweep=batch capacity=256MiB

# The suite runs its test files on TEST_WORKERS processes (pytest-xdist; a file's tests stay in one
# process, so its module fixtures are made once): most tests wait on worker processes and SLURM jobs.
TEST_WORKERS ?= 2
test: $(STAMP)
	@$(PY) -c '$(SAY_BUILD)'
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# One formatter and linter (ruff, configured in pyproject.toml) and the type checker (mypy) on the
# packages of pyproject's [tool.mypy]. `make format` rewrites the files; `make lint` only checks (CI runs it).
TYPECHECK := build/typecheck
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	mkdir -p $(TYPECHECK) && ln -sfn ../.. $(TYPECHECK)/memsweep
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The documentation site (sources in docs/, mkdocs.yml): built strictly (a broken link or reference
# fails), its reference tables generated from the code by docs/reference_hook.py, into build/site (ignored).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# Benchmarks print measured ratios side by side (not timed tests). BENCH=name limits to one.
bench: $(STAMP)
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[bench]" >/dev/null 2>&1 \
		|| echo "memsweep bench: the optional peers (lightning, accelerate) could not be installed; their columns are skipped"
	$(PY) -m tests.bench.run_all $(BENCH)

# On a GPU machine as it is (README "First GPU check"): the interpreter that holds its CUDA PyTorch
# (>= 2.4), no venv and no torch install; missing pure-Python dependencies are unpacked from
# .gpu-wheels/ (ignored; made here by `make gpu-wheels`, carried there) into .gpu-site/.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) tests/gpu_check.py

# Here, with a package index: the wheels memsweep needs beside what a CUDA image has (hydra-core,
# omegaconf, antlr4-python3-runtime; antlr4 4.9.3 is published as a source archive only, so its
# pure-Python wheel is built here), and those of the fine-tuning check (transformers with its
# dependencies, which do not include torch; peft and accelerate without theirs, torch and what
# transformers brings), for CPython 3.12 on x86-64 Linux, into .gpu-wheels/. What torch itself
# depends on is there wherever torch is, so it is not brought. The folder travels with the working
# tree, which may carry 64 MiB in all: its size is printed, and over 64 MiB the target fails.
GPU_WHEELS := .gpu-wheels
GPU_PIP := $(PYTHON) -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux2014_x86_64 -d $(GPU_WHEELS)
GPU_TORCH_DEPS := filelock fsspec jinja2 markupsafe mpmath networkx setuptools sympy typing_extensions
GPU_WHEELS_MAX := 67108864
gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(GPU_PIP) --no-deps "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4"
	$(PYTHON) -m pip wheel --quiet --no-deps -w $(GPU_WHEELS) "antlr4-python3-runtime==4.9.3"
	$(GPU_PIP) transformers psutil
	$(GPU_PIP) --no-deps peft accelerate
	cd $(GPU_WHEELS) && for d in $(GPU_TORCH_DEPS); do rm -f $$d-*.whl; done
	@ls $(GPU_WHEELS)
	@$(PYTHON) -c 'import pathlib, sys; n = sum(p.stat().st_size for p in pathlib.Path("$(GPU_WHEELS)").iterdir()); \
		print(f"memsweep: $(GPU_WHEELS) holds {n} B ({n / 2**20:.1f} MiB) of the {$(GPU_WHEELS_MAX) // 2**20} MiB a carried folder may hold"); \
		sys.exit(n > $(GPU_WHEELS_MAX))'

# A real one-node SLURM cluster on this machine (root; tests/slurm_cluster.py): munge and slurm-wlm
# (and slurmdbd with mariadb-server, for sacct) installed with apt-get where missing, munged, slurmctld
# and slurmd started with every file under $(SLURM_DIR); it prints the SLURM_CONF its commands need.
SLURM_DIR ?= build/slurm
slurm-up: $(STAMP)
	$(PY) -m tests.slurm_cluster up $(SLURM_DIR)

slurm-down: $(STAMP)
	$(PY) -m tests.slurm_cluster down $(SLURM_DIR)

clean:
	rm -rf $(VENV) results multirun outputs .gpu-site
