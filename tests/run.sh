#!/usr/bin/env bash
# The test suite: sets up ./.venv if needed (examples/setup_venv.sh), then runs pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/examples/setup_venv.sh"
cd "$ROOT"
exec "${VENV:-$ROOT/.venv}/bin/python" -m pytest tests -q "$@"
