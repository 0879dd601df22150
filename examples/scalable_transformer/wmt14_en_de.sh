#!/usr/bin/env bash
# Scalable Transformers on WMT14 En->De (GPU recipe) with the paper's settings (Gao et al. 2021,
# Appendix A and Table 4). Data: fairseq's examples/translation/prepare-wmt14en2de.sh (32K joint
# BPE) + `fairseq-preprocess --joined-dictionary`, then
#
#   bash examples/scalable_transformer/wmt14_en_de.sh DATA_BIN [extra fairseq-train flags]
#   (ARCH=scalable_transformer_type2_wmt_en_de for type-2)
#
# Table 4 (En-De): stage 1 60 epochs, max lr 0.007; stage 2 60 epochs, lr 0.007, λ2 annealed to
# 0.5 (t_j: a third of the stage, our choice, the paper gives none); stage 3 30 epochs, lr 0.004,
# λ3 0.9, on the stage-2 model's beam outputs (beam 4, lenpen 0.6; pairs longer than 250 tokens
# or with a length ratio above 20 dropped). Every stage warms up linearly from 5e-4 over 4,000
# updates, then lr = lr_max·sqrt(4000/update) (Eq. 10); Adam (0.9, 0.98), eps 1e-8, label
# smoothing 0.1, no weight decay; 8 GPUs x 3,584 tokens x update frequency 16 (458,752 tokens per
# update). Dropout follows the width (the preset's table). Evaluation: the last 10 epoch
# checkpoints averaged, every width decoded with beam 4, lenpen 0.6. Each stage starts from the
# previous one with --finetune-from-model (fresh optimizer, schedule and data iterator; an
# interrupted stage resumes from its own checkpoint when the script is run again).
# examples/translation/prepare-wmt14en2de.sh is in fairseq's source repository
# (https://github.com/facebookresearch/fairseq/tree/main/examples/translation), not in the installed
# wheel: fetch it from there. By default it prepares WMT'17 training data (newstest2014 as test);
# its --icml17 option gives the WMT'14 data of Vaswani et al., which the papers' tables use.
#
# SAVE: the checkpoints' directory (default checkpoints/$ARCH).
# UPDATES_PER_EPOCH: the updates of one epoch of your data, which the stages' lengths count in
# (default 9800: ~4.5M pairs at 458,752 tokens per update).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
[ $# -gt 0 ] || die "argument DATA_BIN: missing (see --help)"
need_dir DATA_BIN "$1"
DATA="$1"; shift
ARCH="${ARCH:-scalable_transformer_wmt_en_de}"
SAVE="${SAVE:-checkpoints/$ARCH}"
UPDATES_PER_EPOCH="${UPDATES_PER_EPOCH:-9800}"  # ~4.5M pairs / 458,752 tokens per update; adjust to your data

stage() {  # stage epochs lr data save-dir [extra flags]
  local s=$1 epochs=$2 lr=$3 data=$4 save=$5
  shift 5
  fairseq-train "$data" --user-dir "$ROOT/fairseq_widearch" --arch "$ARCH" \
    --task scalable_translation --criterion scalable_self_distillation --distill-stage "$s" --label-smoothing 0.1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-8 --weight-decay 0.0 \
    --lr "$lr" --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 5e-4 \
    --max-tokens 3584 --update-freq 16 --max-epoch "$epochs" --fp16 \
    --save-dir "$save" --keep-last-epochs 10 "$@"
}

stage 1 60 0.007 "$DATA" "$SAVE/stage1" "$@"
stage 2 60 0.007 "$DATA" "$SAVE/stage2" --lambda2-anneal-updates $((UPDATES_PER_EPOCH * 20)) \
  --finetune-from-model "$SAVE/stage1/checkpoint_last.pt" "$@"
python "$ROOT/examples/scalable_transformer/distillation_targets.py" --data "$DATA" \
  --checkpoint "$SAVE/stage2/checkpoint_last.pt" --out "$SAVE/distilled" --max-tokens 16384
stage 3 30 0.004 "$SAVE/distilled" "$SAVE/stage3" --lambda3 0.9 \
  --finetune-from-model "$SAVE/stage2/checkpoint_last.pt" "$@"

# the last 10 epoch checkpoints (--keep-last-epochs 10), whichever epochs stage 3 ended at
python -m fairseq_widearch.cli.average_checkpoints --out "$SAVE/stage3/checkpoint_avg10.pt" \
  --inputs "$SAVE/stage3" --num-epoch-checkpoints 10
for width in 256 320 384 448 512 576 640 704 768 832 896 960 1024; do
  fairseq-generate "$DATA" --user-dir "$ROOT/fairseq_widearch" --path "$SAVE/stage3/checkpoint_avg10.pt" \
    --task scalable_translation --eval-width "$width" --beam 4 --lenpen 0.6 --remove-bpe --batch-size 128 \
    --gen-subset test > "$SAVE/generate-test-$width.txt"
  echo "width $width: $(tail -1 "$SAVE/generate-test-$width.txt")"  # fairseq's tokenized BLEU line
done
