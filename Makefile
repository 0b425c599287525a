PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup browser demo test bench clean

$(BIN)/rnr: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel on disk; an unpinned resolve pulls CUDA.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,scale]'
	touch $(BIN)/rnr

setup: $(BIN)/rnr

# The report tests open pages in Debian's headless Chromium; without it they skip.
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium could not be installed: the browser tests will skip"

demo: setup
	$(BIN)/rnr audit --model smollm2 --task arithmetic --n 24 --k 32 --out runs/demo
	$(BIN)/rnr report runs/demo

test: setup browser
	$(BIN)/python -m pytest -q -rs tests

bench: setup
	$(BIN)/python benchmarks/sampling.py --quick

clean:
	rm -rf $(VENV) runs
