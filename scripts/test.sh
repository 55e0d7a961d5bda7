#!/usr/bin/env bash
# Lint, format check and type check (seconds; any failure ends the run), then the test suite.
# Slow tests run when CI=true or COORDL_SLOW=1.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy   # its files and level are in pyproject.toml's [tool.mypy]
args=(-q -ra)
if [ "${CI:-}" = "true" ] || [ "${COORDL_SLOW:-0}" = "1" ]; then
  export COORDL_SLOW=1
else
  args+=(-m "not slow")
fi
exec .venv/bin/python -m pytest "${args[@]}" "$@"
