"""Average the parameters of the last N checkpoints (the papers' "last 10 checkpoints averaged").

    python -m fairseq_widearch.cli.average_checkpoints --inputs DIR --num-update-checkpoints N --out OUT
    python -m fairseq_widearch.cli.average_checkpoints --inputs A.pt B.pt ... --out OUT

fairseq's own ``scripts/average_checkpoints.py`` is not part of its wheels, and it loads
checkpoints with torch's old unsafe default; this does the same under weights-only loading. With a
directory, the N ``checkpoint_<epoch>_<updates>.pt`` files with the most updates are averaged (save
them with ``--save-interval-updates``). The output keeps the newest checkpoint's config and drops
optimizer state. Floating-point tensors are averaged in float64 and cast back; others are taken
from the newest checkpoint.

Raises:
    SystemExit: if fewer checkpoints than asked are found or their parameter names differ.
"""
import argparse
import re
import sys
from pathlib import Path

import torch

import fairseq_widearch  # noqa: F401  (allows loading fairseq checkpoints)


def update_checkpoints(directory: Path, count: int):
    """The ``count`` interval checkpoints of ``directory`` with the most updates, oldest first."""
    found = sorted((int(m[1]), path) for path in directory.glob("checkpoint_*_*.pt")
                   if (m := re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", path.name)))
    if len(found) < count:
        sys.exit(f"error: {directory} holds {len(found)} checkpoint_<epoch>_<updates>.pt files, fewer than {count}")
    return [path for _, path in found[-count:]]


def average(paths) -> dict:
    states = [torch.load(p, map_location="cpu") for p in paths]
    names = list(states[-1]["model"])
    for path, state in zip(paths, states):
        if list(state["model"]) != names:
            sys.exit(f"error: {path} does not hold the same parameters as {paths[-1]}")
    averaged = {}
    for name in names:
        newest = states[-1]["model"][name]
        if newest.is_floating_point():
            total = sum(s["model"][name].double() for s in states)
            averaged[name] = (total / len(states)).to(newest.dtype)
        else:
            averaged[name] = newest
    return {**states[-1], "model": averaged, "last_optimizer_state": None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, help="checkpoint files, or one directory")
    p.add_argument("--num-update-checkpoints", type=int, default=10, help="with a directory: how many to average")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    inputs = [Path(x) for x in args.inputs]
    if len(inputs) == 1 and inputs[0].is_dir():
        inputs = update_checkpoints(inputs[0], args.num_update_checkpoints)
    torch.save(average(inputs), args.out)
    print(f"| averaged {len(inputs)} checkpoints ({inputs[0].name} ... {inputs[-1].name}) -> {args.out}")


if __name__ == "__main__":
    main()
