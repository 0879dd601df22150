#!/usr/bin/env bash
# Each paper's central claim in miniature on Multi30k En->De, every system trained to convergence
# (docs/claims.md). Prepares the quick start's data, then runs the claims study (python -m
# fairseq_widearch.experiments.study, the claims in fairseq_widearch/experiments/claims.py): each
# run is independent and resumable, finished runs are skipped, so the study can run in parts.
#
#   bash examples/claims/multi30k.sh [--claims multipath,widenet,scalable,latent_depth,partialformer]
#        [--jobs N] [--device cpu|cuda] [--work-dir DIR] [--data-dir DIR] [--results FILE] [--figures DIR]
#        [--progress]
#
# VENV: the virtualenv to use, made if absent (default ./.venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
DATA_DIR="${MULTI30K_DIR:-}"
WORK="$ROOT/runs/multi30k"
VENV="${VENV:-$ROOT/.venv}"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) need_dir "$1" "${2-}"; DATA_DIR="$2"; shift 2 ;;
    --work-dir) need_value "$1" "${2-}"; WORK="$2"; shift 2 ;;
    --jobs) need_whole "$1" "${2-}" 1; ARGS+=("$1" "$2"); shift 2 ;;
    --device) need_one_of "$1" "${2-}" cpu cuda; ARGS+=("$1" "$2"); shift 2 ;;
    --claims|--results|--figures) need_value "$1" "${2-}"; ARGS+=("$1" "$2"); shift 2 ;;
    --progress) ARGS+=("$1"); shift ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

source "$ROOT/examples/multi30k/setup.sh"

"$PY" -m fairseq_widearch.experiments.study --data "$WORK/data/bin" --bpe-codes "$WORK/data/bpe/codes" \
  --ref "$WORK/data/test.ref.de" --work-dir "$WORK/claims" "${ARGS[@]}"
