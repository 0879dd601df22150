"""Convert a checkpoint whose model is a standard Transformer to a CTranslate2 model directory.

    python -m fairseq_widearch.cli.export_ctranslate2 --checkpoint CKPT --data DATA_BIN --out DIR
                                                      [--quantization int8] [--force]

Two of the plugin's designs end in a standard Transformer, which is what CTranslate2 serves:

* a **pruned latent-depth model** (``python -m fairseq_widearch.cli.prune_latent_layers``; Li et
  al. 2020, Sec. 3), a stock fairseq ``transformer`` whose config is stored as plain containers,
  which CTranslate2's own fairseq converter cannot read;
* a **scalable sub-Transformer export** (``python -m fairseq_widearch.cli.export_subnet``; Gao et
  al. 2021, Sec. 3.2), type-1 of both variants: with the input/output projections W'_e, W'_o
  (Eqs. 3-5) or I/O-cropped (embedding scale √M_max, the first C channels of M_max's sinusoids).
  A type-2 export converts when all its layers have one attention width D (CTranslate2's
  Transformer spec has one head count per model); per-layer widths are refused.

Built on CTranslate2's spec API and its fairseq converter's layer setters (the layers keep
fairseq's parameter names). The parts outside the layers are affine, so they are folded into the
tables CTranslate2 has: the token table is the embedding as the stack's input sees it (scaled,
through W'_e), the position table likewise (without W'_e's bias), and the output projection is the
decoder's whole map from its final features to the logits (through W'_o and the tied embedding,
with a bias). ``--data``: the directory with the ``dict.*.txt`` the model was trained on.

The source side takes BPE tokens without the end-of-sentence token (CTranslate2 appends it, as
fairseq does); the target starts from ``</s>``, as fairseq's decoder does.

Raises:
    SystemExit: for any other checkpoint (multi-path, WideNet and PartialFormer layers, which
        CTranslate2 has no layer for; an unpruned latent-depth model; a scalable parent that was
        not exported), naming the file and what to do.
"""
import argparse
import sys
from typing import Optional

import torch

import fairseq_widearch  # noqa: F401  (registers the archs, allows loading the plugin's checkpoints)
from fairseq_widearch.modules.slimmable import HEAD_DIM

from . import existing_dir, existing_file, output

#: Why a plugin model is not a standard Transformer, by model class name.
NO_CTRANSLATE2_LAYER = {
    "MultiPathTransformerModel": "its layers run n parallel attention and FFN paths fused with PathNorm "
                                 "(Lin et al. 2022, Eqs. 4-7)",
    "WideNetModel": "its layers share attention and route tokens to mixture-of-experts FFNs (Xue et al. 2022)",
    "PartialFormerModel": "its layers gate heads through PG-FFNs and add global attention logits "
                          "(Zheng et al., Eqs. 5-6)",
}
ACTIVATIONS = ("relu", "gelu")


def refusal(model, cfg) -> Optional[str]:
    """Why ``model`` (built from config ``cfg``) cannot become a CTranslate2 Transformer, or None."""
    name = type(model).__name__
    arch = getattr(cfg, "arch", name)
    if name in NO_CTRANSLATE2_LAYER:
        return f"a {arch} model: CTranslate2 has no layer for it ({NO_CTRANSLATE2_LAYER[name]})"
    if name == "LatentDepthTransformerModel":
        return ("an unpruned latent-depth model: prune it to a stock Transformer first "
                "(python -m fairseq_widearch.cli.prune_latent_layers)")
    if name == "ScalableTransformerModel":
        if not getattr(cfg, "exported_width", 0):
            return ("a scalable parent model: export the sub-Transformer to serve first "
                    "(python -m fairseq_widearch.cli.export_subnet --width C)")
        widths = sorted({layer.self_attn.max_dim for layer in [*model.encoder.layers, *model.decoder.layers]})
        if len(widths) > 1:
            return (f"a type-2 sub-Transformer with per-layer attention widths {widths}: CTranslate2's Transformer "
                    f"spec has one head count for all layers (D / 64 heads here differ by layer)")
    elif name not in ("TransformerModel", "TransformerAlignModel"):
        return f"a {arch} model ({name}), not a standard Transformer"
    if getattr(cfg, "activation_fn", "relu") not in ACTIVATIONS:
        return f"--activation-fn {cfg.activation_fn}: only {', '.join(ACTIVATIONS)} are converted"
    if _pre_norm(model.encoder) != _pre_norm(model.decoder):
        return "pre-norm on one side and post-norm on the other: CTranslate2 takes one for the whole model"
    if model.encoder.embed_positions is None or model.decoder.embed_positions is None:
        return "a model without positional embeddings"
    return None


def _pre_norm(stack) -> bool:
    return stack.layers[0].normalize_before


def _heads(stack) -> tuple:
    """(heads, head dimension) of the stack's self-attention."""
    attn = stack.layers[0].self_attn
    if hasattr(attn, "active_dim"):  # scalable: D / 64 heads of 64 (Sec. 3.2)
        return attn.active_dim // HEAD_DIM, HEAD_DIM
    return attn.num_heads, attn.head_dim


