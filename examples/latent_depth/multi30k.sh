#!/usr/bin/env bash
# Latent depth, bilingual, on Multi30k En->De on CPU: the quick start with the
# latent_depth_transformer_multi30k preset (3 static encoder + 6 latent decoder layers, LL-D) and
# the latent-depth criterion (label-smoothed CE + β·KL to the uniform prior, β ramped over 300
# updates, Eq. 8). Same budget and decoding as the multi-path quick start; extra options go to
# examples/multi30k/quickstart.sh. Add `-- --latent-target-layers K` for a target depth.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec bash "$ROOT/examples/multi30k/quickstart.sh" --arch latent_depth_transformer_multi30k "$@" -- \
  --criterion latent_depth_label_smoothed_cross_entropy --latent-kl-weight 1.0 --latent-kl-anneal-updates 300
