# autotune: `make run` runs the CPU demo study end to end; `make test` runs the whole suite.
# Everything installs into .venv/ at the repository root, vLLM's CPU build included.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := models/demo
DB     := sqlite:///studies/demo-cpu.db

.PHONY: setup demo-model run test test-serial test-fast postgres clean chromium

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[cpu,dev]'
	# PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside the CPU torch build
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

demo-model: $(STAMP)
	$(BIN)/autotune demo-model $(DEMO)

run: demo-model
	$(BIN)/autotune run --study studies/demo-cpu.yaml --no-progress
	$(BIN)/autotune show --storage $(DB)
	$(BIN)/autotune export --storage $(DB) --format vllm-yaml -o studies/demo-cpu-best.yaml

# The report's browser test needs Debian's Chromium: installed here when missing and we are root
# (idempotent); otherwise that test skips and says why.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	else echo "chromium is missing and cannot be installed here (not root or no apt-get): the browser test will skip"; fi

test: demo-model postgres chromium
	$(PY) tests/streams.py

test-serial: demo-model postgres chromium
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

# PostgreSQL server binaries for the multi-host tests (they start a throwaway server themselves):
# installed when missing and running as root; otherwise those tests skip and say why.
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	else echo "PostgreSQL server binaries missing (apt-get install postgresql as root): the PostgreSQL tests will skip"; fi

test-fast: $(STAMP)
	$(PY) tests/streams.py --fast

clean:
	rm -rf $(VENV) $(DEMO) studies/*.db studies/*-logs
