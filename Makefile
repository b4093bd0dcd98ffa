# kgsynth: `make all` runs the main job on the embedded default, `make test` runs the tests.
# Both install first (a .venv/ in this checkout; skipped when already up to date).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN ?= runs/default
SMOKE ?=
WALKS := $(if $(SMOKE),100,1000)
# Torch on one thread: the tiny models of tests and `make all` are too small to share a step
# between threads, and on a 2-core machine with other load two threads ran up to 10x slower
# (bench_sft.py; stage 1 of a test: 1.3k tokens/s on two threads, 16.8k on one). A value set
# in the environment wins.
export OMP_NUM_THREADS ?= 1
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

# The main job on the embedded default (the MetaQA movie KB shipped in data/), offline:
# import -> walk -> questions (template) -> oracle trajectories (train split) -> filter ->
# stage1 (tiny model) -> free rollouts of stage1 + oracle replays on the held-back questions
# -> filter -> stage2 -> GRPO -> eval of stage1/stage2/rl on the MetaQA dev sample -> summary.
# SMOKE=1 runs the same chain at a size CI can afford.
K := $(BIN)/kgsynth
STAGE1_STEPS := $(if $(SMOKE),--max-steps 20,--epochs 2)
STAGE2_STEPS := $(if $(SMOKE),--max-steps 10,--epochs 2)
FREE_LIMIT := $(if $(SMOKE),8,60)
RL_STEPS := $(if $(SMOKE),3,30)
EVAL_LIMIT := $(if $(SMOKE),9,60)
EVAL := --questions data/metaqa/dev_sample/metaqa_dev_sample.jsonl --kg $(RUN)/kg \
	--limit $(EVAL_LIMIT) --max-turns 6 --max-tokens 96

all: install
	@mkdir -p $(RUN) && date +%s > $(RUN)/.started
	$(K) kg import data/metaqa/kb_partial.txt.gz --out $(RUN)/kg --force
	$(K) kg stats --kg $(RUN)/kg --json > $(RUN)/kg_stats.json
	$(K) kg tool --kg $(RUN)/kg --question "who directed Kismet" 'get_relations("Kismet")'
	$(K) walk --kg $(RUN)/kg --n $(WALKS) --seed 0 --config pipelines/metaqa_default.yaml --out $(RUN)/walks/walks.parquet --overwrite
	$(K) synthesize questions --walks $(RUN)/walks/walks.parquet --out $(RUN)/questions/questions.parquet --llm template
	$(K) synthesize trajectories --questions $(RUN)/questions/questions.parquet --kg $(RUN)/kg --mode oracle --llm template --split train --out $(RUN)/trajectories/trajectories.parquet
	$(K) filter --in $(RUN)/trajectories/trajectories.parquet --out $(RUN)/corpus
	$(K) train stage1 --corpus $(RUN)/corpus/accepted.parquet --model tiny --out $(RUN)/stage1 --overwrite $(STAGE1_STEPS)
	$(K) synthesize trajectories --questions $(RUN)/questions/questions.parquet --kg $(RUN)/kg --mode free --llm hf --model $(RUN)/stage1 --split heldout --limit $(FREE_LIMIT) --samples 2 --temperature 0.7 --max-turns 6 --max-tokens 96 --no-cache --out $(RUN)/stage2_data/free.parquet
	$(K) synthesize trajectories --questions $(RUN)/questions/questions.parquet --kg $(RUN)/kg --mode oracle --llm template --split heldout --out $(RUN)/stage2_data/oracle.parquet
	$(K) filter --in $(RUN)/stage2_data/free.parquet --in $(RUN)/stage2_data/oracle.parquet --out $(RUN)/corpus_stage2
	$(K) train stage2 --corpus $(RUN)/corpus_stage2/accepted.parquet --init $(RUN)/stage1 --out $(RUN)/stage2 --overwrite $(STAGE2_STEPS)
	$(K) train rl --questions $(RUN)/questions/questions.parquet --kg $(RUN)/kg --init $(RUN)/stage2 --out $(RUN)/rl --overwrite --max-steps $(RL_STEPS) --max-turns 4 --temperature 0.7 --save-steps 10 --reward kg-r1
	$(K) eval $(EVAL) --model $(RUN)/stage1 --out $(RUN)/eval/stage1 --baseline no-tools
	$(K) eval $(EVAL) --model $(RUN)/stage2 --out $(RUN)/eval/stage2
	$(K) eval $(EVAL) --model $(RUN)/rl --out $(RUN)/eval/rl
	$(K) eval --compare $(RUN)/eval/stage1 $(RUN)/eval/stage2 $(RUN)/eval/rl --out $(RUN)/summary
	@echo "make all: $$(( $$(date +%s) - $$(cat $(RUN)/.started) ))s; summary in $(RUN)/summary/compare.md"

bench: install
	$(BIN)/python benchmarks/bench_kg_tools.py
	$(BIN)/python benchmarks/bench_walk.py
	$(BIN)/python benchmarks/bench_llm.py
	$(BIN)/python benchmarks/bench_filter.py

clean:
	rm -rf runs .pytest_cache .ruff_cache
