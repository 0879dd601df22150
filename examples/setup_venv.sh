#!/usr/bin/env bash
# Create the virtualenv ($VENV, default ./.venv) if absent and install fairseq-widearch into it
# with its test and example extras. torch's pinned CPU build goes first: an unpinned torch (asked
# for by fairseq) could otherwise pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "| creating virtualenv $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import fairseq_widearch, pytest, sacremoses, subword_nmt, sacrebleu" 2>/dev/null; then
  echo "| installing torch (CPU build) and fairseq-widearch[test] into $VENV"
  "$VENV/bin/python" -m pip install -q torch==2.13.0
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
fi
