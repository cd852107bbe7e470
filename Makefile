# `make demo`, `make test` (everything, what CI runs) and `make test-fast` (the quick loop:
# no worker processes, torchrun, notebooks or model oracle). Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch/torchvision are pinned to the releases that lie on local disk (the versions pinned in pyproject.toml).
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: demo test test-fast install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: $(PY) pyproject.toml
	$(PIP) install --quiet $(TORCH_PINS)
	$(PIP) install --quiet -e ".[plot]" $(TORCH_PINS)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install --quiet -e ".[test,plot]" $(TORCH_PINS)
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: install
	$(VENV)/bin/energon-pack demo

PYTEST := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest --durations=15

test: install-test
	$(PYTEST)

test-fast: install-test
	$(PYTEST) -m "not slow" --timeout=300

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
