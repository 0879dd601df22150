"""Plot a WideNet model's expert load per block and its dropped-token rate (Xue et al. 2022).

    python -m fairseq_widearch.cli.plot_expert_load --checkpoint CKPT --data BIN [--subset valid]
        [--inference-routing] [--out expert_load.png]

Runs the model teacher-forced over ``--subset`` and reads, from its auxiliary outputs
(``moe_load``, ``moe_dropped``: one entry per routing call, i.e. per block, or per routing group
with ``--widenet-routing-groups``), the share of the token-to-expert assignments each expert
processed and the fraction of assignments dropped because an expert overflowed its capacity B
(``modules.moe.TopKRouter.capacity``: floor(C · k · N / E) − 1 under the default, released
routing; ceil(C · k · N / E) under ``--moe-routing ours``). By default the routers work as in training (router noise, capacity
factor C = ``--moe-capacity-factor``; dropout stays off); ``--inference-routing`` uses the inference
capacity (``--moe-eval-capacity-factor``, 0 = no limit, so nothing is dropped). Draws a heatmap
of the load (routing call × expert, a uniform router gives 1/E everywhere) and the dropped rate
per routing call, and prints both as a table.

Raises:
    SystemExit: if the checkpoint is not a WideNet (no routing calls), or matplotlib is missing.
"""
import argparse
import sys
from typing import List, Tuple

import torch
from fairseq import checkpoint_utils

import fairseq_widearch  # noqa: F401  (registers the plugin, allows loading checkpoints)
from fairseq_widearch.experiments.data import batches
from fairseq_widearch.modules.moe import TopKRouter
from fairseq_widearch.plotting import pyplot

from . import check_subset, existing_dir, existing_file, output, whole


def call_labels(name: str, stack, calls: int) -> List[str]:
    """Names of a stack's routing calls: its block, or its routing group's blocks."""
    groups = getattr(stack, "routing_groups", 0)
    size = len(stack.layers) // groups if groups else 1
    return [f"{name} {i * size + 1}" + (f"-{(i + 1) * size}" if size > 1 else "") for i in range(calls)]


def routing_statistics(model, samples: list) -> Tuple[List[str], torch.Tensor, torch.Tensor]:
    """-> (routing-call labels, load share ``(calls, E)``, dropped fraction ``(calls,)``) over ``samples``."""
    kept = total = labels = None
    with torch.no_grad():
        for sample in samples:
            net_input = sample["net_input"]
            encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
            _, extra = model.decoder(net_input["prev_output_tokens"], encoder_out=encoder_out)
            outputs = [("encoder", model.encoder, encoder_out), ("decoder", model.decoder, extra)]
            labels = [label for name, stack, out in outputs
                      for label in call_labels(name, stack, len(out.get("moe_load", [])))]
            loads = torch.stack([load for _, _, out in outputs for load in out.get("moe_load", [])])
            dropped = torch.stack([d for _, _, out in outputs for d in out.get("moe_dropped", [])]).float()
            assignments = loads.sum(1) / (1 - dropped).clamp(min=1e-9)  # kept + dropped
            kept = loads if kept is None else kept + loads
            total = assignments if total is None else total + assignments
    return labels, kept / kept.sum(1, keepdim=True), 1 - kept.sum(1) / total


def plot(labels, load, dropped, title: str, out: str):
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 0.35 * len(labels) + 1.8), constrained_layout=True,
                                      gridspec_kw={"width_ratios": [max(load.size(1), 2), 3]})
    image = left.imshow(load.numpy(), aspect="auto", cmap="viridis", vmin=0)
    left.set_yticks(range(len(labels)), labels)
    left.set_xticks(range(load.size(1)), [str(e + 1) for e in range(load.size(1))])
    left.set_xlabel("expert")
    left.set_title(f"load share (uniform = 1/{load.size(1)})", fontsize=9)
    fig.colorbar(image, ax=left)
    right.barh(range(len(labels)), (100 * dropped).numpy())
    right.set_yticks(range(len(labels)), labels)
    right.invert_yaxis()
    right.set_xlabel("dropped assignments (%)")
    right.set_title("over capacity", fontsize=9)
    right.grid(axis="x", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.savefig(out, dpi=120)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=existing_file, help="a widenet checkpoint")
    p.add_argument("--data", required=True, type=existing_dir, help="fairseq data directory of the checkpoint's dictionaries")
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-sentences", type=whole(0, "0: all"), default=0, help="first N sentences only (0: all)")
    p.add_argument("--inference-routing", action="store_true", help="route as at inference (eval capacity)")
    p.add_argument("--out", default="expert_load.png", type=output, help="PNG to write")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    check_subset(p, args.data, args.subset)
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([args.checkpoint], arg_overrides={"data": args.data})
    routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
    if not routers:
        sys.exit(f"error: {args.checkpoint} holds a {model.__class__.__name__}, which has no MoE router")
    model.eval()
    for router in routers:
        router.train(not args.inference_routing)
    labels, load, dropped = routing_statistics(model, batches(task, args.subset, args.max_sentences))
    routing = "inference" if args.inference_routing else "training"
    plot(labels, load, dropped, f"Expert load on {args.subset} ({routing} routing)", args.out)
    print(f"| -> {args.out}")
    print("| routing call | " + " | ".join(f"expert {e + 1}" for e in range(load.size(1))) + " | dropped |")
    print("|---" * (load.size(1) + 2) + "|")
    for label, row, d in zip(labels, load.tolist(), dropped.tolist()):
        print(f"| {label} | " + " | ".join(f"{v:.3f}" for v in row) + f" | {100 * d:.2f}% |")


if __name__ == "__main__":
    main()
