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

# The demo sweep (configs/demo.py) into $(DEMO_DIR), then its analysis. Rerunning resumes an
# interrupted sweep; DEMO_FLAGS passes run flags, e.g. DEMO_FLAGS='--grid=train.batch_size=8,16'
# (with a new DEMO_DIR: a run directory belongs to its grid).
DEMO_DIR   ?= runs/demo
DEMO_FLAGS ?=

demo: $(STAMP)
	$(BIN)/ihsweep corpus fetch python-docs
	$(BIN)/ihsweep run --config=configs/demo.py --workdir="$(DEMO_DIR)" $(DEMO_FLAGS)
	$(BIN)/python -m analysis report "$(DEMO_DIR)" --out "$(DEMO_DIR)/analysis"
	@echo "open $(DEMO_DIR)/analysis/report.html; how the demo was calibrated and what it shows against the study: docs/results.md"

test: $(STAMP)
	$(BIN)/python -m pytest tests

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py --json --workload reference --E 1,4,16

clean:
	rm -rf $(VENV) runs
