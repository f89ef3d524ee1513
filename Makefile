# Two commands from a fresh clone: `make train` and `make test`. Each installs what it needs
# into the active Python environment (a venv or conda env of yours is respected).
PYTHON ?= python3
DATASET ?= fashion_mnist
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install lock data train test test-fast test-gpu lint bench bench-gpu bench-data bench-inference bench-pipeline bench-ps bench-recovery lean clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

.installed: requirements/dev.txt
	PYTHON=$(PYTHON) bash scripts/install.sh dev
	@touch $@

install: .installed  ## the locked dev environment: scripts/install.sh (again when the lock changes)

lock:  ## refresh requirements/*.txt from pyproject.toml with uv (ARGS=--upgrade: newest allowed)
	$(PYTHON) scripts/lock.py $(ARGS)

data: .installed  ## fetch DATASET (default fashion_mnist) into ./data; offline: Debian's package
	$(PYTHON) -m litforge.data_tools fetch $(DATASET) --apt

train: .installed  ## python train.py $(ARGS), e.g. make train ARGS="model.optimizer.lr=0.01"
	$(PYTHON) train.py $(ARGS)

test: .installed  ## the whole test suite (real-data tests skip, saying why, without the data)
	$(PYTHON) -m pytest

test-fast: .installed  ## the tests not marked slow
	$(PYTHON) -m pytest -m "not slow"

test-gpu: .installed  ## the tests marked gpu, in one process (each skips, saying why, without CUDA)
	$(PYTHON) -m pytest -m gpu -n 0

lint: .installed  ## ruff and file hygiene through pre-commit
	pre-commit run --all-files

bench: .installed  ## s/epoch on 3 workloads and the fixed cost: the template against plain PyTorch
	$(PYTHON) benchmarks/epoch_time.py

bench-gpu: .installed  ## on a GPU (else a short CPU run): s/epoch, host syncs, a whole run (benchmarks/gpu.py)
	$(PYTHON) benchmarks/gpu.py $(ARGS)

bench-data: .installed  ## images per second from image files to batches: torchvision vs the datamodules
	$(PYTHON) benchmarks/data_loading.py

bench-inference: .installed  ## CPU latency/throughput: eager, compiled, pt2, onnxruntime; serve.py req/s
	$(PYTHON) benchmarks/inference.py

bench-pipeline: .installed  ## ms per training step against pipeline stages and microbatches
	$(PYTHON) benchmarks/pipeline.py

bench-ps: .installed  ## samples/s of DDP and parameter servers (sync, async) with and without a straggler
	$(PYTHON) benchmarks/parameter_server.py

bench-recovery: .installed  ## torchrun: seconds from a killed or hung worker to the resumed job's first step
	$(PYTHON) benchmarks/recovery.py

lean:  ## a copy without the features not kept: make lean DEST=../myproject [KEEP="lean sweeps"]
	@test -n "$(DEST)" || { echo 'usage: make lean DEST=../myproject [KEEP="lean sweeps"]'; exit 2; }
	$(PYTHON) scripts/lean.py "$(DEST)" $(foreach feature,$(KEEP),--keep $(feature))

clean:  ## remove run outputs (logs/) and caches; keeps data/
	rm -rf logs outputs multirun .pytest_cache .ruff_cache
