# The two commands of the quick start: `make demo` and `make test`. Each sets up what it needs first.
.PHONY: setup demo test lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/coordl demo
	.venv/bin/dsanalyzer demo

# Fast suite by default; slow tests too when CI=true (as in .ci/run) or COORDL_SLOW=1.
# The tests also cover coordl.dali on DALI's CPU backend: the `dali` extra is installed for them
# (not for the demo or the core install); `s3` (boto3) for s3:// sources, whose tests start a moto server.
test: setup
	@COORDL_EXTRAS=dev,nfs,dali,s3 bash scripts/setup.sh
	@bash scripts/test.sh

lint: setup
	.venv/bin/ruff check .

bench: setup
	COORDL_EXTRAS=dev,nfs,dali,s3 bash scripts/setup.sh
	@echo "Each benchmark is one command; see benchmarks/README.md"

clean:
	rm -rf .venv .pytest_cache .ruff_cache reports/runs
