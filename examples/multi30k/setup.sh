#!/usr/bin/env bash
# Sourced by the Multi30k recipes (needs ROOT, VENV, WORK; DATA_DIR optional; arguments go to
# prepare.py): installs the package into $VENV if needed, prepares the data in $WORK/data, sets
# PY, and keeps freed memory in the process instead of returning it to the OS after every large
# tensor (docs/benchmarks.md, "The allocator", says what it gains). Run on its own, it says so.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  source "$(cd "$(dirname "$0")/.." && pwd)/args.sh"
  help_asked "$@" && { usage "$0"; exit 0; }
  die "examples/multi30k/setup.sh is sourced by the Multi30k recipes (examples/multi30k/quickstart.sh), not run"
fi
VENV="$VENV" bash "$ROOT/examples/setup_venv.sh"
PY="$VENV/bin/python"
"$PY" "$ROOT/examples/multi30k/prepare.py" --work-dir "$WORK/data" ${DATA_DIR:+--data-dir "$DATA_DIR"} "$@"
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1000000000}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-1000000000}"
