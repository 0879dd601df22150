#!/usr/bin/env bash
# Create the virtualenv ($VENV, default ./.venv) if absent and install fairseq-widearch into it
# with its test and example extras. torch 2.13.0 goes first: an unpinned torch (asked for by
# fairseq) could otherwise pull a newer multi-GB CUDA build. torch comes from TORCH_INDEX_URL when set,
# else from pip's own index (pip.conf, PIP_INDEX_URL); plain PyPI's Linux wheel of torch is the CUDA
# build, so with PyPI set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU build.
#
# Our fairseq (ve-fairseq 0.12.3) has wheels for CPython 3.11 and 3.12 only, so the virtualenv is
# made with one of those: $PYTHON if set; else python3 if it is 3.11 or 3.12; else python3.12, then
# python3.11 from PATH. With none, it stops before creating anything. An existing $VENV of another
# version is not reused. `setup_venv.sh --print-python` prints the interpreter it would take.
#
#   bash examples/setup_venv.sh [--print-python]
set -euo pipefail
HERE="${BASH_SOURCE[0]%/*}"  # no dirname: the interpreter is chosen with bash's builtins alone
[ "$HERE" = "${BASH_SOURCE[0]}" ] && HERE=.
ROOT="$(cd "$HERE/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
SUPPORTED="3.11 3.12"
source "$HERE/args.sh"
case "${1:-}" in
  -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
  ""|--print-python) ;;
  *) die "unknown option $1 (see --help)" ;;
esac
HOW="install one (Debian and Ubuntu: apt install python3.12-venv, or python3.11-venv; elsewhere pyenv or \
python.org) and run again, or point PYTHON at it (PYTHON=/path/to/python3.12)"

# "3.12" for an interpreter that runs, else nothing
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
supported() { [[ " $SUPPORTED " == *" $1 "* ]]; }

choose_python() {
  if [ -n "${PYTHON:-}" ]; then
    local v; v="$(version_of "$PYTHON")"
    if ! supported "$v"; then
      echo "error: PYTHON=$PYTHON is Python ${v:-(not runnable)}; fairseq-widearch needs CPython 3.11 or 3.12" \
           "(ve-fairseq's wheels): $HOW" >&2
      return 1
    fi
    echo "$PYTHON"
    return
  fi
  local candidate seen=""
  for candidate in python3 python3.12 python3.11; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    local v; v="$(version_of "$candidate")"
    seen+="${seen:+, }$candidate is ${v:-not runnable}"
    if supported "$v"; then
      echo "$candidate"
      return
    fi
  done
  echo "error: no Python 3.11 or 3.12 found (${seen:-no python3 on PATH}); fairseq-widearch needs one of them" \
       "(ve-fairseq, our fairseq, has wheels for CPython 3.11 and 3.12 only): $HOW" >&2
  return 1
}

PY="$(choose_python)" || exit 1
if [ "${1:-}" = "--print-python" ]; then
  echo "$PY"
  exit 0
fi
if [ -e "$VENV/bin/python" ]; then
  existing="$(version_of "$VENV/bin/python")"
  if ! supported "$existing"; then
    echo "error: $VENV is a Python ${existing:-(not runnable)} virtualenv; fairseq-widearch needs 3.11 or 3.12:" \
         "remove it (rm -rf $VENV) and run again, and $PY will make a new one" >&2
    exit 1
  fi
else
  echo "| creating virtualenv $VENV with $PY (Python $(version_of "$PY"))"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import fairseq_widearch, pytest, pytest_timeout, xdist, sacremoses, subword_nmt, sacrebleu, mkdocstrings, ruff" 2>/dev/null; then
  echo "| installing torch (CPU build) and fairseq-widearch[test] into $VENV"
  "$VENV/bin/python" -m pip install -q torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
fi
