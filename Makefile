# Two commands on a fresh clone: `make run` serves the sidecar, `make test` runs the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SOURCES := pyproject.toml setup.py $(wildcard proto/context_sidecar/v1/*.proto) $(wildcard fastpath/*.pyx fastpath/*.pxd)
PYTEST_ARGS ?=
# Test processes: one per core, at most four (the suite's servers and the soak share the machine).
# TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= auto
ARGS ?=

.PHONY: install run demo test compile lint bench clean

$(STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Serves ContextService on 127.0.0.1:50051 with the embedded DuckDB file ./data/sidecar.duckdb.
# ARGS go to `serve` and come last, so they may override these: make run ARGS="--metrics-port 9464".
run: $(STAMP)
	$(BIN)/python -m sidecar serve --db ./data/sidecar.duckdb --listen 127.0.0.1:50051 $(ARGS)

# The OpsPilot demo against a running sidecar (`make run` in another terminal); the token comes from
# SIDECAR_AUTH_TOKEN. ARGS go to `demo`: make demo ARGS="--address 127.0.0.1:50052".
demo: $(STAMP)
	$(BIN)/python -m sidecar demo $(ARGS)

# The whole suite, spread over TEST_WORKERS processes (pytest-xdist). pytest's exit 5 (no tests
# collected) is a failure, not a pass.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "FAIL: pytest collected no tests"; fi; exit $$rc

# Rebuild the Cython fastpath and the gRPC stubs in place after editing them.
compile: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace
	$(BIN)/python -c "import setup; setup.generate_stubs()"

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b --quick | tail -n 1; done

clean:
	rm -rf build $(VENV) fastpath/*.so fastpath/*.c sidecar/api/*_pb2*.py* sidecar/api/__init__.py
