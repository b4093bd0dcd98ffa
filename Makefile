# kgsynth: `make all` runs the main job on the embedded default, `make test` runs the tests.
# Both install first (a .venv/ in this checkout; skipped when already up to date).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN ?= runs/default
SMOKE ?=
# Torch on one thread: the tiny models of tests and `make all` are too small to share a step
# between threads, and on a 2-core machine with other load two threads ran up to 10x slower
# (bench_sft.py; stage 1 of a test: 1.3k tokens/s on two threads, 16.8k on one). A value set
# in the environment wins. The cores are used by processes instead (NPROC below); only the
# contamination guard's sentence encoder, whose layers are wide enough, runs on all of them.
export OMP_NUM_THREADS ?= 1
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install virtuoso test test-all lint format all learn dev-check bench clean sparql-agents kbqa-r1 papers

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

# The main job: `kgsynth run` runs the recipe (the packaged metaqa_default, in
# kgsynth/resources/recipes/: its steps in order, every setting of every step, and the smoke
# sizes; `kgsynth recipes` lists the recipes) on the embedded default, the MetaQA movie KB
# packaged in kgsynth/resources/metaqa/, offline: import -> walk -> template questions (contamination guard against
# the evaluation questions) -> oracle trajectories -> filter -> stage1 (tiny model) -> stage 2
# by rejection sampling -> validation questions -> stage2 and GRPO with early stopping -> eval of
# each stage on 300 MetaQA dev questions -> summary with 95 % CIs -> report.html.
# `make all KG=FILE EVAL=FILE` runs the same recipe on another KG (a triple file, a store or a
# SPARQL endpoint) with its own evaluation questions (without EVAL the evaluations are left out).
# A step whose output is complete is skipped: a killed `make all` resumes.
K := $(BIN)/kgsynth
PIPELINE ?= metaqa_default
CFG := --config $(PIPELINE)
# the packaged MetaQA files (kgsynth/resources/metaqa/: the KB, the dev and check samples)
METAQA := kgsynth/resources/metaqa
METAQA_KB := $(METAQA)/kb_partial.txt.gz
DEV := $(METAQA)/dev_sample/metaqa_dev_sample.jsonl
KG ?=
EVAL ?= $(if $(KG),,$(DEV))
# Both cores of a 2-core machine (NPROC processes of one torch thread each): SFT and GRPO
# data-parallel, and the policy's generation in eval and the free rollouts in NPROC worker
# processes (the same answers as one process). benchmarks/README.md, "make all in 20 minutes".
NPROC ?= $(shell [ "$$(nproc 2>/dev/null || echo 1)" -ge 2 ] && echo 2 || echo 1)
# batches of 50: the 300 questions' first turn is 6 batches, 3 per worker
EVAL_AGENT := $(CFG) --kg $(RUN)/kg --batch-size 50 --workers $(NPROC)

all: install
	$(K) run $(PIPELINE) --out $(RUN) $(if $(KG),--kg $(KG)) $(if $(EVAL),--eval-questions $(EVAL)) --nproc $(NPROC) $(if $(SMOKE),--smoke)

# `make learn`: the longer chain (the recipe's size learn, `kgsynth run metaqa_default --size
# learn`): GRPO of 50 steps with groups of 8 over 128 questions a step, the early stopping of
# stage 2 and GRPO on 800 validation questions (GRPO keeps its best checkpoint), and each stage
# evaluated on 1,500 MetaQA dev questions (500 a hop, none in the dev or check sample, drawn from
# $(METAQA_DATA); without it, the 300 of the dev sample). About an hour on 2 cores (runs
# learn51-53: 4,072 s, 3,482 s and 3,497 s; benchmarks/README.md, "make learn on a fifth
# draw").
LEARN_RUN ?= runs/learn
METAQA_DATA ?= ../shared/data/metaqa
LEARN_EVAL ?= $(LEARN_RUN)/dev_questions.jsonl
# the draw's seed, and earlier draws to leave out; the draw is a file target, so a fresh one
# goes in a new run folder (LEARN_RUN=runs/learn2 LEARN_SEED=3
# LEARN_EXCLUDE=runs/learn/dev_questions.jsonl)
LEARN_SEED ?= 2
LEARN_EXCLUDE ?=
learn: install $(LEARN_EVAL)
	$(K) run $(PIPELINE) --size learn --out $(LEARN_RUN) --eval-questions $(LEARN_EVAL) --nproc $(NPROC)

