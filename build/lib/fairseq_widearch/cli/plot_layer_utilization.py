"""Plot the layer utilization of a latent-depth model over training (Li et al. 2020, Fig. 6).

    python -m fairseq_widearch.cli.plot_layer_utilization CHECKPOINT_OR_DIR [...] --out utilization.png

Reads ``latent_depth_transformer`` checkpoints (files, or every ``checkpoint*.pt`` of a directory,
e.g. written with ``--save-interval-updates N --keep-interval-updates -1``), orders them by their
number of updates and draws, for every latent stack and language pair, a heatmap of the expected
utilization u_l = q(z_l = 1) = σ(α_l) of each layer l (rows) after each number of updates
(columns). Prints the last checkpoint's u_l as a table.

Raises:
    SystemExit: if no checkpoint is found, one is not a latent-depth model, or matplotlib is not
        installed (``pip install -e '.[plots]'`` in the checkout), naming the file.
"""
import argparse
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

import fairseq_widearch  # noqa: F401  (allows loading the plugin's checkpoints)
from fairseq_widearch.cli import existing, output
from fairseq_widearch.plotting import num_updates, pyplot

STACKS = ("encoder", "decoder")


def checkpoint_files(paths: Sequence[str]) -> List[Path]:
    files = []
    for path in map(Path, paths):
        files.extend(sorted(path.glob("checkpoint*.pt")) if path.is_dir() else [path])
    if not files:
        sys.exit(f"error: no checkpoint*.pt in {', '.join(paths)}")
    return files


def read_utilization(files: Sequence[Path]) -> Tuple[List[int], Dict[str, torch.Tensor], List[str]]:
    """-> (updates ``[N]``, {stack: u ``(N, P, L)``}, language pairs) over the distinct update
    counts of ``files``, in training order."""
    by_update, pairs = {}, []
    for f in files:
        state = torch.load(f, map_location="cpu")
        logits = {s: state["model"][f"{s}.layer_select.logits"] for s in STACKS
                  if f"{s}.layer_select.logits" in state["model"]}
        if not logits:
            sys.exit(f"error: {f} holds no latent layers (not a latent_depth_transformer checkpoint)")
        by_update[num_updates(state)] = {s: torch.sigmoid(v.float()) for s, v in logits.items()}
        pairs = getattr(state["cfg"]["model"], "latent_lang_pairs", "").split(",")
    updates = sorted(by_update)
    stacks = {s: torch.stack([by_update[u][s] for u in updates]) for s in by_update[updates[-1]]}
    return updates, stacks, [p for p in pairs if p] or ["all"]


def plot(updates: List[int], stacks: Dict[str, torch.Tensor], pairs: List[str], out: str):
    plt = pyplot()
    fig, axes = plt.subplots(len(stacks), len(pairs), squeeze=False, sharex=True, constrained_layout=True,
                             figsize=(3.2 * len(pairs) + 1.2, 2.6 * len(stacks) + 0.6))
    for row, (stack, u) in enumerate(stacks.items()):
        for col, pair in enumerate(pairs):
            ax = axes[row][col]
            image = ax.imshow(u[:, col].T.numpy(), aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis",
                              extent=(-0.5, len(updates) - 0.5, -0.5, u.size(2) - 0.5))
            ax.set_title(f"{stack}, {pair}" if len(pairs) > 1 else stack, fontsize=9)
            ticks = sorted(set(torch.linspace(0, len(updates) - 1, min(len(updates), 5)).round().long().tolist()))
            ax.set_xticks(ticks, [str(updates[t]) for t in ticks])
        axes[row][0].set_ylabel(f"{stack} layer l")
        fig.colorbar(image, ax=list(axes[row]), label="u_l = q(z_l = 1)")
    for ax in axes[-1]:
        ax.set_xlabel("updates")
    fig.suptitle("Layer utilization over training")
    fig.savefig(out, dpi=120)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=existing, help="checkpoint files or directories holding checkpoint*.pt")
    p.add_argument("--out", default="layer_utilization.png", type=output, help="PNG to write")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    updates, stacks, pairs = read_utilization(checkpoint_files(args.checkpoints))
    plot(updates, stacks, pairs, args.out)
    print(f"| {len(updates)} checkpoints ({updates[0]} to {updates[-1]} updates) -> {args.out}")
    for stack, u in stacks.items():
        for i, pair in enumerate(pairs):
            print(f"| {stack} {pair}: u_l after {updates[-1]} updates = "
                  + " ".join(f"{v:.3f}" for v in u[-1, i].tolist()))


if __name__ == "__main__":
    main()
