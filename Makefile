# `make demo`, `make test` (everything, what CI runs: the main suite, then the compatibility run),
# `make test-fast` (the quick loop: no worker processes, torchrun, notebooks or model oracle) and
# `make test-profile` (the main suite's seconds per test folder) and `make gpu-check` (on a CUDA machine).
# Each creates the virtual environment it needs when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# pyproject.toml declares the supported version ranges; our own test runs use the exact versions
# in constraints/ (torch 2.14.1 / torchvision 0.29.1 are the releases on local disk).
CONSTRAINTS := constraints/py311.txt

# Compatibility run: Python 3.12 beside Megatron-Bridge 0.6.2 and transformers 5.12.1 (the
# newest Bridge allows): golden token, pixel and rope tests, Bridge's own training-step code
# (its train_step and training_log over two gloo ranks with our forward_step included),
# and the install check. Python 3.12: pyenv's 3.12.x (its bare python3.12 shim needs
# PYENV_VERSION), else python3.12 on PATH; override with PYTHON312=/path/to/python3.12.
COMPAT_VENV := .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_CONSTRAINTS := constraints/compat-py312.txt
PYTHON312 ?= $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))
# Golden tests on a fifth of each golden mix (the main run checks all of it on transformers 5.24).
COMPAT_GOLDEN_FRACTION := 0.2
COMPAT_TESTS := tests/qwen/test_rope.py tests/qwen/test_geometry.py tests/qwen/test_processor.py tests/qwen/test_qwen35.py \
	tests/golden/test_preencode.py::test_preencode_equals_hf_processor \
	tests/golden/test_preencode.py::test_preencode_equals_hf_processor_with_custom_limits \
	tests/golden/test_postencode.py::test_postencode_pixels_equal_hf_processor \
	tests/golden/test_postencode.py::test_uint8_payload_normalises_to_the_float32_payload \
	tests/golden/test_real_corpus.py tests/qwen/test_video_probe.py::test_rotation_rule_matches_transformers_load_video \
	tests/rows/test_step.py tests/bridge/test_bridge_step.py tests/bridge/test_bridge_metrics.py tests/package/test_install.py \
	tests/golden/test_tool_calls.py \
	tests/formats/test_bridge_format_compat.py \
	tests/data/test_parquet_input.py::test_a_datasets_save_to_disk_folder

.PHONY: demo test test-fast test-profile test-compat gpu-check install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: $(PY) pyproject.toml $(CONSTRAINTS)
	$(PIP) install --quiet -e ".[plot]" -c $(CONSTRAINTS)
	touch $@

# One pip run for a new test environment (the demo's packages are a subset of it).
$(VENV)/.installed-test: $(PY) pyproject.toml $(CONSTRAINTS)
	$(PIP) install --quiet -e ".[test,plot]" -c $(CONSTRAINTS)
	touch $(VENV)/.installed $@

# Bridge and Megatron-Core come without their dependencies (CUDA-only builds); their training-step
# modules need only what the first line installs. torch comes from the package index here (a few
# GB the first time; pip's cache keeps later builds fast).
$(COMPAT_VENV)/.installed: pyproject.toml $(COMPAT_CONSTRAINTS)
	$(PYTHON312) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet --upgrade pip
	$(COMPAT_PY) -m pip install --quiet -e ".[test]" datasets omegaconf einops tensorboard nvidia-modelopt \
		-c $(COMPAT_CONSTRAINTS)
	$(COMPAT_PY) -m pip install --quiet --no-deps megatron-bridge megatron-core qwen-vl-utils -c $(COMPAT_CONSTRAINTS)
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: install
	$(VENV)/bin/energon-pack demo

# Test processes (pytest-xdist): units of work are test files, the golden mix and each notebook,
# the long ones first (tests/support/scheduling.py). TEST_PROCESSES=0 runs in this process. Each
# test process (and the compatibility run beside them) computes with TEST_THREADS torch/OpenMP
# threads: on two cores, more threads than cores only wait for each other.
TEST_PROCESSES ?= 2
TEST_THREADS ?= 1
TEST_ENV := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=$(TEST_THREADS)
PYTEST := $(TEST_ENV) $(PY) -m pytest --durations=15 -n $(TEST_PROCESSES)

# The compatibility run has its own venv and runs beside the main suite's processes, its output kept
# in .test-compat.log and printed after the main suite's; `make test` fails when either fails. The
# suite reads nothing from the terminal (stdin /dev/null); a run in which no test finishes for
# ENERGON_PACK_STALL_S seconds (default 1200) ends with its processes' stacks (tests/support/stall_watch.py).
test: install-test
	@$(MAKE) --no-print-directory test-compat > .test-compat.log 2>&1 & compat=$$!; \
	$(PYTEST) < /dev/null; main=$$?; \
	wait $$compat; status=$$?; \
	echo "==== compatibility run (beside the main suite; exit $$status): .test-compat.log ===="; \
	cat .test-compat.log; \
	test $$main -eq 0 -a $$status -eq 0

test-fast: install-test
	$(PYTEST) -m "not slow" --timeout=300

# The whole main suite with the seconds spent per test folder (the compatibility run not included).
test-profile: install-test
	$(PYTEST) --folder-times

# On a machine with CUDA: the CUDA tests, to_device_batch rates (uint8 vs float32 payload), the tiny
# Qwen2.5-VL packed vs each sample alone (float32, bfloat16; forward and backward) and the loader's
# samples/s on the realistic mix with 1-14 workers: one table, cut at 8 minutes
# (tests/support/gpu_check.py). Without CUDA it says so and exits 0.
gpu-check: install-test
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout 480 $(PY) -m tests.support.gpu_check

test-compat:
	@if [ -n "$(PYTHON312)" ] && "$(PYTHON312)" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then \
		$(MAKE) --no-print-directory $(COMPAT_VENV)/.installed PYTHON312="$(PYTHON312)" && \
		$(TEST_ENV) ENERGON_PACK_GOLDEN_FRACTION=$(COMPAT_GOLDEN_FRACTION) \
			$(COMPAT_PY) -m pytest --durations=10 $(COMPAT_TESTS); \
	else \
		echo "SKIPPED the compatibility run (Python 3.12, transformers 5.12.1, Megatron-Bridge 0.6.2):" \
			"no working Python 3.12 found; set PYTHON312=/path/to/python3.12"; \
	fi

clean:
	rm -rf $(VENV) $(COMPAT_VENV) .pytest_cache .hypothesis .test-compat.log