$(LEARN_RUN)/dev_questions.jsonl:
	@mkdir -p $(dir $@)
	@if [ -d $(METAQA_DATA) ]; then \
	  $(BIN)/python $(METAQA)/make_dev_sample.py --metaqa $(METAQA_DATA) --per-hop 500 \
	    --seed $(LEARN_SEED) --exclude $(DEV) --exclude $(DEV_CHECK) \
	    $(foreach f,$(LEARN_EXCLUDE),--exclude $(f)) --out $@; \
	else echo "learn: no MetaQA download at $(METAQA_DATA); evaluating on the dev sample"; \
	  cp $(DEV) $@; fi

# `make dev-check`: the final agent of a finished run ($(RUN)/rl) on 300 other MetaQA dev
# questions ($(METAQA)/dev_check/, none in the dev sample; evaluated only, never chosen on),
# in $(RUN)/eval/check. RUN=$(LEARN_RUN) checks `make learn`'s agent.
DEV_CHECK := $(METAQA)/dev_check/metaqa_dev_check.jsonl
dev-check: install
	@test -f $(RUN)/rl/model.safetensors || { echo "dev-check: no final agent at $(RUN)/rl; run make all (or pass RUN=DIR)" >&2; exit 2; }
	$(K) eval $(EVAL_AGENT) --questions $(DEV_CHECK) --model $(RUN)/rl --out $(RUN)/eval/check --label "rl (check sample)" --overwrite

# The SPARQL-writing agents (issue 17) end to end on the shipped KB, one run per tool set:
# oracle trajectories in the tool set's action space -> filter -> stage1 -> rl (the paper's
# preset) -> eval with the same tools. The recipe is the packaged sparql_agents
# (kgsynth/resources/recipes/sparql_agents.yaml); SMOKE=1 runs it at test size.
SPARQL_RUN ?= runs/sparql-agents
SCFG := --config sparql_agents
SMOKE_S := $(if $(SMOKE),1)
sparql-agents: sparql-agent-knowcoder sparql-agent-isp

sparql-agent-%: install
	@mkdir -p $(SPARQL_RUN)/$*
	$(K) kg import $(METAQA_KB) --out $(SPARQL_RUN)/$*/kg --overwrite
	$(K) walk $(SCFG) --kg $(SPARQL_RUN)/$*/kg --out $(SPARQL_RUN)/$*/walks.parquet --overwrite $(if $(SMOKE_S),--n 60)
	$(K) synthesize questions $(SCFG) --walks $(SPARQL_RUN)/$*/walks.parquet --out $(SPARQL_RUN)/$*/questions.parquet --llm template --benchmark $(DEV) --overwrite
	$(K) synthesize trajectories $(SCFG) --section trajectories_$* --toolset $* --questions $(SPARQL_RUN)/$*/questions.parquet --kg $(SPARQL_RUN)/$*/kg --llm template --out $(SPARQL_RUN)/$*/trajectories.parquet --overwrite
	$(K) filter $(SCFG) --section filter_$* --in $(SPARQL_RUN)/$*/trajectories.parquet --out $(SPARQL_RUN)/$*/corpus --overwrite
	$(K) train stage1 $(SCFG) --corpus $(SPARQL_RUN)/$*/corpus/accepted.parquet --model tiny --out $(SPARQL_RUN)/$*/stage1 --overwrite $(if $(SMOKE_S),--max-steps 8 --copy-warmup-steps 4)
	$(K) train rl $(SCFG) --preset $(if $(filter knowcoder,$*),knowcoder-a1,$*) --questions $(SPARQL_RUN)/$*/questions.parquet --kg $(SPARQL_RUN)/$*/kg --init $(SPARQL_RUN)/$*/stage1 --out $(SPARQL_RUN)/$*/rl --overwrite $(if $(SMOKE_S),--max-steps 1 --questions-per-step 2 --group-size 2 --max-turn-tokens 48)
	$(K) eval $(SCFG) --toolset $* --questions $(DEV) --kg $(SPARQL_RUN)/$*/kg --model $(SPARQL_RUN)/$*/stage1 --out $(SPARQL_RUN)/$*/eval/stage1 --label stage1 --batch-size 64 --overwrite $(if $(SMOKE_S),--limit 3 --max-turn-tokens 48)
	$(K) eval $(SCFG) --toolset $* --questions $(DEV) --kg $(SPARQL_RUN)/$*/kg --model $(SPARQL_RUN)/$*/rl --out $(SPARQL_RUN)/$*/eval/rl --label rl --batch-size 64 --overwrite $(if $(SMOKE_S),--limit 3 --max-turn-tokens 48)
	$(K) eval --compare $(SPARQL_RUN)/$*/eval/stage1 $(SPARQL_RUN)/$*/eval/rl --out $(SPARQL_RUN)/$*/summary --overwrite
	@cat $(SPARQL_RUN)/$*/summary/compare.md

