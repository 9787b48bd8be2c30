# Two commands do all set-up on a fresh machine (see README.md):
#   make demo   run the demo runbook headless on the embedded default (local, CPU)
#   make test   run the test suite (installs sshd/tmux from Debian packages when root)
# and for the edit loop:
#   make test-fast   the suite less the `slow` tier, attack loops at EAGLE_TUI_TRIALS=0.25
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

# the suite in parallel, one worker per core, idle workers steal queued tests (tests/tiers.py,
# docs/ARCHITECTURE.md "Test tiers"); `make test WORKERS=1` runs it in one process
WORKERS ?= auto
PYTEST := $(VENV)/bin/pytest -q -n $(WORKERS) --dist worksteal
FAST_TRIALS ?= 0.25

.PHONY: setup demo tui test test-fast lint system-deps

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch from local disk; an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[ml,test]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: setup
	$(VENV)/bin/eagle-tui run runbooks/demo.yaml --auto --yes --new-run

tui: setup
	$(VENV)/bin/eagle-tui run runbooks/demo.yaml --run latest

system-deps:
	./.ci/system-deps

test: setup system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright
	$(PYTEST) --durations=25

test-fast: setup
	EAGLE_TUI_TRIALS=$(FAST_TRIALS) $(PYTEST) -m 'not gpu and not slow' --durations=10

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright  # basic mode over the packages [tool.pyright] includes
