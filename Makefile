# The two commands of the README: `make demo` and `make test`. Each creates or refreshes
# the local virtual environment (.venv) first, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench fidelity clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/compactor demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# CI's gates before the tests (.ci/run): both cover worker, scheduler, db, tests and bench;
# mypy takes its package list and strict mode from pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check worker scheduler db tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# Every benchmark at full size (docs/BENCHMARKS.md has the figures and the machine).
BENCHES := startup_bench plan_bench job_overhead task_overhead throughput chunk_merge_bench incremental_bench memory_bench scan_bench projection_bench recall_bench fidelity
bench: $(STAMP)
	@for name in $(BENCHES); do echo "== bench.$$name"; $(BIN)/python -m bench.$$name || exit 1; done

# What a summary keeps, both summarizers, 10k-200k-token sessions and 10 rounds of growth
# (~2.5 min here); FIDELITY_ARGS=--full adds 1M-token sessions, --quick is the smoke size.
fidelity: $(STAMP)
	$(BIN)/python -m bench.fidelity $(FIDELITY_ARGS)

clean:
	rm -rf $(VENV) .compactor
