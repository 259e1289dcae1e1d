# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench proto lint typecheck clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/millstream demo

# --against: issue 29's A/B (bench/ab.py); a shallow clone skips it with a line in the report.
bench: $(STAMP)
	$(BIN)/millstream bench --peer spark --peer flink --peer bytewax --against 3a1b1da

PACKAGES := cli runtime master worker injectors spark_bridge examples bench

test: $(STAMP)
	$(BIN)/ruff check $(PACKAGES) tests
	$(BIN)/mypy $(PACKAGES)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check $(PACKAGES) tests

typecheck: $(STAMP)
	$(BIN)/mypy $(PACKAGES)

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iruntime/wire=proto --python_out=. \
	    --grpc_python_out=. --pyi_out=. proto/millstream.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
