"""Average the parameters of the last N checkpoints (the papers' "last 10 checkpoints averaged").

    python -m fairseq_widearch.cli.average_checkpoints --inputs DIR --num-update-checkpoints N --out OUT
    python -m fairseq_widearch.cli.average_checkpoints --inputs DIR --num-epoch-checkpoints N --out OUT
    python -m fairseq_widearch.cli.average_checkpoints --inputs A.pt B.pt ... --out OUT

fairseq's own ``scripts/average_checkpoints.py`` is not part of its wheels, and it loads checkpoints
with torch's old unsafe default; this does the same under weights-only loading. With a directory,
the N ``checkpoint_<epoch>_<updates>.pt`` files with the most updates are averaged (save them with
``--save-interval-updates``), or with ``--num-epoch-checkpoints`` the N ``checkpoint<epoch>.pt``
files of the last epochs (what ``--keep-last-epochs`` keeps), as fairseq's script names them. The
output keeps the newest checkpoint's config and drops optimizer state. Floating-point tensors are
averaged in float64 and cast back; others are taken from the newest checkpoint.

Raises:
    SystemExit: if an input or the output's directory does not exist, fewer checkpoints than
        asked are found or their parameter names differ.
"""
import argparse
import re
import sys
from pathlib import Path

import torch

from fairseq_widearch.checkpoint_loading import average_checkpoints
from fairseq_widearch.cli import existing, output, whole

#: How fairseq names a directory's interval checkpoints and its epoch checkpoints, by the number
#: that orders them.
PATTERNS = {"updates": (r"checkpoint_\d+_(\d+)\.pt", "checkpoint_<epoch>_<updates>.pt"),
            "epochs": (r"checkpoint(\d+)\.pt", "checkpoint<epoch>.pt")}


def latest_checkpoints(directory: Path, count: int, by: str = "updates"):
    """The ``count`` checkpoints of ``directory`` with the most updates (``by="updates"``) or of the
    last epochs (``"epochs"``), oldest first. Exits naming the pattern if there are fewer."""
    pattern, name = PATTERNS[by]
    found = sorted((int(m[1]), path) for path in directory.glob("checkpoint*.pt")
                   if (m := re.fullmatch(pattern, path.name)))
    if len(found) < count:
        sys.exit(f"error: {directory} holds {len(found)} {name} files, fewer than {count}")
    return [path for _, path in found[-count:]]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, type=existing, help="checkpoint files, or one directory")
    count = p.add_mutually_exclusive_group()
    count.add_argument("--num-update-checkpoints", type=whole(1), default=10, help="with a directory: how many "
                       "interval checkpoints (checkpoint_<epoch>_<updates>.pt) to average (default: 10)")
    count.add_argument("--num-epoch-checkpoints", type=whole(1), help="with a directory: how many epoch "
                       "checkpoints (checkpoint<epoch>.pt, kept by --keep-last-epochs) to average")
    p.add_argument("--out", required=True, type=output, help="the averaged checkpoint to write (its directory must exist)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    inputs = [Path(x) for x in args.inputs]
    if len(inputs) == 1 and inputs[0].is_dir():
        by_epochs = args.num_epoch_checkpoints is not None
        inputs = latest_checkpoints(inputs[0], args.num_epoch_checkpoints if by_epochs else args.num_update_checkpoints,
                                    "epochs" if by_epochs else "updates")
    try:
        torch.save(average_checkpoints(inputs), args.out)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(f"| averaged {len(inputs)} checkpoints ({inputs[0].name} ... {inputs[-1].name}) -> {args.out}")


if __name__ == "__main__":
    main()
