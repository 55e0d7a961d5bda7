# The two commands of the quick start: `make demo` and `make test`. Each sets up what it needs first.
.PHONY: setup demo test lint bench clean gpu-wheels gpu-check

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/coordl demo
	.venv/bin/dsanalyzer demo

# Fast suite by default; slow tests too when CI=true (as in .ci/run) or COORDL_SLOW=1.
# The tests also cover coordl.dali on DALI's CPU backend: the `dali` extra is installed for them
# (not for the demo or the core install); `s3` (boto3) for s3:// sources, whose tests start a moto server;
# `frameworks` (Lightning, Accelerate) for tests/coordl/frameworks; `ray` for tests/coordl/remote.
test: setup
	@COORDL_EXTRAS=dev,nfs,dali,s3,frameworks,ray bash scripts/setup.sh
	@bash scripts/test.sh

lint: setup
	.venv/bin/ruff check .

bench: setup
	COORDL_EXTRAS=dev,nfs,dali,s3,frameworks,ray,raydata bash scripts/setup.sh
	@echo "Each benchmark is one command; see benchmarks/README.md"

# The GPU proof (docs/gpu.md): `make gpu-wheels` here packs what the accelerator machine lacks into .whl/;
# `make gpu-check` there measures every GPU claim (exit 2 without CUDA); `make gpu-check DRY=1` checks its
# wiring on the CPU. Without .venv (the accelerator machine) it uses python3.
GPU_PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
gpu-wheels:
	@bash scripts/gpu_wheels.sh

gpu-check:
	$(GPU_PY) scripts/gpu_check.py $(if $(DRY),--dry-run) $(GPU_CHECK_ARGS)

clean:
	rm -rf .venv .pytest_cache .ruff_cache reports/runs
