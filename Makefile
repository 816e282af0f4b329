# make demo   install if needed, then the CPU seed grid end to end: sweep, eval, report, compare
# make test   install if needed, then run the test suite (less the cluster tests: make test-cluster)
# make test-cluster  the tests that start a Slurm cluster or two nodes in network namespaces (CI runs them)
# make bench  install if needed, then run the benchmarks and print their ratios (every one, even after a failure)
# make bench-quick  every benchmark once at tiny sizes (CI: a benchmark that breaks fails; ratios not judged)
# make bench-scale  the store at scale: commands on stores of 1M and 10M samples (builds them: ~10 min)
# make lint   install if needed, then ruff: the lint rules and the formatting (pyproject.toml [tool.ruff])
# make e2e    install .venv-e2e if needed, then verl's whole loop with vLLM's CPU build (tests/e2e, ~17 min on 2 cores)
# make gpu-check  on a GPU node: verl's worker path on one CUDA GPU and the local backend there (skips without one)
# make install  (re)create .venv with the package and its dev/test extras

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The torch build installed before the package when no GPU is present (CPU wheel of that release).
TORCH_CPU ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# the trackers (W&B, TensorBoard, MLflow) add ~15 s to an install that has verl: in, so their tests run in CI;
# the PostgreSQL driver (a few seconds) likewise, for the store's tests against a real server
EXTRAS ?= dev,verl,trackers,postgres

.PHONY: install test test-cluster demo bench bench-quick bench-scale lint e2e gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "GPU found: torch comes with the package's own requirements"; \
	else \
		echo "no GPU: installing the CPU build of torch first ($(TORCH_CPU))"; \
		$(PIP) install -q "$(TORCH_CPU)"; \
	fi
	$(PIP) install -q -e ".[$(EXTRAS)]" -c constraints.txt
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not cluster"

# the tests that start a Slurm cluster (one node, and two in network namespaces), a two-node Ray cluster, or a
# local Ray head for a whole run or evaluation (make test stays near 6 minutes); each skips in one line where it
# cannot (no Slurm, not root); CI runs them beside `make test`
test-cluster: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m cluster

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The seed grid (3 methods x 3 seeds): a first table with intervals and a verdict. experiments/smoke.yaml
# (every algorithm, one seed) is the longer tour: rpg sweep experiments/smoke.yaml.
demo: $(STAMP)
	$(VENV)/bin/rpg prepare-data --toy
	$(VENV)/bin/rpg sweep experiments/smoke-seeds.yaml
	$(VENV)/bin/rpg eval smoke-seeds --local -b data/toy/val.parquet
	$(VENV)/bin/rpg report --table --sweep smoke-seeds
	$(VENV)/bin/rpg compare GRPO RPG-REINFORCE-URKL --sweep smoke-seeds

# Every benchmark runs even when one before it fails; the failed ones are named at the end (exit status 1).
# bench_scale.py builds stores for minutes: its own target (bench-scale), and a quick run in bench-quick.
BENCHES       = $(filter-out benchmarks/bench_scale.py,$(sort $(wildcard benchmarks/bench_*.py)))
# TRL only on bench_local.py's path (TRL_DIR): installed in .venv, TRL 1.16 breaks verl 0.9.1's FSDP workers (verl's
# monkey_patch.py imports AutoModelForCausalLMWithValueHead whenever trl is importable; TRL 1.16 has none)
TRL_DIR       = $(VENV)/trl
RUN_BENCHES   = failed=""; for f in $(1); do echo "== $$f"; \
	case $$f in *bench_local.py) trl="PYTHONPATH=$(TRL_DIR)";; *) trl="";; esac; \
	env $$trl $(2) $(PY) $$f || failed="$$failed $$f"; done; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed"; exit 1; fi

bench: $(STAMP) $(VENV)/.bench-installed
	@$(call RUN_BENCHES,$(BENCHES),)

bench-quick: $(STAMP) $(VENV)/.bench-installed
	@$(call RUN_BENCHES,$(sort $(wildcard benchmarks/bench_*.py)),BENCH_QUICK=1)

bench-scale: $(STAMP)
	@$(call RUN_BENCHES,benchmarks/bench_scale.py,)

# What only a GPU shows (benchmarks/gpu_check.py): verl's FSDP workers with rpg's plugin on CUDA, NCCL and bf16,
# memory measured beside the estimator's figure; the local backend on CUDA. One line and exit 0 without a GPU.
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py

# TRL only for the local trainer's comparison benchmark, beside .venv (TRL_DIR above); its dependencies are verl's
$(VENV)/.bench-installed: $(STAMP)
	$(PIP) uninstall -q -y trl 2>/dev/null || true
	$(PIP) install -q --no-deps --target $(TRL_DIR) -c constraints.txt "trl>=1.16"
	touch $@

# The real verl loop on a CPU (README: "The full verl loop on a CPU"): its own environment, every package pinned
# in tests/e2e/requirements.txt (PyPI only) and installed without a resolver; one process at a time (9-14 GiB).
E2E_VENV  := .venv-e2e
E2E_PY    := $(E2E_VENV)/bin/python
E2E_STAMP := $(E2E_VENV)/.installed

$(E2E_STAMP): pyproject.toml requirements/shared.txt tests/e2e/requirements.txt Makefile
	test -x $(E2E_PY) || $(PYTHON) -m venv $(E2E_VENV)
	$(E2E_PY) -m pip install -q --no-deps -r tests/e2e/requirements.txt
	$(E2E_PY) -m pip install -q --no-deps -e .
	touch $(E2E_STAMP)

# a test's timeout counts its fixtures' setup: a sweep there may take run_rpg's 900 s (tests/e2e/conftest.py)
e2e: $(E2E_STAMP)
	RPG_E2E=1 $(E2E_PY) -m pytest -q -p no:cacheprovider -o timeout=1500 tests/e2e

clean:
	rm -rf $(VENV) $(E2E_VENV) .pytest_cache
