# Two commands on a fresh machine:  make demo   |   make test
# Both create .venv when missing and install everything (torch first, pinned, by pip;
# override for GPU machines, e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url ...").
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
AZURITE_VERSION ?= 3.37.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install-check test-fast acceptance replay install lock clean-demo bench benchmarks recipes gpu-bundle \
	compose-up compose-up-gpu

# torch by pip (a local file on the CI machines; TORCH_SPEC for GPUs), the rest by uv: seconds instead of
# minutes, and the torch installed first satisfies every requirement on it.  Bytecode compiled at install, as
# pip does: with PYTHONDONTWRITEBYTECODE set, every process would otherwise recompile what it imports.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode -c constraints.txt -e '.[demo,dev]'
	touch $(STAMP)

# constraints.txt: the exact version of every package but torch (TORCH_SPEC picks its build), every extra
# included (the image installs server, s3, gcs and azure), resolved by uv from pyproject.toml's ranges for
# Linux x86_64 and Python 3.11.  The versions already in it are kept unless a range now excludes them, or
# UPGRADE=1 (everything to the newest its range allows) or UPGRADE=<package> (that one).  Needs only uv,
# not an install: the .venv's old pins may be what a new range rules out.  torch's CUDA packages are left out.
LOCK_TMP := $(VENV)/constraints.lock
lock:
	test -x $(BIN)/uv || { $(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install -q --upgrade pip uv; }
	cp constraints.txt $(LOCK_TMP)
	$(BIN)/uv pip compile pyproject.toml --all-extras --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
		--no-emit-package torch --no-header --no-annotate -q $(if $(filter 1,$(UPGRADE)),--upgrade,$(if $(UPGRADE),--upgrade-package $(UPGRADE))) \
		-o $(LOCK_TMP)
	{ sed -n '1,/^# Regenerate/p' constraints.txt; grep -Ev '^(nvidia-|triton==|cuda-)' $(LOCK_TMP); } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -f $(LOCK_TMP)
	@git diff --stat -- constraints.txt 2>/dev/null || true

# the tests' Azure Blob server (az:// workspaces); the demo does not need Node.js
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob
$(AZURITE): Makefile
	@command -v npm >/dev/null || { echo "make test: npm (Node.js >= 18) is needed for Azurite, the Azure Blob server the az:// tests run against: apt install nodejs npm"; exit 1; }
	npm install --prefix $(VENV)/azurite --no-audit --no-fund --silent azurite@$(AZURITE_VERSION)
	touch $(AZURITE)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/xylent run pipeline --spec data_specs/demo.yaml

# two xdist workers in lanes (tests/conftest.py): the tests that rerun stages on the session demo on one, every
# other module, whole, on whichever is free (those that only read the demo last); one pytest process is half
# as busy on 2 cores (DeepSpeed's ranks, servers and CLI starts wait)
TEST_WORKERS ?= 2
TEST_LANES := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
test: $(STAMP) $(AZURITE)
	$(BIN)/python -m pytest -q $(TEST_LANES) --cost-guard=strict

# `pip install .` (not editable) into a fresh venv, then the demo from outside the checkout: a module or data file
# the install leaves out fails here (CI runs it after make test; tests/test_install.py is its fast form)
install-check:
	bash .ci/install-check "$(TORCH_SPEC)"

# the inner loop: no DeepSpeed launch, CLI subprocess, server or session demo (tests/cost_guard.py marks them slow)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(TEST_LANES) -m "not slow"

# the claims that need full-size training (docs/acceptance.md, ~2 h 20 min on this host's 2 cores, alone): each passing claim
# rewrites tests/acceptance/results/<claim>.json; commit them, or `make test` reports them stale.
# XYLENT_ACCEPTANCE_KEEP=DIR keeps the long claims' workspaces in DIR: a rerun resumes a run cut short
acceptance: $(STAMP)
	$(BIN)/python -m pytest -q --acceptance --timeout=7200 tests/acceptance; rc=$$?; \
		$(BIN)/python -m tests.acceptance.claims --render; exit $$rc

# after a refactor of code the claims hash: the base tree (each stale result's commit) and this one train the same
# short workloads and must leave the same bits; then the results stand for this tree, figures kept (docs/acceptance.md,
# minutes instead of hours).  REPLAY_ARGS=--check compares and writes nothing; --steps N, --work DIR, --base COMMIT
replay: $(STAMP)
	$(BIN)/python -m tests.acceptance.replay $(REPLAY_ARGS)

# every pretraining recipe of the family on the demo corpus, once per seed (each seed its own
# vocabulary, sampling order and initial weights), evaluated beside random-init and bag-of-subwords,
# then one table with every claim's paired difference over the seeds: docs/recipes-scorecard.md
# (~34 min per seed on 2 CPU cores, measured 2026-11-28).  MetaXLM per seed: phase 1 registered under a name
# per seed, phase 2 started from it, and phase 2 from a random init as its peer (docs/recipes-scorecard-metaxlm.md;
# the compare's --set names the phase-1 model each seed's phase 2 ran with).  `make recipes SEEDS=0` for one seed.
RECIPES := electra mlm infoxlm infoxlm-mixup veco electra-mrtd-only electra-en-x
SEEDS ?= 0 1 2
CLAIMS := infoxlm:mlm infoxlm-mixup:infoxlm electra:electra-mrtd-only electra:electra-en-x
recipes: $(STAMP)
	for s in $(SEEDS); do for r in $(RECIPES); do \
		$(BIN)/xylent run evaluate --spec data_specs/recipes/$$r.yaml --set seed=$$s || exit 1; done; done
	for s in $(SEEDS); do \
		$(BIN)/xylent run pretrain --spec data_specs/recipes/metaxlm-phase1.yaml --set seed=$$s \
			--set pretrain.register_name=xylent-metaxlm-phase1-seed$$s || exit 1; \
		$(BIN)/xylent run evaluate --spec data_specs/recipes/metaxlm-phase2.yaml --set seed=$$s \
			--set pretrain.init.from=models:/xylent-metaxlm-phase1-seed$$s/latest || exit 1; \
		$(BIN)/xylent run evaluate --spec data_specs/recipes/metaxlm-scratch.yaml --set seed=$$s || exit 1; done
	$(BIN)/xylent compare $(foreach r,$(RECIPES),--spec data_specs/recipes/$(r).yaml) --seeds $(SEEDS) \
		$(foreach c,$(CLAIMS),--claim $(c)) --out docs/recipes-scorecard.md
	$(BIN)/xylent compare --spec data_specs/recipes/metaxlm-scratch.yaml --spec data_specs/recipes/metaxlm-phase2.yaml \
		--set 'pretrain.init.from=models:/xylent-metaxlm-phase1-seed{seed}/latest' --seeds $(SEEDS) \
		--claim metaxlm-phase2:metaxlm-scratch --out docs/recipes-scorecard-metaxlm.md

# every benchmark at full size (about an hour on 2 cores; run it on a quiet machine), then the
# measured parts of docs/records/benchmarks.md are rewritten from benchmarks/results/*.json.
# `make bench QUICK=1`: the smoke sizes (results and a rendered doc under benchmarks/results/quick/).
BENCH := prepare_throughput dedup vocab sampling shards scaling cluster pretrain evaluate audit finetune overhead
bench: $(STAMP)
	for b in $(BENCH); do $(BIN)/python benchmarks/$$b.py $(if $(QUICK),--quick) || exit 1; done
	$(BIN)/python benchmarks/render.py $(if $(QUICK),--results benchmarks/results/quick \
		--template docs/records/benchmarks.md --doc benchmarks/results/quick/benchmarks.md)

benchmarks: bench

# what the GPU check needs on a lent GPU machine (issue 37): DeepSpeed and pydantic as wheels for its
# Python 3.12, the data stages of data_specs/gpu-check.yaml (built here first: ~3 min on 2 cores; 37.8 MiB in all);
# then, there, in one command: benchmarks/gpu_check.sh OUT (docs/records/benchmarks.md, "The GPU check")
gpu-bundle: $(STAMP)
	$(BIN)/python benchmarks/gpu_bundle.py

# the team stack (infra/README.md), its images built with this checkout's commit, which every run records
COMPOSE := docker compose -f infra/docker/docker-compose.yml
compose-up:
	XYLENT_GIT_COMMIT=$$(git rev-parse HEAD) $(COMPOSE) up -d --build

compose-up-gpu:
	XYLENT_GIT_COMMIT=$$(git rev-parse HEAD) $(COMPOSE) -f infra/docker/docker-compose.gpu.yml up -d --build

clean-demo:
	rm -rf workspace
