"""Prune a latent-depth checkpoint to a stock fairseq pre-norm ``transformer``.

    python -m fairseq_widearch.cli.prune_latent_layers --checkpoint IN --out OUT [--threshold 0.5]
                                                       [--lang-pair xx-yy]

Keeps the layers whose posterior q(z_l = 1) = σ(α_l) exceeds the threshold (Li et al. 2020,
Sec. 3: deployment by pruning), renumbers them, drops the selection logits and writes a checkpoint
of fairseq's own ``transformer`` arch. Its config is stored as plain Python containers, so stock
fairseq loads it under torch's weights-only loading without this plugin; its translations equal
the latent model's with ``--latent-inference hard``. Optimizer state is not kept. A multilingual
model (one posterior per language pair) is pruned for the pair ``--lang-pair`` names; the pruned
model keeps the task config (``translation_multi_simple_epoch``, language tokens).

Raises:
    SystemExit: if the checkpoint is not a ``latent_depth_transformer``, is post-norm (a deselected
        post-norm layer still applies its LayerNorms, so dropping it would change the model), a
        stack would lose every layer, or ``--lang-pair`` is missing (multilingual) or unknown, with a
        message naming the file.
"""
import argparse
import re
import sys
from argparse import Namespace

import torch

import fairseq_widearch  # noqa: F401  (allows loading the plugin's checkpoints)
from fairseq_widearch.checkpoint_loading import save_derived_checkpoint
from fairseq_widearch.modules.layer_select import undecided_warning

from . import existing_file, number, output

STACKS = ("encoder", "decoder")


def kept_layers(state_dict, stack: str, threshold: float, posterior: int = 0):
    """Indices of the layers of ``stack`` with q(z = 1) > threshold under one posterior; all
    layers of a static stack."""
    logits = state_dict.get(f"{stack}.layer_select.logits")
    if logits is None:
        return sorted({int(m[1]) for k in state_dict if (m := re.match(rf"{stack}\.layers\.(\d+)\.", k))})
    return [i for i, q in enumerate(torch.sigmoid(logits[posterior]).tolist()) if q > threshold]


def posterior_index(checkpoint: str, model_args, lang_pair) -> int:
    """The posterior of ``lang_pair`` (0 for a bilingual model)."""
    pairs = [p for p in getattr(model_args, "latent_lang_pairs", "").split(",") if p]
    if not pairs:
        if lang_pair:
            sys.exit(f"error: {checkpoint} is bilingual (one posterior); drop --lang-pair")
        return 0
    if lang_pair not in pairs:
        sys.exit(f"error: {checkpoint} has one posterior per language pair; choose one of {pairs} with --lang-pair"
                 + (f" (got {lang_pair!r})" if lang_pair else ""))
    return pairs.index(lang_pair)


def warn_if_undecided(checkpoint: str, state_dict, stack: str, posterior: int):
    """Print a warning to stderr when ``stack``'s posterior is not near-discrete (pruning it cuts
    layers by chance); nothing for a static stack."""
    logits = state_dict.get(f"{stack}.layer_select.logits")
    message = None if logits is None else undecided_warning(torch.sigmoid(logits[posterior:posterior + 1].float()))
    if message:
        print(f"warning: {checkpoint}: {stack}: {message}", file=sys.stderr)


def prune_state_dict(state_dict, kept):
    """Drop the layers not in ``kept[stack]`` and the selection logits; renumber the rest."""
    out = {}
    for key, value in state_dict.items():
        if ".layer_select." in key:
            continue
        match = re.match(r"(encoder|decoder)\.layers\.(\d+)\.(.*)", key)
        if match is None:
            out[key] = value
        elif int(match[2]) in kept[match[1]]:
            out[f"{match[1]}.layers.{kept[match[1]].index(int(match[2]))}.{match[3]}"] = value
    return out


def prune(checkpoint: str, out: str, threshold: float = 0.5, lang_pair: str = None) -> dict:
    state = torch.load(checkpoint, map_location="cpu")
    cfg = state["cfg"]
    model_args = cfg["model"]
    arch = getattr(model_args, "arch", "")
    if not arch.startswith("latent_depth_transformer"):
        sys.exit(f"error: {checkpoint} holds a {arch!r} model, not a latent_depth_transformer")
    post_norm = [s for s in STACKS if not getattr(model_args, f"{s}_normalize_before")]
    if post_norm:
        sys.exit(f"error: {checkpoint}: the {' and '.join(post_norm)} is post-norm, where a deselected layer still "
                 "applies its LayerNorms, so pruning would change the model; decode it with "
                 "--model-overrides \"{'latent_inference': 'hard'}\" instead")
    posterior = posterior_index(checkpoint, model_args, lang_pair)
    kept = {stack: kept_layers(state["model"], stack, threshold, posterior) for stack in STACKS}
    for stack, layers in kept.items():
        if not layers:
            sys.exit(f"error: {checkpoint}: no {stack} layer has q(z = 1) > {threshold}; lower --threshold")
        warn_if_undecided(checkpoint, state["model"], stack, posterior)
    args = Namespace(**vars(model_args))
    for name in list(vars(args)):
        if name.startswith("latent_") or name.endswith("_latent_layer"):
            delattr(args, name)
    args.arch, args._name = "transformer", "transformer"
    args.encoder_layers, args.decoder_layers = len(kept["encoder"]), len(kept["decoder"])
    save_derived_checkpoint(state, args, prune_state_dict(state["model"], kept), out)
    return kept


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=existing_file, help="a latent_depth_transformer checkpoint")
    p.add_argument("--out", required=True, type=output, help="where to write the pruned transformer checkpoint")
    p.add_argument("--threshold", type=number(0, 1), default=0.5, help="keep layers with q(z = 1) above this")
    p.add_argument("--lang-pair", default=None, help="multilingual models: the language pair (e.g. en-de) to prune for")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    kept = prune(args.checkpoint, args.out, args.threshold, args.lang_pair)
    print(f"| kept encoder layers {kept['encoder']} and decoder layers {kept['decoder']} -> {args.out}")


if __name__ == "__main__":
    main()
