# Two commands on a fresh machine:  make demo   |   make test
# Both create .venv when missing and install everything (torch first, pinned;
# override for GPU machines, e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url ...").
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean-demo benchmarks recipes

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

# every pretraining recipe of the family on the demo corpus (its data stages are the demo's, cached),
# evaluated beside random-init, then one table: docs/recipes-scorecard.md (~30 min on 2 CPU cores)
RECIPES := electra mlm infoxlm veco electra-mrtd-only electra-en-x
recipes: $(STAMP)
	for r in $(RECIPES); do $(BIN)/xylent run evaluate --spec data_specs/recipes/$$r.yaml || exit 1; done
	$(BIN)/xylent run pretrain --spec data_specs/recipes/metaxlm-phase1.yaml
	$(BIN)/xylent run evaluate --spec data_specs/recipes/metaxlm-phase2.yaml
	$(BIN)/xylent compare $(foreach r,$(RECIPES) metaxlm-phase2,--spec data_specs/recipes/$(r).yaml) \
		--out docs/recipes-scorecard.md

benchmarks: $(STAMP)
	$(BIN)/python benchmarks/prepare_throughput.py

clean-demo:
	rm -rf workspace
