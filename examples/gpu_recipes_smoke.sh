#!/usr/bin/env bash
# Every GPU recipe (examples/*/wmt*.sh) run as written, training and decoding, for a few hundred
# updates with the quick start's Multi30k standing in for WMT: the stand-in is the recipe's DATA
# argument, and the flags appended below only shorten training (a recipe passes extra flags to
# fairseq-train). All five at once, one GPU shared; each one's log is WORK/<name>.log and its
# checkpoints WORK/<name>/. docs/gpu.md records a run.
#
#   bash examples/gpu_recipes_smoke.sh [DATA_BIN (runs/multi30k/data/bin)] [WORK (runs/recipes_smoke)]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/examples/args.sh"
help_asked "$@" && { usage "$0"; exit 0; }
need_dir DATA_BIN "${1:-$ROOT/runs/multi30k/data/bin}"
DATA="$(realpath "${1:-$ROOT/runs/multi30k/data/bin}")"
WORK="$(mkdir -p "${2:-$ROOT/runs/recipes_smoke}" && realpath "${2:-$ROOT/runs/recipes_smoke}")"
cd "$ROOT"  # the recipes keep their checkpoints under checkpoints/ unless SAVE is set

recipe() {  # name script [flags]: the recipe's exit status and the last lines of its log
  local name=$1 script=$2
  shift 2
  SAVE="$WORK/$name" bash "$script" "$DATA" "$@" > "$WORK/$name.log" 2>&1
  echo "$name: exit $? | $(tail -1 "$WORK/$name.log")"
}

recipe multipath_transformer examples/multipath_transformer/wmt14_en_de.sh --max-update 200 \
  --save-interval-updates 40 &
recipe widenet examples/widenet/wmt14_en_de.sh --max-update 200 &
recipe partialformer examples/partialformer/wmt14_en_de.sh --max-update 200 --save-interval-updates 20 &
recipe latent_depth examples/latent_depth/wmt16_en_de.sh --max-update 200 &
# about 7 updates per Multi30k epoch at the recipe's 3,584 tokens x 16
UPDATES_PER_EPOCH=7 recipe scalable_transformer examples/scalable_transformer/wmt14_en_de.sh --max-epoch 3 &
wait
