#!/usr/bin/env bash
# The comparison of docs/results.md: the stock pre-norm Transformer and every wide architecture
# on Multi30k En->De, each trained for the same number of updates at every seed, decoded with the
# same beam; training speed measured side by side in one process; table of params, MACs, BLEU
# (mean ± sd over the seeds), training tokens/s, utilisation, decoding speed and wall time, and the
# BLEU-vs-MACs figure.
#
#   bash examples/compare/multi30k.sh [--max-update N (1320)] [--seeds 1,2] [--minutes M] [--work-dir DIR]
#                                     [--data-dir DIR] [--results FILE] [--throughput JSON] [--figure PNG] [--systems a,b,...]
#                                     [--device cpu|cuda] [--jobs N]
#
# One run per system and seed (docs/results.md gives each run's wall time; python -m
# fairseq_widearch.experiments.compare). Running it again skips the runs --results holds and
# resumes an interrupted training.
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
    --max-update|--jobs) need_whole "$1" "${2-}" 1; ARGS+=("$1" "$2"); shift 2 ;;
    --minutes) need_positive "$1" "${2-}"; ARGS+=("$1" "$2"); shift 2 ;;
    --device) need_one_of "$1" "${2-}" cpu cuda; ARGS+=("$1" "$2"); shift 2 ;;
    --seeds|--results|--throughput|--figure|--systems) need_value "$1" "${2-}"; ARGS+=("$1" "$2"); shift 2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

source "$ROOT/examples/multi30k/setup.sh"

"$PY" -m fairseq_widearch.experiments.compare --data "$WORK/data/bin" --bpe-codes "$WORK/data/bpe/codes" \
  --ref "$WORK/data/test.ref.de" --work-dir "$WORK/compare" "${ARGS[@]}"
