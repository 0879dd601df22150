#!/usr/bin/env bash
# Latent depth, bilingual, on Multi30k En->De on CPU: the quick start with the
# latent_depth_transformer_multi30k preset (3 static encoder + 6 latent decoder layers, LL-D) and
# the latent-depth criterion at its defaults, the authors' released example's training: the
# released objective (KL on the samples averaged over layers, β = 0.1), relaxed samples for the
# first 19 updates and straight-through hard ones after, the KL ramped over 188 updates, target
# depth K = 3 with its sharing term from update 207 (λ = 0.1), τ = 5, the uniform prior (the
# README's windows scaled by the warm-up, 300 / 8,000: docs/latent_depth_transformer.md,
# "Presets"). Same budget and decoding as the multi-path quick start (soft layer weights); options
# go to examples/multi30k/quickstart.sh, fairseq-train flags after `--` (e.g. `-- --seed 2`, or
# `-- --latent-objective ours` for Eq. 8 as printed).
#
#   bash examples/latent_depth/multi30k.sh [quick-start options] [-- extra fairseq-train flags]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/examples/args.sh"
quickstart_as latent_depth_transformer_multi30k "$0" "$@"
