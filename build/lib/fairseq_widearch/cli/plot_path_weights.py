"""Plot the path-weight diversity of a multi-path model per layer (Lin et al. 2022, Fig. 7).

    python -m fairseq_widearch.cli.plot_path_weights CHECKPOINT --out path_weights.png

For every multi-path sub-layer (attention and FFN of each layer, encoder and, if it has paths,
decoder) it reads the learnable path weights α_i of Eq. 4 and computes the paper's diversity

    |d| = |α1 − α2| / |α1 + α2|

(for n > 2 paths: the mean of |α_i − α_j| / |α_i + α_j| over the pairs of raw paths; the α of
the "more features" averages are left out). It draws |d| per layer, attention and FFN side by
side, and prints the table with the residual weight β.

Raises:
    SystemExit: if the checkpoint holds no multi-path sub-layer, or matplotlib is missing.
"""
import argparse
import itertools
import re
import sys
from typing import Dict, Tuple

import torch

import fairseq_widearch  # noqa: F401  (allows loading the plugin's checkpoints)
from fairseq_widearch.cli import existing_file, output
from fairseq_widearch.plotting import num_updates, pyplot

_FUSION = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn|ffn)\.fusion\.alpha$")
SUBLAYERS = {"self_attn": "attention", "encoder_attn": "cross-attention", "ffn": "FFN"}


def diversity(alpha: torch.Tensor, num_paths: int) -> float:
    """|d| of Fig. 7 over the first ``num_paths`` entries of α (mean over pairs when n > 2)."""
    pairs = list(itertools.combinations(alpha[:num_paths].double().tolist(), 2))
    return sum(abs(a - b) / abs(a + b) for a, b in pairs) / len(pairs)


def read_path_weights(state: dict) -> Dict[Tuple[str, str], Dict[int, Tuple[float, float]]]:
    """-> {(stack, sub-layer): {layer: (|d|, β)}} of a checkpoint's model state."""
    cfg, weights = state["cfg"]["model"], state["model"]
    result = {}
    for key, alpha in weights.items():
        match = _FUSION.match(key)
        if match:
            stack, layer, sublayer = match.groups()
            paths = getattr(cfg, f"{stack}_paths")
            if paths >= 2:
                beta = float(weights[key[: -len("alpha")] + "beta"])
                result.setdefault((stack, SUBLAYERS[sublayer]), {})[int(layer)] = (diversity(alpha, paths), beta)
    return result


def plot(weights, title: str, out: str):
    plt = pyplot()
    stacks = sorted({stack for stack, _ in weights}, reverse=True)  # encoder first
    fig, axes = plt.subplots(1, len(stacks), squeeze=False, figsize=(5.5 * len(stacks), 3.4), constrained_layout=True)
    for ax, stack in zip(axes[0], stacks):
        series = [(name, layers) for (s, name), layers in weights.items() if s == stack]
        width = 0.8 / len(series)
        for i, (name, layers) in enumerate(series):
            xs = sorted(layers)
            ax.bar([x + 1 + (i - (len(series) - 1) / 2) * width for x in xs], [layers[x][0] for x in xs], width,
                   label=name)
        ax.set_xlabel(f"{stack} layer")
        ax.set_ylabel("|d| = |α1 − α2| / |α1 + α2|")
        ax.set_xticks(range(1, max(max(layers) for _, layers in series) + 2))
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.savefig(out, dpi=120)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=existing_file, help="a multipath_transformer checkpoint")
    p.add_argument("--out", default="path_weights.png", type=output, help="PNG to write")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    state = torch.load(args.checkpoint, map_location="cpu")
    weights = read_path_weights(state)
    if not weights:
        sys.exit(f"error: {args.checkpoint} holds no multi-path sub-layer with learnable α and 2 or more paths")
    plot(weights, f"Path-weight diversity after {num_updates(state)} updates", args.out)
    print(f"| -> {args.out}")
    print("| stack | sub-layer | layer | |d| | β |\n|---|---|---|---|---|")
    for (stack, name), layers in weights.items():
        for layer, (d, beta) in sorted(layers.items()):
            print(f"| {stack} | {name} | {layer + 1} | {d:.4f} | {beta:.3f} |")


if __name__ == "__main__":
    main()