def input_tables(stack, padding_idx: int):
    """``(tokens (V, C), positions (P, C))`` as the stack's first layer sees them: the embedding
    scaled (and through fairseq's ``project_in_dim``, which comes before the positions), then both
    through the scalable input projection W'_e (the positions without its bias; identity for a
    stock stack)."""
    project = getattr(stack, "project_in", lambda x: x)
    tokens = stack.embed_scale * stack.embed_tokens.weight
    if getattr(stack, "project_in_dim", None) is not None:
        tokens = stack.project_in_dim(tokens)
    tokens = project(tokens)
    max_positions = stack.max_positions()
    dummy = torch.full((1, max_positions), padding_idx + 1)  # any non-padding token
    positions = stack.embed_positions(dummy)[0]
    positions = project(positions) - project(torch.zeros_like(positions[:1]))
    return tokens, positions


def output_map(decoder, width: int):
    """``(weight (V, C), bias (V))`` of the decoder's map from its final features to the logits
    (the scalable W'_o and the tied, possibly cropped, embedding; the output projection of a stock one)."""
    def logits(h):
        if decoder.project_out_dim is not None:
            h = decoder.project_out_dim(h)
        return decoder.output_layer(h)

    bias = logits(torch.zeros(1, width))
    return (logits(torch.eye(width)) - bias).t(), bias[0]


def _fill_stack(spec, stack, padding_idx: int):
    from ctranslate2.converters import fairseq as ct2_fairseq
    tokens, positions = input_tables(stack, padding_idx)
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = tokens.numpy()
    spec.position_encodings.encodings = positions.numpy()
    spec.scale_embeddings = False  # folded into the table
    set_layer = (ct2_fairseq.set_transformer_decoder_layer if hasattr(spec, "projection")
                 else ct2_fairseq.set_transformer_encoder_layer)
    for layer_spec, layer in zip(spec.layer, stack.layers):
        set_layer(layer_spec, layer)
    if stack.layer_norm is not None:
        ct2_fairseq.set_layer_norm(spec.layer_norm, stack.layer_norm)
    if stack.layernorm_embedding is not None:
        ct2_fairseq.set_layer_norm(spec.layernorm_embedding, stack.layernorm_embedding)


def _vocabulary(dictionary):
    return ["<blank>" if token == "<pad>" else token for token in dictionary.symbols]  # CTranslate2's pad name


def build_spec(model, cfg, src_dict, tgt_dict):
    """The ``ctranslate2.specs.TransformerSpec`` of ``model`` (fp32 weights; see the module docstring)."""
    from ctranslate2.specs import common_spec, transformer_spec
    activation = common_spec.Activation[getattr(cfg, "activation_fn", "relu").upper()]  # one of ACTIVATIONS
    pre_norm = _pre_norm(model.encoder)

    def stack_spec(spec_class, stack):
        heads, head_dim = _heads(stack)
        return spec_class(len(stack.layers), heads, pre_norm=pre_norm, activation=activation,
                          no_final_norm=stack.layer_norm is None,
                          layernorm_embedding=stack.layernorm_embedding is not None, head_dim=head_dim)

    spec = transformer_spec.TransformerSpec(stack_spec(transformer_spec.TransformerEncoderSpec, model.encoder),
                                            stack_spec(transformer_spec.TransformerDecoderSpec, model.decoder))
    with torch.no_grad():
        _fill_stack(spec.encoder, model.encoder, src_dict.pad())
        _fill_stack(spec.decoder, model.decoder, tgt_dict.pad())
        weight, bias = output_map(model.decoder, spec.decoder.embeddings.weight.shape[1])
        spec.decoder.projection.weight, spec.decoder.projection.bias = weight.numpy(), bias.numpy()
    spec.register_source_vocabulary(_vocabulary(src_dict))
    spec.register_target_vocabulary(_vocabulary(tgt_dict))
    spec.config.decoder_start_token = spec.config.eos_token  # fairseq's decoder starts from </s>
    spec.config.add_source_eos = True
    return spec


def load(checkpoint: str, data: str):
    """``(model (eval, fp32, CPU), model config, task)`` as fairseq-generate loads them."""
    from fairseq import checkpoint_utils
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    return models[0].float().eval(), cfg.model, task


def export(checkpoint: str, data: str, out: str, quantization: Optional[str] = None, force: bool = False) -> str:
    """Convert ``checkpoint`` to a CTranslate2 model in ``out``; returns ``out``."""
    import ctranslate2

    model, cfg, task = load(checkpoint, data)
    reason = refusal(model, cfg)
    if reason:
        sys.exit(f"error: {checkpoint} holds {reason}")

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return build_spec(model, cfg, task.source_dictionary, task.target_dictionary)

    return _Converter().convert(out, quantization=quantization, force=force)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=existing_file,
                   help="a pruned latent-depth or exported scalable checkpoint")
    p.add_argument("--data", required=True, type=existing_dir, help="the directory with the model's dict.*.txt")
    p.add_argument("--out", required=True, type=output, help="the CTranslate2 model directory to write")
    p.add_argument("--quantization", default=None,
                   help="CTranslate2 weight type: int8, int8_float32, int8_float16, int16, float16, bfloat16 "
                        "(default: the weights as they are, fp32)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    print(export(args.checkpoint, args.data, args.out, args.quantization, args.force))


if __name__ == "__main__":
    main()
