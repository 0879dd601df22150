#!/usr/bin/env bash
# WideNet on WMT14 En->De (GPU recipe). Data: binarize with fairseq's own
# examples/translation/prepare-wmt14en2de.sh + `fairseq-preprocess --joined-dictionary`, then
#
#   bash examples/widenet/wmt14_en_de.sh DATA_BIN [extra fairseq-train flags]
#
# From the paper (Xue et al. 2022): E = 4 experts, top-2, capacity factor 1.2, balance weight
# λ = 0.01, shared attention + MoE with per-block LayerNorms. The paper has no NMT settings, so
# the rest is fairseq's transformer-base WMT recipe (Adam 0.9/0.98, lr 7e-4, inverse sqrt with
# 4k warmup, label smoothing 0.1, dropout 0.1, 4096 tokens x 8 GPUs) and beam 4, lenpen 0.6;
# the paper's LAMB optimizer (pre-training) is not in fairseq. See docs/widenet.md.
# examples/translation/prepare-wmt14en2de.sh is in fairseq's source repository
# (https://github.com/facebookresearch/fairseq/tree/main/examples/translation), not in the installed
# wheel: fetch it from there. By default it prepares WMT'17 training data (newstest2014 as test);
# its --icml17 option gives the WMT'14 data of Vaswani et al., which the papers' tables use.
#
# The arch is widenet_wmt_en_de; SAVE: the checkpoints' directory (default
# checkpoints/widenet_wmt_en_de).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # runs from any directory
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
[ $# -gt 0 ] || die "argument DATA_BIN: missing (see --help)"
need_dir DATA_BIN "$1"
DATA="$1"; shift
SAVE="${SAVE:-checkpoints/widenet_wmt_en_de}"
fairseq-train "$DATA" --user-dir "$ROOT/fairseq_widearch" --arch widenet_wmt_en_de \
  --criterion moe_label_smoothed_cross_entropy --label-smoothing 0.1 --moe-balance-weight 0.01 \
  --moe-experts 4 --moe-top-k 2 --moe-capacity-factor 1.2 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 7e-4 --lr-scheduler inverse_sqrt \
  --warmup-updates 4000 --max-tokens 4096 --update-freq 1 --max-update 300000 \
  --save-dir "$SAVE" --keep-last-epochs 5 --fp16 "$@"
fairseq-generate "$DATA" --user-dir "$ROOT/fairseq_widearch" --path "$SAVE/checkpoint_best.pt" \
  --beam 4 --lenpen 0.6 --remove-bpe --batch-size 128 --gen-subset test > "$SAVE/generate-test.txt"
tail -1 "$SAVE/generate-test.txt"  # fairseq's BLEU line (tokenized, as in the WMT14 literature)
