#!/usr/bin/env bash
# Multilingual latent depth on Multi30k one-to-many (en->de, en->fr, en->cs) on CPU: one layer-selection
# posterior per language pair, aggregated-posterior prior (Li et al. 2020, Eq. 7), target depth K.
#
#   bash examples/latent_depth/multi30k_o2m.sh [--impl ours|anchor|anchor_initialised] [--objective ours|released] [--seed S]
#        [--max-update N] [--minutes M] [--decode MODE,...] [--work-dir DIR] [--data-dir DIR]
#
# --impl ours   (default) latent_depth_transformer_multi30k on fairseq's translation_multi_simple_epoch;
# --impl anchor fairseq's own examples/latent_depth (task multilingual_translation_latent_depth) with
#               the same body (d 128, FFN 512, 4 heads, 3 static encoder + 6 latent decoder layers,
#               pre-norm, shared embeddings), the same optimiser, seed, tokens per update and budget.
# --impl anchor_initialised  the anchor with its layer logits initialised to 0 (q = 0.5, where ours
#               starts) instead of uninitialised memory; patched from here, the installed fairseq untouched.
# --objective   ours: Eq. 8 as printed (default here: the head-to-head's first system); released: the
#               released code's objective term for term (--latent-objective released). Every latent
#               flag is given, so neither depends on the criterion's defaults. --impl anchor always
#               trains under its own.
# Trains N updates (default 2000; --minutes M stops earlier, and says so), resuming from the run's
# checkpoint_last.pt, then decodes test_2016 of every pair (beam 5) once per --decode mode and prints
# one sacreBLEU line per pair and mode. Modes: ours soft (default), sampled, hard (--latent-inference);
# anchor sampled (default: a fresh layer subset at every decoder step, its only mode) or all (every
# layer on). Language pairs are identified by --encoder-langtok tgt. Ours keeps a checkpoint every
# 100 updates for python -m fairseq_widearch.cli.plot_layer_utilization.
#
# VENV: the virtualenv to use, made if absent (default ./.venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
IMPL=ours
OBJECTIVE=ours
SEED=1
MAX_UPDATE=2000
MINUTES=0
DECODE=""
DATA_DIR="${MULTI30K_DIR:-}"
WORK="$ROOT/runs/multi30k_o2m"
VENV="${VENV:-$ROOT/.venv}"
while [ $# -gt 0 ]; do
  case "$1" in
    --impl) need_one_of "$1" "${2-}" ours anchor anchor_initialised; IMPL="$2"; shift 2 ;;
    --objective) need_one_of "$1" "${2-}" ours released; OBJECTIVE="$2"; shift 2 ;;
    --seed) need_whole "$1" "${2-}" 0; SEED="$2"; shift 2 ;;
    --max-update) need_whole "$1" "${2-}" 1; MAX_UPDATE="$2"; shift 2 ;;
    --minutes) need_positive "$1" "${2-}"; MINUTES="$2"; shift 2 ;;
    --decode) need_value "$1" "${2-}"; DECODE="$2"; shift 2 ;;
    --work-dir) need_value "$1" "${2-}"; WORK="$2"; shift 2 ;;
    --data-dir) need_dir "$1" "${2-}"; DATA_DIR="$2"; shift 2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
