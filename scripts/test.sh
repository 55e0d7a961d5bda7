#!/usr/bin/env bash
# Lint, then the test suite. Slow tests run when CI=true or COORDL_SLOW=1.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
args=(-q -ra)
if [ "${CI:-}" = "true" ] || [ "${COORDL_SLOW:-0}" = "1" ]; then
  export COORDL_SLOW=1
else
  args+=(-m "not slow")
fi
exec .venv/bin/python -m pytest "${args[@]}" "$@"
