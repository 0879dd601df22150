#!/usr/bin/env bash
# Multilingual latent depth on Multi30k one-to-many (en->de, en->fr, en->cs) on CPU: one layer-selection
# posterior per language pair, aggregated-posterior prior (Li et al. 2020, Eq. 7), target depth K.
#
#   bash examples/latent_depth/multi30k_o2m.sh [--impl ours|anchor] [--minutes M] [--work-dir DIR]
#
# --impl ours   (default) latent_depth_transformer_multi30k on fairseq's translation_multi_simple_epoch;
# --impl anchor fairseq's own examples/latent_depth (task multilingual_translation_latent_depth) with
#               the same body (d 128, FFN 512, 4 heads, 3 static encoder + 6 latent decoder layers,
#               pre-norm, shared embeddings), the same optimiser, seed, tokens per update and budget.
# Trains for M minutes (default 15), decodes test_2016 of every pair (beam 5), prints sacreBLEU per
# pair. Language pairs are identified by --encoder-langtok tgt. Ours also keeps a checkpoint every
# 100 updates for python -m fairseq_widearch.cli.plot_layer_utilization.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
IMPL=ours
MINUTES=15
WORK="$ROOT/runs/multi30k_o2m"
VENV="${VENV:-$ROOT/.venv}"
while [ $# -gt 0 ]; do
  case "$1" in
    --impl) IMPL="$2"; shift 2 ;;
    --minutes) MINUTES="$2"; shift 2 ;;
    --work-dir) WORK="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

source "$ROOT/examples/multi30k/setup.sh" --tgt de,fr,cs

PAIRS=(--lang-pairs en-de,en-fr,en-cs --encoder-langtok tgt --decoder-langtok)
COMMON=(--cpu --num-workers 0 --seed 1 --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.003
        --lr-scheduler inverse_sqrt --warmup-updates 300 --label-smoothing 0.1 --dropout 0.1
        --stop-time-hours "$("$PY" -c "print($MINUTES / 60)")" --max-epoch 100 --disable-validation
        --no-epoch-checkpoints --log-format simple --log-interval 50)
# Latent depth: β = 0.1 per layer reached after 300 updates, straight-through hard samples after 300,
# K = 3, λ = 0.1. Ours sums the KL over the 6 latent layers (Eq. 8), the anchor averages it, so
# ours runs --latent-kl-weight 0.1 / 6 for the same strength.
if [ "$IMPL" = ours ]; then
  USER_DIR="$ROOT/fairseq_widearch"
  TASK=(--task translation_multi_simple_epoch)
  # batches of 2048 tokens, 3 per update: the anchor's batch shape (one batch per pair per update)
  TRAIN=(--arch latent_depth_transformer_multi30k --max-tokens 2048 --update-freq 3
         --save-interval-updates 100 --keep-interval-updates -1
         --criterion latent_depth_label_smoothed_cross_entropy --latent-prior aggregated --latent-kl-weight 0.016667
         --latent-kl-anneal-updates 300 --latent-soft-updates 300 --latent-target-layers 3 --latent-depth-weight 0.1)
  DECODE=(--model-overrides "{'latent_inference': 'hard'}")
elif [ "$IMPL" = anchor ]; then
  USER_DIR="$("$PY" -c "import fairseq, os; print(os.path.dirname(fairseq.__file__))")/examples/latent_depth/latent_depth_src"
  TASK=(--task multilingual_translation_latent_depth --decoder-latent-layer)
  # one batch of 2048 tokens per pair per update (the task loops over pairs): 6144 per update as ours
  TRAIN=(--arch latent_multilingual_transformer --max-tokens 2048 --ddp-backend legacy_ddp
         --encoder-embed-dim 128 --encoder-ffn-embed-dim 512 --encoder-attention-heads 4 --encoder-layers 3
         --decoder-embed-dim 128 --decoder-ffn-embed-dim 512 --decoder-attention-heads 4 --decoder-layers 6
         --encoder-normalize-before --decoder-normalize-before --share-encoders --share-decoders
         --share-all-embeddings --criterion label_smoothed_cross_entropy --prior agged_posterior
         --sparsity-weight 0.1 --anneal-updates 300 --soft-update 300 --target-layers 3 --share-weight 0.1)
  DECODE=()
else
  echo "error: --impl must be ours or anchor, got $IMPL" >&2; exit 2
fi

SAVE="$WORK/checkpoints/$IMPL"
mkdir -p "$SAVE"
# Importing the plugin first lets fairseq load (resume from, decode) checkpoints under torch's
# weights-only loading, also for the anchor's own --user-dir.
run_fairseq() { "$PY" -c "import sys; from fairseq_cli.$1 import cli_main; import fairseq_widearch; sys.argv[0] = '$1'; cli_main()" "${@:2}"; }
echo "| training $IMPL for at most $MINUTES minutes (resumes from $SAVE/checkpoint_last.pt if present)"
run_fairseq train "$WORK/data/bin" --user-dir "$USER_DIR" "${TASK[@]}" "${PAIRS[@]}" "${TRAIN[@]}" \
  "${COMMON[@]}" --save-dir "$SAVE" 2>&1 | tee "$WORK/train-$IMPL.log" | grep -E "\| train \||done training"

for TGT in de fr cs; do
  run_fairseq generate \
    "$WORK/data/bin" --user-dir "$USER_DIR" "${TASK[@]}" "${PAIRS[@]}" --source-lang en --target-lang "$TGT" \
    --path "$SAVE/checkpoint_last.pt" --gen-subset test --cpu --beam 5 --lenpen 1.0 --batch-size 128 \
    --tokenizer moses --bpe subword_nmt --bpe-codes "$WORK/data/bpe/codes" "${DECODE[@]}" \
    > "$WORK/generate-$IMPL-en-$TGT.txt"
  echo "| $IMPL en-$TGT: $("$PY" "$ROOT/examples/multi30k/score.py" "$WORK/generate-$IMPL-en-$TGT.txt" \
    "$WORK/data/test.ref.$TGT" | head -1)"
done
