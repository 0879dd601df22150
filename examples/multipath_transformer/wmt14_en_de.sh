#!/usr/bin/env bash
# Multi-Path Transformer on WMT14 En->De (GPU recipe). Data: binarize with fairseq's own
# examples/translation/prepare-wmt14en2de.sh + `fairseq-preprocess --joined-dictionary`, then
#
#   bash examples/multipath_transformer/wmt14_en_de.sh DATA_BIN [extra fairseq-train flags]
#
# ARCH (default multipath_transformer_6l_4p) is any Table 2 row, multipath_transformer_{L}l_{P}p.
# From the paper (Lin et al. 2022, Sec. 4.1): the deep and multi-path systems train with Adam
# (0.9, 0.997), lr 0.002, inverse sqrt with 16k warm-up updates, 8,192 tokens per batch on 8 GPUs
# in fp16, and the last 5 checkpoints averaged. What the paper leaves out follows the deep
# pre-norm recipe it builds on (Wang et al. 2019): residual, attention and activation dropout 0.1
# (the presets' values), label smoothing 0.1, 50 epochs, a checkpoint every 2,000 updates (about
# an epoch at this batch; the last 5 are averaged); beam 4 and length penalty 0.6 for decoding (a
# common En-De choice, not the paper's). The batch is
# read as 8,192 tokens per GPU over 8 GPUs (--max-tokens 8192); with fewer GPUs raise --update-freq
# so that GPUs x update-freq = 8. See docs/multipath_transformer.md.
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
ARCH="${ARCH:-multipath_transformer_6l_4p}"
SAVE="${SAVE:-checkpoints/$ARCH}"
fairseq-train "$DATA" --user-dir "$ROOT/fairseq_widearch" --arch "$ARCH" \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.997)' --clip-norm 0.0 --lr 0.002 --lr-scheduler inverse_sqrt \
  --warmup-updates 16000 --warmup-init-lr 1e-07 --max-tokens 8192 --update-freq 1 --max-epoch 50 \
  --save-dir "$SAVE" --save-interval-updates 2000 --keep-interval-updates 5 --no-epoch-checkpoints --fp16 "$@"
python -m fairseq_widearch.cli.average_checkpoints --inputs "$SAVE" --num-update-checkpoints 5 \
  --out "$SAVE/checkpoint_avg5.pt"
fairseq-generate "$DATA" --user-dir "$ROOT/fairseq_widearch" --path "$SAVE/checkpoint_avg5.pt" \
  --beam 4 --lenpen 0.6 --remove-bpe --batch-size 128 --gen-subset test > "$SAVE/generate-test.txt"
tail -1 "$SAVE/generate-test.txt"  # fairseq's BLEU line (tokenized, as in the WMT14 literature)
