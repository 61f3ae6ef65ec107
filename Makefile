# Two commands for a fresh machine:
#   make demo   bake the default project into build/demo and train it (CPU is fine)
#   make test   run every test of the template and of the projects it bakes (what CI runs)
#   make check  the developer's lane, for every edit: bake both engines, lint them, run their fast tests (not slow)
#   make gpu-check [ENGINE=accelerate]   on a GPU machine: every layout x precision against single, as a table
# Everything runs in a virtual environment of its own (VENV), made from BASE_PYTHON: what the machine has installed
# besides stays out. One case measured on the CI machine: its image has scipy, which torchmetrics then imports into
# every Lightning process (scipy.signal, 1.6 s of CPU each; CI time). `make test VENV=...` uses another one.
BASE_PYTHON ?= python3
VENV ?= build/venv
PYTHON := $(abspath $(VENV))/bin/python
# the environment's commands (python, cruft, torchrun) first: the launch scripts and SLURM jobs the tests start
# call `python`
export PATH := $(abspath $(VENV))/bin:$(PATH)
ENGINE ?= lightning
TORCH ?= torch==2.13.0
UV := $(abspath $(VENV))/bin/uv
# pip's folders of local wheels (pip.conf's find-links, PIP_FIND_LINKS) passed on to uv; bytecode compiled as pip
# does (tests start interpreters with -B, which would compile every module they import each time). `=`: pip's
# configuration is read when installing only, not by every make command
UV_OPTIONS = --compile-bytecode $(foreach folder,$(sort $(shell $(BASE_PYTHON) -m pip config get global.find-links \
  2>/dev/null) $(PIP_FIND_LINKS)),--find-links $(folder))

.PHONY: install packages demo test check bench gpu-check
install: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.txt
	test -x $(PYTHON) || $(BASE_PYTHON) -m venv $(VENV)
	# uv installs the same packages as pip, from the same places, in less time (CI time; measured on a 2-core
	# machine: 121 s with pip, 51 s with uv, most of it compiling bytecode as pip does). It does not read pip's
	# configuration: pip's folder of local wheels (torch's CPU build) is passed on. pip does it where uv cannot.
	$(PYTHON) -m pip install -q uv || true
	test -x $(UV) && $(MAKE) --no-print-directory packages INSTALL="$(UV) pip install --python $(PYTHON) $(UV_OPTIONS)" \
	  || $(MAKE) --no-print-directory packages INSTALL="$(PYTHON) -m pip install"
	touch $@

packages:  ## (used by install) what the tests need, installed with $(INSTALL)
	$(INSTALL) -q "$(TORCH)"
	$(INSTALL) -q -r requirements-dev.txt
	# data=streaming's litdata, without its torchvision (only its image codecs use it; from PyPI it would pull
	# a CUDA torch): its other dependencies are in requirements-dev.txt.
	$(INSTALL) -q --no-deps "litdata>=0.2.70,<0.3"
	# wandb's sweep config schema (the `sweeps` package of wandb[sweeps]), for the test of --export-wandb-sweep, in a
	# folder of its own (SWEEPS_SITE) with the scikit-learn and scipy it imports, without its numpy<2 pin: scipy in
	# the trainings' environment would make every Lightning process import scipy.signal (1.6 s of CPU each; CI time).
	$(INSTALL) -q --no-deps --target build/sweeps-site "sweeps>=0.2,<0.4" scikit-learn scipy joblib threadpoolctl
	# transformers (model=causal_lm, the [transformers] extra) in a folder of its own too (TRANSFORMERS_SITE), its
	# dependencies above: where it is installed, every Lightning process imports it through torchmetrics (measured:
	# 0.85 s of CPU each, a fifth of a short training's; CI time). The Accelerate project's suite runs with it.
	$(INSTALL) -q --no-deps --target build/transformers-site "transformers>=5,<6"

demo: install
	rm -rf build/demo
	cookiecutter --no-input --output-dir build/demo .
	cd build/demo/scaled-trainer && PYTHONPATH=src $(PYTHON) -m scaled_trainer.train

test: install
	SWEEPS_SITE=$(CURDIR)/build/sweeps-site TRANSFORMERS_SITE=$(CURDIR)/build/transformers-site $(PYTHON) -m pytest tests -n 2 --dist loadgroup --durations=12

check: install  ## lint + the fast tests (no training processes) of both engines' projects, two files at a time
	rm -rf build/check
	$(PYTHON) scripts/lint_template.py
	set -e; for engine in lightning accelerate; do \
	  cookiecutter --no-input --output-dir build/check/$$engine . engine=$$engine; \
	  cd build/check/$$engine/scaled-trainer; \
	  $(PYTHON) -m ruff check --no-cache . && $(PYTHON) -m ruff format --check --no-cache .; \
	  WANDB_MODE=offline PYTHONPATH=src:$(CURDIR)/build/transformers-site SWEEPS_SITE=$(CURDIR)/build/sweeps-site $(PYTHON) -m pytest -q -p no:cacheprovider -n 2 -m "not slow"; \
	  cd $(CURDIR); \
	done

bench: install  ## overhead of the template vs a plain PyTorch loop (single and ddp)
	$(PYTHON) benchmarks/overhead.py --ddp

gpu-check: install  ## on a GPU machine: every layout x precision it can host, against single; prints the table
	rm -rf build/gpu-check
	cookiecutter --no-input --output-dir build/gpu-check . engine=$(ENGINE)
	cd build/gpu-check/scaled-trainer && PYTHONPATH=src $(PYTHON) -m pytest -m gpu -rs -p no:cacheprovider
