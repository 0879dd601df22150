"""Export one sub-Transformer of a ``scalable_transformer`` checkpoint as a self-contained checkpoint.

    python -m fairseq_widearch.cli.export_subnet --checkpoint IN --width W [--layer-widths w1,...,w12] --out OUT

The exported checkpoint holds only the cropped tensors (Gao et al. 2021, Sec. 3.2: the top-left
blocks of every weight; Eq. 5 for the I/O projections), contiguous, in a ``scalable_transformer``
built at those dimensions (``--exported-width`` / ``--exported-layer-widths`` in its config), so
``fairseq-generate --user-dir fairseq_widearch`` decodes it like the parent at that width, without
the parent. Its parameter count equals ``python -m fairseq_widearch.cli.stats --eval-width W``'s.
Type-1: ``--width C`` alone. Type-2: ``--width M_max --layer-widths D^1,...,D^12`` (encoder layers
then decoder layers). Optimizer state is not kept.

Raises:
    SystemExit: if the checkpoint is not a ``scalable_transformer`` or a width is invalid, with a
        message naming the file or the flag.
"""
import argparse
import sys
from argparse import Namespace
from typing import List, Optional

import torch
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_widearch  # noqa: F401  (registers the arch, allows loading checkpoints)
from fairseq_widearch.checkpoint_loading import save_derived_checkpoint
from fairseq_widearch.model_builder import dummy_dictionary
from fairseq_widearch.modules.sub_transformers import width_set

from . import existing_file, output, whole, widths

#: Parameters of the exported model that alias another one (the tied output embedding).
TIED = {"decoder.output_projection.weight"}


def build(model_args: Namespace, src_vocab: int, tgt_vocab: int):
    """The model ``model_args`` describe, on dictionaries of these sizes."""
    task = Namespace(source_dictionary=dummy_dictionary(src_vocab), target_dictionary=dummy_dictionary(tgt_vocab))
    return ARCH_MODEL_REGISTRY["scalable_transformer"].build_model(Namespace(**vars(model_args)), task)


def exported_args(model_args: Namespace, width: int, layer_widths: List[int]) -> Namespace:
    """The parent's flags, with the layers built at width C = ``width`` and D^i = ``layer_widths``;
    without I/O projections the embedding itself is cropped, so M_max becomes C."""
    args = Namespace(**vars(model_args))
    args.exported_width = width
    args.exported_layer_widths = "" if set(layer_widths) == {width} else ",".join(map(str, layer_widths))
    args.scalable_widths = ",".join(str(w) for w in width_set(model_args) if w <= width) or str(width)
    if args.no_io_projections:
        args.exported_from_width = getattr(model_args, "exported_from_width", 0) or model_args.encoder_embed_dim
        for name in ("encoder_embed_dim", "decoder_embed_dim", "decoder_input_dim", "decoder_output_dim"):
            setattr(args, name, width)
    if not args.exported_layer_widths:  # type-1: record the sub-Transformer's own FFN and head counts
        args.encoder_ffn_embed_dim = args.decoder_ffn_embed_dim = 4 * width
        args.encoder_attention_heads = args.decoder_attention_heads = width // 64
    return args


def export_model(parent, model_args: Namespace):
    """A model built at the dimensions of ``parent``'s active sub-Transformer, holding its
    cropped tensors (copied, contiguous), and the flags it was built from."""
    args = exported_args(model_args, parent.encoder.width, [layer.self_attn.active_dim for layer in parent.all_layers()])
    exported = build(args, parent.encoder.embed_tokens.num_embeddings, parent.decoder.embed_tokens.num_embeddings)
    # the stacks' version buffers too: without them fairseq's upgrade path (run by load_state_dict)
    # takes the state for a pre-0.9 one and drops the pre-norm final LayerNorms
    versions = {k: v for k, v in parent.state_dict().items() if k.endswith(".version")}
    missing, unexpected = exported.load_state_dict({**parent.sub_transformer_state_dict(), **versions}, strict=False)
    assert set(missing) <= TIED and not unexpected, (missing, unexpected)  # same names, same shapes
    return exported, args


def export(checkpoint: str, out: str, width: int, layer_widths: Optional[List[int]] = None):
    """Write the sub-Transformer (``width``, ``layer_widths``) of ``checkpoint`` to ``out``.

    Returns:
        the exported model (eval mode) and its parameter count (tied tensors counted once).

    Raises:
        SystemExit: see the module docstring.
    """
    state = torch.load(checkpoint, map_location="cpu")
    model_args = state["cfg"]["model"]
    if ARCH_MODEL_REGISTRY.get(getattr(model_args, "arch", "")) is not ARCH_MODEL_REGISTRY["scalable_transformer"]:
        sys.exit(f"error: {checkpoint} holds a {getattr(model_args, 'arch', None)!r} model, not a scalable_transformer")
    model = state["model"]
    parent = build(model_args, model["encoder.embed_tokens.weight"].size(0), model["decoder.embed_tokens.weight"].size(0))
    parent.load_state_dict(model)
    try:
        parent.set_sample_config(width, layer_widths)
    except ValueError as error:
        sys.exit(f"error: --width {width} / --layer-widths {layer_widths}: {error}")
    exported, args = export_model(parent, model_args)
    save_derived_checkpoint(state, args, exported.state_dict(), out)
    return exported.eval(), parent.sub_transformer_num_params()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=existing_file, help="a scalable_transformer checkpoint")
    p.add_argument("--width", type=whole(1), required=True, help="C, the sub-Transformer's width (type-1: D^i = C)")
    p.add_argument("--layer-widths", default=None, type=widths,
                   help="type-2: D^i of every encoder then decoder layer, comma-separated (C is then normally M_max)")
    p.add_argument("--out", required=True, type=output, help="where to write the exported checkpoint")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    layer_widths = args.layer_widths
    _, num_params = export(args.checkpoint, args.out, args.width, layer_widths)
    print(f"| exported width {args.width}" + (f" layer widths {layer_widths}" if layer_widths else "")
          + f": {num_params:,} parameters -> {args.out}")


if __name__ == "__main__":
    main()
