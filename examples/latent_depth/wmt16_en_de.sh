#!/usr/bin/env bash
# Latent depth on WMT16 En->De, bilingual (GPU recipe; Li et al. 2020, Table 1). Data: fairseq's
# examples/scaling_nmt WMT16 En-De (the Vaswani et al. preprocessing), binarized with separate
# source/target dictionaries (Table 1's counts fit ~33k types per side), then
#
#   ARCH=latent_depth_transformer_lld_12_24 bash examples/latent_depth/wmt16_en_de.sh DATA_BIN [extra flags]
#
# ARCH: any Table 1 preset (lld_12_24, lld_12_48, llboth_36_36, llboth_48_48, llboth_64_64).
# The paper gives no optimiser settings for WMT; these are the reference example's (Adam 0.9/0.98,
# eps 1e-6, lr 0.0015, inverse sqrt with 8k warmup from 1e-7, clip 1.0, 4096 tokens, label
# smoothing 0.1), and the latent settings are the criterion's and the preset's defaults, the
# released example's: its objective (KL on the samples averaged over layers, β = 0.1), relaxed
# samples for 500 updates and straight-through hard ones after, the KL ramped over 5,000, K = half
# the latent layers with the sharing term (λ = 0.1). Evaluation: last checkpoint, beam 5, length
# penalty 1.0, the soft layer weights (the expectation of training's z;
# docs/latent_depth_transformer.md, "Decoding"). The paper prunes with hard selection once q is
# near-discrete: prune_latent_layers (it warns when q is not) gives that model, whose decoding
# equals the latent model's hard selection (its latent_inference set to hard through
# fairseq-generate's --model-overrides).
#
# SAVE: the checkpoints' directory (default checkpoints/$ARCH).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # runs from any directory
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
[ $# -gt 0 ] || die "argument DATA_BIN: missing (see --help)"
need_dir DATA_BIN "$1"
DATA="$1"; shift
ARCH="${ARCH:-latent_depth_transformer_lld_12_24}"
SAVE="${SAVE:-checkpoints/$ARCH}"
fairseq-train "$DATA" --user-dir "$ROOT/fairseq_widearch" --arch "$ARCH" \
  --criterion latent_depth_label_smoothed_cross_entropy --label-smoothing 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-6 --clip-norm 1.0 --lr 0.0015 \
  --lr-scheduler inverse_sqrt --warmup-updates 8000 --warmup-init-lr 1e-7 --dropout 0.1 \
  --max-tokens 4096 --max-update 100000 --save-dir "$SAVE" --keep-last-epochs 5 --fp16 "$@"
fairseq-generate "$DATA" --user-dir "$ROOT/fairseq_widearch" --path "$SAVE/checkpoint_last.pt" \
  --model-overrides "{'latent_inference': 'soft'}" --beam 5 --lenpen 1.0 --remove-bpe --batch-size 128 \
  --gen-subset test --scoring sacrebleu > "$SAVE/generate-test.txt"
tail -1 "$SAVE/generate-test.txt"
python -m fairseq_widearch.cli.plot_layer_utilization "$SAVE" --out "$SAVE/layer_utilization.png"
