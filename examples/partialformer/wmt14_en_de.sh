#!/usr/bin/env bash
# PartialFormer on WMT14 En->De (GPU recipe) with Table 12's settings. Data: fairseq's
# examples/translation/prepare-wmt14en2de.sh (32K joint BPE) + `fairseq-preprocess
# --joined-dictionary` (Table 11: 34,040 types), then
#
#   ARCH=partialformer_24_6_d360_h30_16 bash examples/partialformer/wmt14_en_de.sh DATA_BIN [extra flags]
#
# Table 12 (En-De): 8 GPUs x 4096 tokens, update frequency 2, Adam (0.9, 0.997), lr 0.002,
# inverse sqrt from 1e-7 with 16,000 warmup updates, 50K updates, no weight decay, label smoothing
# 0.1, dropout / attention dropout / ReLU dropout 0.1 (the presets' defaults). Evaluation as in the
# paper: the last 10 checkpoints averaged, beam 4, length penalty 0.6.
# examples/translation/prepare-wmt14en2de.sh is in fairseq's source repository
# (https://github.com/facebookresearch/fairseq/tree/main/examples/translation), not in the installed
# wheel: fetch it from there. By default it prepares WMT'17 training data (newstest2014 as test);
# its --icml17 option gives the WMT'14 data of Vaswani et al., which the papers' tables use.
#
# SAVE: the checkpoints' directory (default checkpoints/$ARCH).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # runs from any directory
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
[ $# -gt 0 ] || die "argument DATA_BIN: missing (see --help)"
need_dir DATA_BIN "$1"
DATA="$1"; shift
ARCH="${ARCH:-partialformer_24_6_d360_h30_16}"
SAVE="${SAVE:-checkpoints/$ARCH}"
fairseq-train "$DATA" --user-dir "$ROOT/fairseq_widearch" --arch "$ARCH" \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.997)' --lr 0.002 --lr-scheduler inverse_sqrt \
  --warmup-updates 16000 --warmup-init-lr 1e-7 --weight-decay 0.0 \
  --max-tokens 4096 --update-freq 2 --max-update 50000 \
  --save-dir "$SAVE" --save-interval-updates 1000 --keep-interval-updates 10 --fp16 "$@"
python -m fairseq_widearch.cli.average_checkpoints --inputs "$SAVE" --num-update-checkpoints 10 \
  --out "$SAVE/checkpoint_avg10.pt"
fairseq-generate "$DATA" --user-dir "$ROOT/fairseq_widearch" --path "$SAVE/checkpoint_avg10.pt" \
  --beam 4 --lenpen 0.6 --remove-bpe --batch-size 128 --gen-subset test > "$SAVE/generate-test.txt"
tail -1 "$SAVE/generate-test.txt"  # fairseq's BLEU line (tokenized, as in the WMT14 literature)
