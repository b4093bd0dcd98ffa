# kgsynth: `make all` runs the main job on the embedded default, `make test` runs the tests.
# Both install first (a .venv/ in this checkout; skipped when already up to date).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN ?= runs/default
SMOKE ?=
WALKS := $(if $(SMOKE),100,1000)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install virtuoso test test-all lint format all bench clean

install: $(STAMP)

# torch first, pinned, so pip takes the local CPU wheel and no CUDA packages are pulled;
# everything else is installed under the same pin (constraints.txt).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# Debian's Virtuoso 7.2, the engine the papers run Freebase on (used by the tests).
virtuoso:
	@command -v virtuoso-t >/dev/null 2>&1 || \
	  ( $(SUDO) apt-get install -y -q virtuoso-opensource >/dev/null 2>&1 || \
	    ( $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q virtuoso-opensource >/dev/null ) ) || \
	  echo "warning: could not install virtuoso-opensource; Virtuoso tests will be skipped"

# pytest's exit code 5 (no tests collected, e.g. under a -k filter) is not a failure.
test: install virtuoso
	$(BIN)/pytest -q $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-all: install virtuoso
	$(BIN)/pytest -q -m ""

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# The main job on the embedded default (the MetaQA movie KB shipped in data/), offline.
all: install
	$(BIN)/kgsynth kg import data/metaqa/kb_partial.txt.gz --out $(RUN)/kg --force
	$(BIN)/kgsynth kg stats --kg $(RUN)/kg --json > $(RUN)/kg_stats.json
	$(BIN)/kgsynth kg tool --kg $(RUN)/kg --question "who directed Kismet" 'get_relations("Kismet")'
	$(BIN)/kgsynth walk --kg $(RUN)/kg --n $(WALKS) --seed 0 --config pipelines/metaqa_default.yaml --out $(RUN)/walks/walks.parquet --overwrite
	$(BIN)/kgsynth synthesize questions --walks $(RUN)/walks/walks.parquet --out $(RUN)/questions/questions.parquet --llm template
	$(BIN)/kgsynth synthesize trajectories --questions $(RUN)/questions/questions.parquet --kg $(RUN)/kg --mode oracle --llm template --out $(RUN)/trajectories/trajectories.parquet
	$(BIN)/kgsynth filter --in $(RUN)/trajectories/trajectories.parquet --out $(RUN)/corpus

bench: install
	$(BIN)/python benchmarks/bench_kg_tools.py
	$(BIN)/python benchmarks/bench_walk.py
	$(BIN)/python benchmarks/bench_llm.py
	$(BIN)/python benchmarks/bench_filter.py

clean:
	rm -rf runs .pytest_cache .ruff_cache
