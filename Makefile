# The README's two set-up commands: `make demo` and `make test`. Each creates .venv if missing
# and installs the project into it (pip skips what is already satisfied).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench install clean upgrade-constraints

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The dependency versions the tests pass on (constraints.txt; pins for the Python it was frozen
# with, other Pythons resolve pyproject's ranges).
# libtpu (the TPU compiler, ~210 MB from PyPI) goes into build/libtpu, not the venv: with it
# importable JAX probes for a TPU at every start; `ihsweep plan --target=v5e:…` and its test
# (tests/test_targets.py) put it on PYTHONPATH. On a TPU VM install '.[tpu]' instead.
LIBTPU := build/libtpu
# JAX's CUDA plugin for compile-only GPU devices (`ihsweep plan --target=h100-80gb`: XLA:GPU
# without a GPU), ~480 MB, the version of the installed jax, --no-deps (no other NVIDIA
# library), and cuDNN (~1.0 GB; JAX's CUDA wheels need >= 9.8, the target configs' dnn version),
# which builds the train step's flash attention: likewise off the venv's path, so that no other
# command probes for CUDA.
JAX_CUDA := build/jax-cuda
CUDNN    := nvidia-cudnn-cu12==9.8.0.87
# setuptools' editable finder answers after the path's folders, so a notebook started beside a
# clone named ihsweep got that folder as an empty namespace package; ihsweep-first.pth moves the
# finder (which answers for ihsweep and ihsweep_analysis only) to the front.
FIRST_PTH := import sys; sys.meta_path[:] = sorted(sys.meta_path, key=lambda f: not str(getattr(f, "__module__", "")).startswith("__editable___ihsweep_"))
# setuptools' "Editable installation." box (InformationOnly, a UserWarning: folders named like the
# package may take precedence; ihsweep-first.pth handles that) is filtered by its exact message;
# every other warning and error of the build still shows.
EDITABLE_NOTE := ignore:Editable installation.:UserWarning
# pip byte-compiles what it installs one file at a time (~60 s of the ~90 s install on 2 cores);
# compileall does it on every core, beside the two --target installs (which need no .pyc: their
# Python is a few plugin files). A file compileall cannot compile (one written for another Python
# version) is skipped, as pip skips it.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt Makefile
	PYTHONWARNINGS='$(EDITABLE_NOTE)' $(BIN)/pip install --quiet --no-compile -c constraints.txt -e '.[dev,interop]'
	$(BIN)/python -c 'import sys, sysconfig; open(sysconfig.get_path("purelib") + "/ihsweep-first.pth", "w").write(sys.argv[1] + "\n")' '$(FIRST_PTH)'
	purelib=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
	{ $(BIN)/python -m compileall -q -j 0 "$$purelib" > /dev/null 2>&1 || true; } & compiling=$$!; \
	v=$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("jax"))'); \
	$(BIN)/pip install --quiet --no-compile --no-deps --upgrade -c constraints.txt --target $(LIBTPU) libtpu \
	&& $(BIN)/pip install --quiet --no-compile --no-deps --upgrade --target $(JAX_CUDA) \
	  "jax-cuda12-plugin==$$v" "jax-cuda12-pjrt==$$v" "$(CUDNN)"; \
	installed=$$?; wait $$compiling; exit $$installed
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

# The suite on TEST_WORKERS pytest-xdist processes, a test file each at a time (--dist loadfile:
# a file's module fixtures are built once). Tests are CPU-bound compiles: on the 2-core CI
# machine 2 workers took the suite from 1105 s to 720 s (--dist worksteal: 778 s); 3 workers
# took it from ~1000 s to 1108 s (issue 45: more CPU lost to contention than idle time won).
# TEST_WORKERS=0 runs it in one process, as `pytest tests/...` does.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py --json --workload reference --E 1,4,16

# Newer dependencies: install without constraints into a fresh venv (build/upgrade-venv), run
# the tests there, and only if they pass write its pip freeze to constraints.txt (each pin for
# this Python's version). Review `git diff constraints.txt`; the next `make test` installs them.
UPGRADE_VENV := build/upgrade-venv
# Versions kept back (constraints.txt's header says why).
UPGRADE_HOLD := 'ml_dtypes<0.7'
upgrade-constraints:
	rm -rf $(UPGRADE_VENV)
	$(PYTHON) -m venv $(UPGRADE_VENV)
	$(UPGRADE_VENV)/bin/pip install --quiet --upgrade pip
	$(UPGRADE_VENV)/bin/pip install --quiet -e '.[dev,interop]' $(UPGRADE_HOLD)
	$(UPGRADE_VENV)/bin/python -m pytest tests
	pyv=$$($(UPGRADE_VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	{ sed -n '/^#/p' constraints.txt; $(UPGRADE_VENV)/bin/pip freeze --exclude-editable | \
	  sed "s/$$/ ; python_version == \"$$pyv\"/"; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	rm -rf $(UPGRADE_VENV)

clean:
	rm -rf $(VENV) runs
