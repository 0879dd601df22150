"""Plot a scalable model's BLEU and validation loss per width (Gao et al. 2021, Table 2 / Fig. 3).

    python -m fairseq_widearch.cli.plot_scalable_widths --bleu BLEU.jsonl
        [--checkpoint LABEL=CKPT ... --data BIN [--subset valid]] [--out widths.png]

``--bleu`` reads the lines ``{"label", "widths", "bleu"}`` that
``examples/scalable_transformer/score_widths.py --json`` appends (one per training stage; lines
of exported models are left out) and draws BLEU against the width C, one curve per label.
Each ``--checkpoint LABEL=CKPT`` adds the teacher-forced validation loss (bits per target token)
of every type-1 sub-Transformer of CKPT, one curve per label, in a second panel.

Raises:
    SystemExit: if there is nothing to plot, a checkpoint is not a ``scalable_transformer`` or
        ``--checkpoint`` comes without ``--data``.
"""
import argparse
import json
import os
import sys
from typing import Dict, List

import fairseq_widearch  # noqa: F401  (registers the plugin, allows loading checkpoints)
from fairseq_widearch.cli import check_subset, existing_dir, existing_file, output, whole
from fairseq_widearch.experiments.data import batches
from fairseq_widearch.experiments.scoring import load_scalable, validation_nll
from fairseq_widearch.modules.sub_transformers import width_set
from fairseq_widearch.plotting import pyplot


def read_bleu(path: str) -> Dict[str, Dict[int, float]]:
    """{label: {width: BLEU}} of the per-width lines of a score_widths JSON-lines file."""
    curves = {}
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        if all(w.isdigit() for w in row["widths"]):
            curves[row["label"]] = dict(zip(map(int, row["widths"]), row["bleu"]))
    return curves


def loss_per_width(checkpoint: str, data: str, subset: str, max_sentences: int) -> Dict[int, float]:
    """{width C: validation loss in bits per target token} of every type-1 sub-Transformer."""
    model, task = load_scalable(checkpoint, data)
    samples = batches(task, subset, max_sentences)
    losses = {}
    for width in width_set(model.cfg):
        model.set_sample_config(width)
        losses[width] = validation_nll(model, samples, task.target_dictionary.pad())
    return losses


def plot(panels: List[tuple], out: str):
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(5 * len(panels), 3.6), constrained_layout=True)
    for ax, (ylabel, curves) in zip(axes[0], panels):
        for label, points in curves.items():
            widths = sorted(points)
            ax.plot(widths, [points[w] for w in widths], "o-", label=label)
        ax.set_xticks(sorted({w for points in curves.values() for w in points}))
        ax.set_xlabel("sub-Transformer width C")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.savefig(out, dpi=120)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bleu", type=existing_file, help="JSON lines of score_widths.py --json")
    p.add_argument("--checkpoint", action="append", default=[], type=labelled_checkpoint, metavar="LABEL=CKPT",
                   help="a scalable_transformer checkpoint and its curve's label (repeatable)")
    p.add_argument("--data", type=existing_dir, help="fairseq data directory (for --checkpoint)")
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-sentences", type=whole(0, "0: all"), default=0, help="first N sentences only (0: all)")
    p.add_argument("--out", default="scalable_widths.png", type=output, help="PNG to write")
    return p


def labelled_checkpoint(text: str) -> str:
    """``LABEL=CKPT`` (or ``CKPT``) whose CKPT exists."""
    if not os.path.exists(text.rpartition("=")[2]):
        raise argparse.ArgumentTypeError(f"takes {labelled_checkpoint.accepts}, got {text!r}")
    return text


labelled_checkpoint.accepts, labelled_checkpoint.invalid = "LABEL=CKPT, CKPT an existing checkpoint", ("x=/no/such.pt",)


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.checkpoint and not args.data:
        p.error("--checkpoint needs --data")
    if args.data:
        check_subset(p, args.data, args.subset)
    panels = []
    if args.bleu:
        panels.append(("sacreBLEU", read_bleu(args.bleu)))
    if args.checkpoint:
        losses = {}
        for item in args.checkpoint:
            label, _, path = item.rpartition("=")
            losses[label or path] = loss_per_width(path, args.data, args.subset, args.max_sentences)
        panels.append((f"{args.subset} loss (bits per token)", losses))
    if not any(curves for _, curves in panels):
        sys.exit("error: nothing to plot: give --bleu and/or --checkpoint LABEL=CKPT")
    plot(panels, args.out)
    print(f"| -> {args.out}")
    for ylabel, curves in panels:
        for label, points in curves.items():
            print(f"| {ylabel} | {label} | " + " ".join(f"{w}: {v:.2f}" for w, v in sorted(points.items())))


if __name__ == "__main__":
    main()
