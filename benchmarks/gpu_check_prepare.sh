#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on a GPU machine with Python 3.12 and its own torch, offline,
# prepared on a machine with internet access into ./.gpu (git-ignored; docs/gpu.md, "Install on a GPU machine"):
#   .gpu/wheels/     the cp312 wheels of fairseq and of what it needs beyond that machine's image
#   .gpu/multi30k/   the quick start's prepared Multi30k (bin/, bpe/codes, test.ref.de), 12 MB
# Then copy .gpu to the GPU machine with the repository. Idempotent: what is there already is kept.
#
#   bash benchmarks/gpu_check_prepare.sh [PYTHON (./.venv/bin/python)]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
cd "$ROOT"
# fairseq and what it needs that the GPU image lacks (its image has torch, numpy, sacrebleu, regex,
# pyyaml, tqdm, pytest and pytest-xdist); one version each: pip refuses two
WHEELS=(ve-fairseq==0.12.3 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 bitarray==3.12.3
        sacremoses==0.2.0 subword-nmt==0.3.8 mock==5.2.0)
mkdir -p .gpu/wheels
for wheel in "${WHEELS[@]}"; do
  name="${wheel%%==*}"
  if ! ls .gpu/wheels | grep -qi "^${name//-/_}-\|^${name}-"; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 -d .gpu/wheels "$wheel" 2>/dev/null ||
      "$PY" -m pip wheel -q --no-deps -w .gpu/wheels "$wheel"  # pure Python, published as a source archive only
  fi
done
if [ ! -f .gpu/multi30k/bin/dict.en.txt ]; then
  "$PY" examples/multi30k/prepare.py --work-dir .gpu/multi30k
fi
du -sh .gpu/wheels .gpu/multi30k
