#!/usr/bin/env bash
# The test suite: sets up ./.venv if needed (examples/setup_venv.sh), then runs pytest with one
# pytest-xdist worker per core (each test file on one worker, so that its module fixtures are built
# once; the longest files first, in the order tests/conftest.py gives), each worker's torch on one thread unless OMP_NUM_THREADS says otherwise, each test stopped
# after 15 minutes (pytest-timeout: a hung run in the test's process fails it). Later arguments win:
# `-n 0` runs in this process, one test after another.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/examples/setup_venv.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "${VENV:-$ROOT/.venv}/bin/python" -m pytest tests -q -n auto --dist loadfile --no-loadscope-reorder --timeout 900 --durations 30 "$@"
