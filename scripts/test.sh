#!/usr/bin/env bash
# Lint, format check and type check (seconds; any failure ends the run), then the test suite.
# Slow tests run when CI=true or COORDL_SLOW=1; `long` ones only with COORDL_LONG=1 (make test-long).
#
# The suite runs in two phases (docs/testing.md):
#   1. every test not marked `exclusive`, in parallel over COORDL_TEST_WORKERS pytest-xdist workers (default 4 on
#      any machine: most tests wait on processes, servers and sockets rather than compute, so even 2 cores run
#      4 at once well); each test still gets its own servers, namespaces and shared-memory names;
#   2. the tests marked `exclusive` (they measure rates or timings against a target), one at a time, with the
#      machine to themselves.
# Arguments are passed to both phases (e.g. a path: scripts/test.sh tests/shmem). COORDL_TEST_WORKERS=0 runs
# phase 1 in one process too.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode is cached (where the environment turned it off): every spawned loader worker, job and pytest worker
# otherwise compiles coordl's modules again (0.2 s of CPU a process here) and pytest rewrites every test module
# in each of its processes (8 s each). __pycache__/ is ignored by git.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m mypy   # (not .venv/bin/mypy: a moved venv breaks console-script shebangs) its files and level are in pyproject.toml's [tool.mypy]
args=(-q -ra -p no:cacheprovider)
mark=""
if [ "${CI:-}" = "true" ] || [ "${COORDL_SLOW:-0}" = "1" ]; then
  export COORDL_SLOW=1
else
  mark="not slow and "
fi
# `long` tests (the long forms of checks CI runs short: docs/testing.md) only with COORDL_LONG=1 (make test-long)
[ "${COORDL_LONG:-0}" = "1" ] || mark="${mark}not long and "
workers="${COORDL_TEST_WORKERS:-4}"
parallel=()
[ "$workers" != "0" ] && parallel=(-n "$workers" --dist worksteal)
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT

rc=0
.venv/bin/python -m pytest "${args[@]}" "${parallel[@]}" -m "${mark}not exclusive" --durations=20 \
  --junitxml="$results/parallel.xml" "$@" || rc=$?
# exit 5: nothing collected (e.g. a path with no exclusive test); any other failure stops here
if [ "$rc" = "0" ] || [ "$rc" = "5" ]; then
  rc2=0
  .venv/bin/python -m pytest "${args[@]}" -m "${mark}exclusive" --durations=10 \
    --junitxml="$results/exclusive.xml" "$@" || rc2=$?
  if [ "$rc2" != "0" ] && [ "$rc2" != "5" ]; then rc=$rc2
  elif [ "$rc" = "5" ] && [ "$rc2" = "0" ]; then rc=0
  fi
fi
# One closing line for both phases.
.venv/bin/python scripts/test_totals.py "$results"/*.xml || true
exit "$rc"
