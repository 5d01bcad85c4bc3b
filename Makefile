# Two commands on a fresh machine:  make demo   |   make test
# Both create .venv when missing and install everything (torch first, pinned;
# override for GPU machines, e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url ...").
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean-demo benchmarks

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[demo,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/xylent run pipeline --spec data_specs/demo.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

benchmarks: $(STAMP)
	$(BIN)/python benchmarks/prepare_throughput.py

clean-demo:
	rm -rf workspace
