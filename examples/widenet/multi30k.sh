#!/usr/bin/env bash
# WideNet on Multi30k En->De on CPU: the quick start with the widenet_multi30k preset and its MoE
# criterion at its defaults (label-smoothed CE + 0.01 x summed balance losses, Eq. 8). Same budget
# and decoding as the multi-path quick start; options go to examples/multi30k/quickstart.sh,
# fairseq-train flags after `--` (e.g. `-- --seed 2`).
#
#   bash examples/widenet/multi30k.sh [quick-start options] [-- extra fairseq-train flags]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
quickstart_as widenet_multi30k "$0" "$@"
