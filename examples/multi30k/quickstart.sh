#!/usr/bin/env bash
# Quick start: train and evaluate a wide Transformer on Multi30k English->German on CPU.
#
#   bash examples/multi30k/quickstart.sh [--data-dir DIR] [--updates N] [--minutes M] [--arch ARCH]
#                                        [--work-dir WORK (runs/multi30k)] [-- extra fairseq-train flags]
#
# 1. creates ./.venv if absent and installs the package (torch CPU build first);
# 2. prepares the data (sacremoses, subword-nmt joint BPE, fairseq-preprocess --joined-dictionary)
#    from --data-dir DIR or $MULTI30K_DIR, else from the public release, downloaded into WORK/data/raw;
# 3. trains ARCH (default multipath_transformer_multi30k) with stock fairseq-train for N updates
#    (default 1320, 10 epochs: a budget in updates gives the documented result on a busy or an
#    idle machine), stopping earlier only at M minutes (default 60), which it then reports;
# 4. decodes test_2016 with beam search via fairseq-generate and prints sacreBLEU + signature.
#
# VENV: the virtualenv to use, made if absent (default ./.venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
DATA_DIR="${MULTI30K_DIR:-}"
UPDATES=1320
MINUTES=60
ARCH=multipath_transformer_multi30k
WORK="$ROOT/runs/multi30k"
VENV="${VENV:-$ROOT/.venv}"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) need_dir "$1" "${2-}"; DATA_DIR="$2"; shift 2 ;;
    --updates) need_whole "$1" "${2-}" 1; UPDATES="$2"; shift 2 ;;
    # fairseq-train reads --stop-time-hours 0 (or less) as "no limit": a positive number
    --minutes) need_positive "$1" "${2-}"; MINUTES="$2"; shift 2 ;;
    --arch) need_value "$1" "${2-}"; ARCH="$2"; shift 2 ;;
    --work-dir) need_value "$1" "${2-}"; WORK="$2"; shift 2 ;;
    --) shift; EXTRA=("$@"); set --; break ;;  # the rest is fairseq-train's, not setup.sh's
    *) die "unknown option $1 (see --help)" ;;
  esac
done

source "$ROOT/examples/multi30k/setup.sh"

SAVE="$WORK/checkpoints/$ARCH"
mkdir -p "$SAVE"
STOP_HOURS=$("$PY" -c "print($MINUTES / 60)")
# the criterion that adds the arch's auxiliary losses (WideNet, latent depth), else label-smoothed CE
if ! CRITERION=$("$PY" -m fairseq_widearch.experiments.settings criterion "$ARCH" 2> "$WORK/settings.log"); then
  tail -n 1 "$WORK/settings.log" >&2
  exit 2
fi
mapfile -t OPTIMISATION < <("$PY" -m fairseq_widearch.experiments.settings quickstart)
echo "| training $ARCH for $UPDATES updates (at most $MINUTES minutes)"
"$VENV/bin/fairseq-train" "$WORK/data/bin" --user-dir "$ROOT/fairseq_widearch" \
  --arch "$ARCH" --cpu --num-workers 0 --seed 1 "${OPTIMISATION[@]}" --criterion "$CRITERION" \
  --max-update "$UPDATES" --stop-time-hours "$STOP_HOURS" --max-epoch 1000 \
  --save-dir "$SAVE" --no-epoch-checkpoints --best-checkpoint-metric loss \
  --log-format simple --log-interval 50 "${EXTRA[@]}" | tee "$WORK/train-$ARCH.log"
if grep -q "Stopping training due to cumulative_training_time" "$WORK/train-$ARCH.log"; then
  TRAINED=$(grep -o "num_updates [0-9]*" "$WORK/train-$ARCH.log" | tail -n 1 | cut -d' ' -f2)
  echo "| warning: --minutes $MINUTES cut training short at $TRAINED of $UPDATES updates" >&2
fi

echo "| decoding test_2016 with beam 5"
# fairseq-generate's own log (including its warning that *its* BLEU is on BPE tokens) goes to a
# file, so that the last lines printed are sacreBLEU's, on detokenized output
if ! "$VENV/bin/fairseq-generate" "$WORK/data/bin" --user-dir "$ROOT/fairseq_widearch" \
  --path "$SAVE/checkpoint_best.pt" --gen-subset test --cpu --beam 5 --lenpen 1.0 --batch-size 128 \
  --tokenizer moses --source-lang en --target-lang de \
  --bpe subword_nmt --bpe-codes "$WORK/data/bpe/codes" > "$WORK/generate-$ARCH.txt" 2> "$WORK/generate-$ARCH.log"
then
  tail -n 20 "$WORK/generate-$ARCH.log" >&2
  exit 1
fi
echo "| fairseq-generate output: $WORK/generate-$ARCH.txt (its log: $WORK/generate-$ARCH.log)"
"$PY" -m fairseq_widearch.experiments.scoring "$WORK/generate-$ARCH.txt" "$WORK/data/test.ref.de"
