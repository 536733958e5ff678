PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 first: on these machines it is a CPU wheel on local disk; a bare `torch` may pull a CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup run test ui bench-engine bench-orchestrator bench-kernels clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[dev]'

run:
	$(BIN)/python -m orchestrator +sweep=longctx

test:
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -ra tests

ui:
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

bench-engine:
	$(BIN)/python -m workers.reference.bench

bench-orchestrator:
	RAY_AUTH_MODE=disabled $(BIN)/python -m orchestrator.bench

bench-kernels:
	$(BIN)/python -m kernels.bench

clean:
	rm -rf $(VENV) .pytest_cache
