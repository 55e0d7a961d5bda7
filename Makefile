# The two commands of the quick start: `make demo` and `make test`. Each sets up what it needs first.
.PHONY: setup demo test test-long verify-remedies lint typecheck bench clean gpu-wheels gpu-dali gpu-check wheel wheel-check soak

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/coordl demo
	.venv/bin/dsanalyzer demo

# Fast suite by default; slow tests too when CI=true (as in .ci/run) or COORDL_SLOW=1.
# The tests also cover coordl.dali on DALI's CPU backend: the `dali` extra is installed for them
# (not for the demo or the core install); `s3` (boto3) for s3:// sources, whose tests start a moto server;
# `frameworks` (Lightning, Accelerate) for tests/coordl/frameworks; `ray` for tests/coordl/remote.
test:
	@COORDL_EXTRAS=dev,nfs,dali,s3,frameworks,ray bash scripts/setup.sh
	@bash scripts/test.sh

# the long forms of checks CI runs short (docs/testing.md "Keeping CI short"): the gpu-check dry run of every
# section, the fork stress's hundreds of loaders; before a release or a device session (about 6 minutes here)
test-long:
	@COORDL_EXTRAS=dev,nfs,dali,s3,frameworks,ray bash scripts/setup.sh
	COORDL_LONG=1 COORDL_SLOW=1 .venv/bin/python -m pytest -q -ra -p no:cacheprovider -m long tests

# each coordl remedy applied for real against its what-if (minutes each, alone on the machine; not in CI)
verify-remedies: setup
	COORDL_VERIFY_REMEDIES=1 COORDL_SLOW=1 .venv/bin/python -m pytest -m exclusive tests/dsanalyzer/test_verify_coordinate.py tests/dsanalyzer/test_verify_sample_cache.py tests/dsanalyzer/test_verify_partitioned.py tests/dsanalyzer/test_verify_remote.py

# every technique at once under seeded faults (docs/reliability.md "Soak"); report in reports/soak.md
soak: setup
	.venv/bin/python benchmarks/soak/soak.py --minutes $(or $(SOAK_MINUTES),60) --seed $(or $(SOAK_SEED),1)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

# mypy over shmem, memcache, nfs_cache, coordl and dsanalyzer at the level set in pyproject.toml ([tool.mypy]).
typecheck:
	@COORDL_EXTRAS=dev,nfs,dali,s3,frameworks bash scripts/setup.sh
	.venv/bin/python -m mypy

bench:
	COORDL_EXTRAS=dev,nfs,dali,s3,frameworks,ray,raydata bash scripts/setup.sh
	@echo "Each benchmark is one command; see benchmarks/README.md"

# The wheel users install (README "Install"): `make wheel` builds dist/coordl-*.tar.gz and a manylinux wheel that
# carries its libjpeg; `make wheel-check` also installs it into a clean venv and smoke-tests it (scripts/wheel.sh;
# CI runs the same check as tests/scripts/test_wheel.py).
wheel: setup
	@bash scripts/wheel.sh build

wheel-check: setup
	@bash scripts/wheel.sh check

# The GPU proof (docs/gpu.md): `make gpu-wheels` here packs what the accelerator machine lacks into .whl/;
# `make gpu-check` there measures every GPU claim (exit 2 without CUDA); `make gpu-check DRY=1` checks its
# wiring on the CPU. Without .venv (the accelerator machine) it uses python3.
GPU_PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
gpu-wheels:
	@bash scripts/gpu_wheels.sh

# NVIDIA DALI's CUDA wheels packed in parts that each fit one device call (.dali/p*; docs/gpu.md)
gpu-dali:
	@bash scripts/gpu_dali.sh

gpu-check:
	$(GPU_PY) scripts/gpu_check.py $(if $(DRY),--dry-run) $(GPU_CHECK_ARGS)

clean:
	rm -rf .venv .pytest_cache .ruff_cache .mypy_cache reports/runs
