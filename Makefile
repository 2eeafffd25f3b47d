# `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kakeya-installed
# The venv's tools (kakeya, actionlint, shellcheck) come first for every recipe and test.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel first: any other torch spec pulls gigabytes of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[torch,mlx,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kakeya run niah-smoke --out out/demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@if [ -d .github/workflows ]; then $(VENV)/bin/actionlint .github/workflows/*.yml; fi

test: lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --cov --cov-report=term
	$(PY) -m coverage report --include='bridge/*' --fail-under=90 > /dev/null || \
	  { echo "bridge/ line coverage is under 90 %"; $(PY) -m coverage report --include='bridge/*'; exit 1; }

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .coverage out
