#!/usr/bin/env bash
# Scalable Transformers on Multi30k En->De on CPU: the three training stages of Gao et al. (2021),
# BLEU per width after each stage (the paper's Table 2 in miniature), and two exported widths.
#
#   bash examples/scalable_transformer/multi30k.sh [--minutes "M1 M2 M3" ("25 15 15")] [--anneal-updates N (100)]
#                                                  [--work-dir DIR] [--data-dir DIR]
#
# Model: scalable_transformer_multi30k (M_max = 256, widths 64/128/192/256, 3 + 3 layers).
# Each update trains the widest, the narrowest and one random width (scalable_translation).
# 1. stage 1 (Eq. 6) from scratch; 2. stage 2 (Eq. 7, λ2 annealed over --anneal-updates);
# 3. the stage-2 model decodes the training set (beam 4, lenpen 0.6) and stage 3 (Eq. 9, λ3 0.9)
#    trains on its outputs. Every stage restarts Adam and the warm-up from 5e-4 (Appendix A).
#    --minutes gives each stage's training minutes; running the script again resumes.
# 4. every width is scored on test_2016 with beam 4, lenpen 0.6 (sacreBLEU); widths 64 and 128
#    of the final model are exported with export_subnet and scored again.
# Scores go to $WORK/scalable/bleu.jsonl.
#
# VENV: the virtualenv to use, made if absent (default ./.venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
DATA_DIR="${MULTI30K_DIR:-}"
MINUTES=(25 15 15)
ANNEAL=100
WORK="$ROOT/runs/multi30k"
VENV="${VENV:-$ROOT/.venv}"
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) need_value "$1" "${2-}"; read -r -a MINUTES <<< "$2"
      [ "${#MINUTES[@]}" = 3 ] || die "argument --minutes: takes three numbers above 0, got '$2'"
      for m in "${MINUTES[@]}"; do need_positive "$1" "$m"; done
      shift 2 ;;
    --anneal-updates) need_whole "$1" "${2-}" 1; ANNEAL="$2"; shift 2 ;;
    --work-dir) need_value "$1" "${2-}"; WORK="$2"; shift 2 ;;
    --data-dir) need_dir "$1" "${2-}"; DATA_DIR="$2"; shift 2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

source "$ROOT/examples/multi30k/setup.sh"

OUT="$WORK/scalable"
mkdir -p "$OUT"
SCORES="$OUT/bleu.jsonl"
WIDTHS=64,128,192,256

train_stage() {  # stage cumulative-minutes data save-dir [extra flags]
  local stage=$1 minutes=$2 data=$3 save=$4
  shift 4
  echo "| stage $stage: until $minutes minutes of training in all stages -> $save"
  "$VENV/bin/fairseq-train" "$data" --user-dir "$ROOT/fairseq_widearch" --arch scalable_transformer_multi30k \
    --task scalable_translation --criterion scalable_self_distillation --distill-stage "$stage" \
    --label-smoothing 0.1 --cpu --num-workers 0 --seed 1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.002 --lr-scheduler inverse_sqrt \
    --warmup-updates 200 --warmup-init-lr 0.0005 --max-tokens 4096 --max-epoch 1000 \
    --stop-time-hours "$("$PY" -c "print($minutes / 60)")" --save-dir "$save" --no-epoch-checkpoints \
    --log-format simple --log-interval 50 "$@"
}

score() {  # label checkpoint widths
  "$PY" "$ROOT/examples/scalable_transformer/score_widths.py" --data "$WORK/data/bin" --checkpoint "$2" \
    --widths "$3" --bpe-codes "$WORK/data/bpe/codes" --ref "$WORK/data/test.ref.de" --label "$1" --json "$SCORES"
}

# fairseq's --stop-time-hours counts the training time of the checkpoint a run starts from, so the
# stages stop at cumulative times. --finetune-from-model starts a stage from the previous one with a
# fresh optimizer, schedule and data iterator, and lets an interrupted stage resume from its own
# checkpoint_last.pt when the command is run again.
STOP1=${MINUTES[0]}
STOP2=$((STOP1 + MINUTES[1]))
STOP3=$((STOP2 + MINUTES[2]))
train_stage 1 "$STOP1" "$WORK/data/bin" "$OUT/stage1"
score "stage 1" "$OUT/stage1/checkpoint_last.pt" "$WIDTHS"

train_stage 2 "$STOP2" "$WORK/data/bin" "$OUT/stage2" --lambda2-anneal-updates "$ANNEAL" \
  --finetune-from-model "$OUT/stage1/checkpoint_last.pt"
score "stage 1+2" "$OUT/stage2/checkpoint_last.pt" "$WIDTHS"

echo "| stage-3 targets: the stage-2 model decodes the training set"
[ -e "$OUT/distilled/train.en-de.de.bin" ] || "$PY" "$ROOT/examples/scalable_transformer/distillation_targets.py" \
  --data "$WORK/data/bin" --checkpoint "$OUT/stage2/checkpoint_last.pt" --out "$OUT/distilled"
train_stage 3 "$STOP3" "$OUT/distilled" "$OUT/stage3" --lambda3 0.9 \
  --finetune-from-model "$OUT/stage2/checkpoint_last.pt"
score "stage 1+2+3" "$OUT/stage3/checkpoint_last.pt" "$WIDTHS"

for width in 64 128; do
  "$PY" -m fairseq_widearch.cli.export_subnet --checkpoint "$OUT/stage3/checkpoint_last.pt" --width "$width" \
    --out "$OUT/export_$width.pt"
  score "stage 1+2+3, exported $width" "$OUT/export_$width.pt" exported
done