case "$IMPL/$OBJECTIVE" in
  ours/ours|ours/released) NAME="ours-objective_$OBJECTIVE-seed$SEED"; DECODE="${DECODE:-soft}"; MODES="soft sampled hard" ;;
  anchor/*|anchor_initialised/*) NAME="$IMPL-seed$SEED"; DECODE="${DECODE:-sampled}"; MODES="sampled all" ;;
  *) echo "error: --impl must be ours, anchor or anchor_initialised and --objective ours or released, got $IMPL / $OBJECTIVE" >&2; exit 2 ;;
esac
for MODE in ${DECODE//,/ }; do
  if [[ " $MODES " != *" $MODE "* ]]; then
    echo "error: --decode $MODE: --impl $IMPL decodes with one of: $MODES" >&2; exit 2
  fi
done

source "$ROOT/examples/multi30k/setup.sh" --tgt de,fr,cs

PAIRS=(--lang-pairs en-de,en-fr,en-cs --encoder-langtok tgt --decoder-langtok)
COMMON=(--cpu --num-workers 0 --seed "$SEED" --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.003
        --lr-scheduler inverse_sqrt --warmup-updates 300 --label-smoothing 0.1 --dropout 0.1
        --max-update "$MAX_UPDATE" --max-epoch 1000 --disable-validation
        --no-epoch-checkpoints --log-format simple --log-interval 50)
if [ "$MINUTES" != 0 ]; then COMMON+=(--stop-time-hours "$("$PY" -c "print($MINUTES / 60)")"); fi
# Latent depth: β = 0.1 per layer reached after 300 updates, straight-through hard samples after 300,
# K = 3, λ = 0.1. Ours' own objective sums the KL over the 6 latent layers (Eq. 8), the anchor's
# averages it, so ours runs --latent-kl-weight 0.1 / 6 there for the same strength.
if [ "$IMPL" = anchor_initialised ]; then export INITIALISED_LOGITS=1; fi
if [ "$IMPL" = ours ]; then
  USER_DIR="$ROOT/fairseq_widearch"
  TASK=(--task translation_multi_simple_epoch)
  KL_WEIGHT=0.016667
  if [ "$OBJECTIVE" = released ]; then KL_WEIGHT=0.1; fi
  # batches of 2048 tokens, 3 per update: the anchor's batch shape (one batch per pair per update)
  TRAIN=(--arch latent_depth_transformer_multi30k --max-tokens 2048 --update-freq 3
         --save-interval-updates 100 --keep-interval-updates -1
         --criterion latent_depth_label_smoothed_cross_entropy --latent-objective "$OBJECTIVE"
         --latent-prior aggregated --latent-kl-weight "$KL_WEIGHT" --latent-kl-anneal-updates 300
         --latent-soft-updates 300 --latent-target-layers 3 --latent-depth-weight 0.1)
else
  USER_DIR="$("$PY" -c "import fairseq, os; print(os.path.dirname(fairseq.__file__))")/examples/latent_depth/latent_depth_src"
  TASK=(--task multilingual_translation_latent_depth --decoder-latent-layer)
  # one batch of 2048 tokens per pair per update (the task loops over pairs): 6144 per update as ours
  TRAIN=(--arch latent_multilingual_transformer --max-tokens 2048 --ddp-backend legacy_ddp
         --encoder-embed-dim 128 --encoder-ffn-embed-dim 512 --encoder-attention-heads 4 --encoder-layers 3
         --decoder-embed-dim 128 --decoder-ffn-embed-dim 512 --decoder-attention-heads 4 --decoder-layers 6
         --encoder-normalize-before --decoder-normalize-before --share-encoders --share-decoders
         --share-all-embeddings --criterion label_smoothed_cross_entropy --prior agged_posterior
         --sparsity-weight 0.1 --anneal-updates 300 --soft-update 300 --target-layers 3 --share-weight 0.1)
fi

SAVE="$WORK/checkpoints/$NAME"
mkdir -p "$SAVE"
# Importing the plugin first lets fairseq load (resume from, decode) checkpoints under torch's
# weights-only loading, also for the anchor's own --user-dir. ALL_LAYERS=1 makes the anchor's layer
# selection return 1 for every layer (its code has no such mode); INITIALISED_LOGITS=1 fills its
# layer logits with 0 when it builds them (its code leaves torch.Tensor's uninitialised memory).
run_fairseq() {
  "$PY" -c "import sys, os, torch, fairseq_widearch
from argparse import Namespace
from fairseq.utils import import_user_module
import_user_module(Namespace(user_dir='$USER_DIR'))
select = sys.modules['latent_depth_src'].modules.latent_layers.LayerSelect if 'latent_depth_src' in sys.modules else None
if os.environ.get('ALL_LAYERS') == '1':
    select._gumbel_sigmoid = lambda self, logits, **kw: torch.ones_like(logits)
if os.environ.get('INITIALISED_LOGITS') == '1':
    build = select.__init__
    def initialised(self, *args, **kwargs):
        build(self, *args, **kwargs)
        torch.nn.init.zeros_(self.layer_logits)
    select.__init__ = initialised
from fairseq_cli.$1 import cli_main
sys.argv[0] = '$1'; cli_main()" "${@:2}"
}
updates() {
  if [ -f "$SAVE/checkpoint_last.pt" ]; then
    "$PY" -c "import sys, torch; print(torch.load(sys.argv[1], map_location='cpu', weights_only=False)['optimizer_history'][-1]['num_updates'])" "$SAVE/checkpoint_last.pt"
  else echo 0; fi
}
# a checkpoint that has reached --max-update needs no fairseq-train start-up (which trains nothing then:
# README, "A finished run stays finished")
if [ "$(updates)" -lt "$MAX_UPDATE" ]; then
  echo "| training $NAME to $MAX_UPDATE updates (resumes from $SAVE/checkpoint_last.pt if present)"
  run_fairseq train "$WORK/data/bin" --user-dir "$USER_DIR" "${TASK[@]}" "${PAIRS[@]}" "${TRAIN[@]}" \
    "${COMMON[@]}" --save-dir "$SAVE" >> "$WORK/train-$NAME.log" 2>&1 || { tail -n 30 "$WORK/train-$NAME.log" >&2; exit 1; }
fi
UPDATES=$(updates)
echo "| $NAME: $UPDATES updates"
if [ "$UPDATES" -lt "$MAX_UPDATE" ]; then
  echo "| warning: --minutes $MINUTES stopped $NAME at $UPDATES of $MAX_UPDATE updates" >&2
fi

for MODE in ${DECODE//,/ }; do
  if [ "$IMPL" = ours ]; then OVERRIDES=(--model-overrides "{'latent_inference': '$MODE'}"); else OVERRIDES=(); fi
  for TGT in de fr cs; do
    OUT="$WORK/generate-$NAME-$MODE-en-$TGT.txt"
    ALL_LAYERS=$([ "$MODE" = all ] && echo 1 || echo 0) run_fairseq generate \
      "$WORK/data/bin" --user-dir "$USER_DIR" "${TASK[@]}" "${PAIRS[@]}" --source-lang en --target-lang "$TGT" \
      --path "$SAVE/checkpoint_last.pt" --gen-subset test --cpu --beam 5 --lenpen 1.0 --batch-size 128 \
      --seed 1 --tokenizer moses --bpe subword_nmt --bpe-codes "$WORK/data/bpe/codes" "${OVERRIDES[@]}" \
      > "$OUT" 2> "${OUT%.txt}.log" || { tail -n 20 "${OUT%.txt}.log" >&2; exit 1; }
    # the scorer prints a header, the score, the signature: the score is the line meant
    echo "| $NAME en-$TGT $MODE: $("$PY" -m fairseq_widearch.experiments.scoring "$OUT" "$WORK/data/test.ref.$TGT" | sed -n 2p)"
  done
done
