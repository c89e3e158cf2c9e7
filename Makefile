# The README's two set-up commands: `make demo` and `make test`. Each creates .venv if missing
# and installs the project into it (pip skips what is already satisfied).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ihsweep train --config=configs/default.py --workdir=runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py --json --workload reference --E 1,4,16

clean:
	rm -rf $(VENV) runs
