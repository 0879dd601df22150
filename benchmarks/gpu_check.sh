#!/usr/bin/env bash
# The GPU check in one command (docs/gpu.md, "The GPU check"), on a GPU machine with its own torch:
# installs the cp312 wheels prepared in .gpu/wheels beside that torch (seconds, offline), then runs
# benchmarks/gpu_check.py, whose steps each have their own limit (9 minutes in all on one H100).
# Prepare .gpu here first: bash benchmarks/gpu_check_prepare.sh
#
#   bash benchmarks/gpu_check.sh OUT_DIR [--dry-run] [gpu_check.py flags]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in -h|--help) sed -n 2,7p "$0"; exit 0 ;; "") sed -n 7p "$0" >&2; exit 2 ;; esac
OUT="$1"
shift
PY=python3
if [[ " $* " != *" --dry-run "* ]]; then
  # into that machine's own Python, so that fairseq-train and fairseq-generate land beside it (the
  # tests and the scoring find them there); the repository itself on PYTHONPATH
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$ROOT"/.gpu/wheels/*.whl || exit 1
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  PY="${PYTHON:-$ROOT/.venv/bin/python}"
fi
export PYTHONUNBUFFERED=1
exec "$PY" "$ROOT/benchmarks/gpu_check.py" "$OUT" "$@"
