#!/usr/bin/env bash
# PartialFormer on Multi30k En->De on CPU: the quick start with the partialformer_multi30k preset
# (d 128, 6 Self-AFFN encoder layers, 3 decoder layers, H_0 = 4 Q/K heads expanded to H = 12-8,
# PG-FFN r = 4 / 2, residual-like attention). Same data, budget, optimiser and decoding as the
# multi-path quick start; extra options go to examples/multi30k/quickstart.sh.
#
#   bash examples/partialformer/multi30k.sh [quick-start options] [-- extra fairseq-train flags]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
quickstart_as partialformer_multi30k "$0" "$@"