# KBQA-R1 (issue 18) end to end on the shipped KB: constraint walks (count, superlative,
# comparative, time) beside chains -> oracle trajectories in KBQA-R1's S-expression actions
# (--toolset sexpr) -> filter -> stage1 -> Referenced Rejection Sampling against plain rejection
# sampling on the same held-out questions (acceptance of each, printed) -> stage2 on what both
# kept -> rl (--preset kbqa-r1) -> eval with the same tools. Recipe: the packaged kbqa-r1 (its
# sections; `kgsynth run kbqa-r1` runs its steps: list, the same chain in a run folder).
KBQA_RUN ?= runs/kbqa-r1
KCFG := --config kbqa-r1
KQ := --questions $(KBQA_RUN)/questions.parquet --kg $(KBQA_RUN)/kg
kbqa-r1: install
	@mkdir -p $(KBQA_RUN)
	$(K) kg import $(METAQA_KB) --out $(KBQA_RUN)/kg --overwrite
	$(K) walk $(KCFG) --kg $(KBQA_RUN)/kg --out $(KBQA_RUN)/walks.parquet --overwrite $(if $(SMOKE_S),--n 120)
	$(K) synthesize questions $(KCFG) --walks $(KBQA_RUN)/walks.parquet --out $(KBQA_RUN)/questions.parquet --llm template --benchmark $(DEV) --overwrite
	$(K) synthesize trajectories $(KCFG) $(KQ) --llm template --out $(KBQA_RUN)/trajectories.parquet --overwrite
	$(K) filter $(KCFG) --in $(KBQA_RUN)/trajectories.parquet --out $(KBQA_RUN)/corpus --overwrite
	$(K) train stage1 $(KCFG) --corpus $(KBQA_RUN)/corpus/accepted.parquet --model tiny --out $(KBQA_RUN)/stage1 --overwrite $(if $(SMOKE_S),--max-steps 8 --copy-warmup-steps 4)
	$(K) synthesize trajectories $(KCFG) --section rrs_referenced $(KQ) --llm hf --model $(KBQA_RUN)/stage1 --no-cache --out $(KBQA_RUN)/rrs/referenced.parquet --overwrite $(if $(SMOKE_S),--limit 4 --samples 2)
	$(K) synthesize trajectories $(KCFG) --section rrs_plain $(KQ) --llm hf --model $(KBQA_RUN)/stage1 --no-cache --out $(KBQA_RUN)/rrs/plain.parquet --overwrite $(if $(SMOKE_S),--limit 4 --samples 2)
	$(K) filter $(KCFG) --section filter_rrs --in $(KBQA_RUN)/rrs/referenced.parquet --out $(KBQA_RUN)/rrs/referenced_kept --overwrite
	$(K) filter $(KCFG) --section filter_rrs --in $(KBQA_RUN)/rrs/plain.parquet --out $(KBQA_RUN)/rrs/plain_kept --overwrite
	$(K) filter $(KCFG) --section filter_rrs --in $(KBQA_RUN)/rrs/referenced.parquet --in $(KBQA_RUN)/rrs/plain.parquet --in $(KBQA_RUN)/corpus/accepted.parquet --out $(KBQA_RUN)/corpus_stage2 --overwrite
	$(K) train stage2 $(KCFG) --corpus $(KBQA_RUN)/corpus_stage2/accepted.parquet --init $(KBQA_RUN)/stage1 --out $(KBQA_RUN)/stage2 --overwrite $(if $(SMOKE_S),--max-steps 4)
	$(K) train rl $(KCFG) --preset kbqa-r1 $(KQ) --init $(KBQA_RUN)/stage2 --out $(KBQA_RUN)/rl --overwrite $(if $(SMOKE_S),--max-steps 1 --questions-per-step 2 --group-size 2 --max-turn-tokens 48)
	$(K) eval $(KCFG) --questions $(DEV) --kg $(KBQA_RUN)/kg --model $(KBQA_RUN)/stage1 --out $(KBQA_RUN)/eval/stage1 --label stage1 --batch-size 64 --overwrite $(if $(SMOKE_S),--limit 3 --max-turn-tokens 48)
	$(K) eval $(KCFG) --questions $(DEV) --kg $(KBQA_RUN)/kg --model $(KBQA_RUN)/rl --out $(KBQA_RUN)/eval/rl --label rl --batch-size 64 --overwrite $(if $(SMOKE_S),--limit 3 --max-turn-tokens 48)
	$(K) eval --compare $(KBQA_RUN)/eval/stage1 $(KBQA_RUN)/eval/rl --out $(KBQA_RUN)/summary --overwrite
	@$(BIN)/python benchmarks/rrs_acceptance.py $(KBQA_RUN)/rrs
	@cat $(KBQA_RUN)/summary/compare.md

