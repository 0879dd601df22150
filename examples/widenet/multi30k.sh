#!/usr/bin/env bash
# WideNet on Multi30k En->De on CPU: the quick start with the widenet_multi30k preset and the MoE
# criterion (label-smoothed CE + 0.01 x summed balance losses, Eq. 8). Same budget and decoding
# as the multi-path quick start; extra options go to examples/multi30k/quickstart.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec bash "$ROOT/examples/multi30k/quickstart.sh" --arch widenet_multi30k "$@" -- \
  --criterion moe_label_smoothed_cross_entropy --moe-balance-weight 0.01