# The five papers' recipes side by side (docs/recipes.md): each packaged recipe (graphwalker,
# kg-r1, kbqa-r1, knowcoder-a1, isp, and kg-r1-sft: KG-R1 with a cold start, the KG-R1 agent
# that answers) run on the shipped KB with the same tiny model size, the same walk seed (the
# same synthesized questions where the recipe allows) and the same MetaQA dev sample, into
# $(PAPERS_RUN)/NAME, then one table of Hits@1, F1, EM and Hit with 95 % intervals, tokens
# trained and wall time (kgsynth.eval.papers). Full CPU sizes take hours; SMOKE=1 runs each
# recipe's smoke sizes. A finished recipe is skipped (kgsynth run resumes).
PAPERS := graphwalker kg-r1 kbqa-r1 knowcoder-a1 isp kg-r1-sft
PAPERS_RUN ?= runs/papers
papers: install
	@for recipe in $(PAPERS); do \
	  echo "== $$recipe"; \
	  $(K) run $$recipe --out $(PAPERS_RUN)/$$recipe --eval-questions $(DEV) --nproc $(NPROC) $(if $(SMOKE),--smoke) || exit 1; \
	done
	$(BIN)/python -m kgsynth.eval.papers $(addprefix $(PAPERS_RUN)/,$(PAPERS)) > $(PAPERS_RUN)/papers.md
	@cat $(PAPERS_RUN)/papers.md

bench: install
	$(BIN)/python benchmarks/bench_kg_tools.py
	$(BIN)/python benchmarks/bench_walk.py
	$(BIN)/python benchmarks/bench_llm.py
	$(BIN)/python benchmarks/bench_filter.py

clean:
	rm -rf runs .pytest_cache .ruff_cache
