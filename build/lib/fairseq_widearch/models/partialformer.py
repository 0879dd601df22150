"""PartialFormer (Zheng et al., "PartialFormer: Modeling Part Instead of Whole for Machine
Translation").

A pre-norm Transformer without separate FFN sub-layers: the FFN moves inside the attention heads
(PG-FFN, Eq. 5), so attention and FFN fuse into one "AFFN" sub-layer (Sec. 3):

    encoder layer:  x ← x + SelfAFFN(LN(x))
    decoder layer:  x ← x + CausalSelfAFFN(LN(x));  x ← x + CrossAFFN(LN(x), encoder_out)

with the decoder's PG-FFN hidden size halved (r = 2 instead of 4), residual-like attention (Eq. 6:
global logits A^G computed once per stack from its input embeddings, added to every layer's
logits) and head scaling (Sec. 3.4: H_0 = ``--*-attention-heads`` Q/K heads expanded to H =
``--*-heads`` heads). The blocks are in ``fairseq_widearch.modules.partial_attention``.

A^G of the decoder (paper summary Sec. 5 items 1-2, docs/partialformer.md): its causal
self-attention gets a map from the target embeddings with its own Q/K, the causal mask added after
the sum, its keys cached while decoding. Its cross-attention gets none by default, as in the
released code (Table 5's MACs and the parameter counts fit that); ``--cross-global-attention``
adds one with queries from the target embeddings and keys from the *source* embeddings (the
encoder passes them on as ``source_embedding``), computed once per sentence when decoding.
"""
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, base_architecture
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from ..modules.encoder_layer import EncoderLayer
from ..modules.partial_attention import GATE_ACTIVATIONS, PGFFN, GlobalAttentionLogits, PartialAttention, qkv_gain
from ..validation import reject_unapplied, require, require_positive
from .base import (
    LayerLoopDecoder,
    LayerLoopEncoder,
    WideTransformerModel,
    added_defaults,
    alignment_weights,
    wrap_layer,
)
from .presets import MULTI30K_BODY, register_preset, set_defaults

STACKS = ("both", "encoder", "decoder")
#: Initialisations (docs/partialformer.md, "Initialisation").
INITS = ("released", "ours")


@dataclass
class PartialFormerConfig(TransformerConfig):
    """Flags of ``partialformer`` on top of fairseq's ``TransformerConfig``. H_0, the Q/K heads,
    is fairseq's ``--encoder-attention-heads`` / ``--decoder-attention-heads``."""

    encoder_heads: int = field(
        default=0, metadata={"help": "H, encoder heads of V, the gates and W^O (Sec. 3.4 head scaling: Q/K logits of "
                                     "the H_0 = --encoder-attention-heads heads expanded to H); 0 = H_0, no head scaling"}
    )
    decoder_heads: int = field(default=0, metadata={"help": "H of the decoder's self- and cross-AFFN; 0 = H_0"})
    encoder_head_dim: int = field(default=0, metadata={"help": "d_k of the encoder heads; 0 = d / H_0"})
    decoder_head_dim: int = field(default=0, metadata={"help": "d_k of the decoder heads; 0 = d / H_0"})
    encoder_pg_ffn_ratio: int = field(default=4, metadata={"help": "r: encoder PG-FFN d_k -> r·d_k -> d_k (Eq. 5)"})
    decoder_pg_ffn_ratio: int = field(
        default=2, metadata={"help": "r of the decoder's PG-FFNs (halved, Sec. 3.2; 4 = not halved)"}
    )
    head_gate_activation: ChoiceEnum(GATE_ACTIVATIONS) = field(
        default="relu", metadata={"help": "σ of the head gates G_i = σ(X W_i^G) (Eq. 5; Table 7: relu, sigmoid, tanh)"}
    )
    no_pg_ffn: bool = field(
        default=False, metadata={"help": "drop the PG-FFNs and their gates (Table 7 'w/o Partial-level Gated FFN')"}
    )
    no_head_gates: bool = field(default=False, metadata={"help": "PG-FFNs without the head gates G_i"})
    pg_ffn_as_printed: bool = field(
        default=False, metadata={"help": "G_i ⊙ FFN(head_i), Eq. 5 as printed; by default G_i ⊙ (head_i + FFN(head_i)) "
                                         "as the authors' released code computes it (Fig. 2 omits residuals)"}
    )
    partialformer_init: ChoiceEnum(INITS) = field(
        default="released", metadata={"help": "initialisation: released (the authors' code: nn.Linear's biases on Q/K/V, "
                                          "W^G and A^G, W^G Xavier with the Q/K/V gain) or ours (zero biases, W^G "
                                          "nn.Linear's with bias 1); docs/partialformer.md, 'Initialisation'"}
    )
    head_gate_bias_init: Optional[float] = field(
        default=None, metadata={"help": "initial bias of the gate projections W^G (Eq. 5), overriding "
                                        "--partialformer-init's (released: nn.Linear's; ours: 1, open ReLU gates)"}
    )
    no_global_attention_norm: bool = field(
        default=False, metadata={"help": "A^G (Eq. 6) from the raw embeddings, as printed; by default from "
                                         "LayerNorm-ed embeddings, as the released code does"}
    )
    no_global_attention: bool = field(
        default=False, metadata={"help": "drop residual-like attention A^G (Eq. 6; Table 7 'w/o Residual-like "
                                         "Attention Calculation')"}
    )
    cross_global_attention: bool = field(
        default=False, metadata={"help": "A^G in the decoder's cross-attention too: target-embedding queries, "
                                         "source-embedding keys (off: the released code, Table 5's MACs)"}
    )
    partialformer_stacks: ChoiceEnum(STACKS) = field(
        default="both", metadata={"help": "PartialFormer layers in both stacks, the encoder only or the decoder only "
                                          "(Table 7 rows 7-8; the other stack is a pre-norm Transformer)"}
    )


_PARTIALFORMER_DEFAULTS = added_defaults(PartialFormerConfig)


def is_partial(cfg, side: str) -> bool:
    return cfg.partialformer_stacks in ("both", side)


def head_sizes(cfg, side: str):
    """(d, H_0, H, d_k) of one stack."""
    d, qk_heads = getattr(cfg, f"{side}_embed_dim"), getattr(cfg, f"{side}_attention_heads")
    heads, head_dim = getattr(cfg, f"{side}_heads") or qk_heads, getattr(cfg, f"{side}_head_dim") or d // qk_heads
    return d, qk_heads, heads, head_dim


def build_affn(cfg, side: str, self_attention: bool) -> PartialAttention:
    """The attention + PG-FFN of one AFFN sub-layer of ``side`` (``encoder``/``decoder``)."""
    d, qk_heads, heads, head_dim = head_sizes(cfg, side)
    kdim = d if self_attention else cfg.encoder_embed_dim
    released = cfg.partialformer_init == "released"
    pg_ffn = None
    if not cfg.no_pg_ffn:
        gate_bias = cfg.head_gate_bias_init if cfg.head_gate_bias_init is not None else (None if released else 1.0)
        pg_ffn = PGFFN(d, heads, head_dim, getattr(cfg, f"{side}_pg_ffn_ratio") * head_dim,
                       None if cfg.no_head_gates else cfg.head_gate_activation, not cfg.pg_ffn_as_printed,
                       cfg.activation_dropout, gate_bias, qkv_gain(d, kdim) if released else None)
    return PartialAttention(d, qk_heads, heads, head_dim, pg_ffn, kdim=kdim, dropout=cfg.attention_dropout,
                            self_attention=self_attention, zero_bias=not released)


def build_global_logits(cfg, side: str, self_attention: bool = True) -> GlobalAttentionLogits:
    d, _, heads, head_dim = head_sizes(cfg, side)
    return GlobalAttentionLogits(d, heads, head_dim, self_attention, kdim=None if self_attention else cfg.encoder_embed_dim,
                                 normalize=not cfg.no_global_attention_norm,
                                 zero_bias=cfg.partialformer_init != "released")


class PartialEncoderLayer(EncoderLayer):
    """One pre-norm Self-AFFN sub-layer, the whole encoder layer: ``x + Dropout(SelfAFFN(LN(x)))``."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn_layer_norm = LayerNorm(cfg.encoder_embed_dim)
        self.self_attn = build_affn(cfg, "encoder", self_attention=True)
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor], global_logits: Optional[Tensor]) -> Tensor:
        """x ``(src_len, B, d)``, padding_mask ``(B, src_len)``, A^G ``(B, H, src_len, src_len)``."""
        h, _ = self.self_attn(self.self_attn_layer_norm(x), key_padding_mask=padding_mask, global_logits=global_logits)
        return x + self.dropout_module(h)


class PartialDecoderLayer(EncoderLayer):
    """Pre-norm causal Self-AFFN then Cross-AFFN, each with its own PG-FFN (hidden r = 2 by default)."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn_layer_norm = LayerNorm(cfg.decoder_embed_dim)
        self.self_attn = build_affn(cfg, "decoder", self_attention=True)
        self.encoder_attn_layer_norm = LayerNorm(cfg.decoder_embed_dim)
        self.encoder_attn = build_affn(cfg, "decoder", self_attention=False)
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)

    def forward(self, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                self_attn_padding_mask, global_self: Optional[Tensor], global_cross: Optional[Tensor],
                need_head_weights: bool = False):
        """x ``(tgt_len, B, d)``, encoder_out ``(src_len, B, d_enc)``, A^G maps ``(B, H, tgt_len, ·)`` ->
        ``(x, Cross-AFFN attention weights (H, B, tgt_len, src_len) if need_head_weights else None)``."""
        h, _ = self.self_attn(self.self_attn_layer_norm(x), key_padding_mask=self_attn_padding_mask,
                              attn_mask=self_attn_mask, global_logits=global_self, incremental_state=incremental_state)
        x = x + self.dropout_module(h)
        h, attn = self.encoder_attn(self.encoder_attn_layer_norm(x), encoder_out, key_padding_mask=encoder_padding_mask,
                                    global_logits=global_cross, incremental_state=incremental_state,
                                    need_head_weights=need_head_weights)
        return x + self.dropout_module(h), attn


def _cross_global(cfg) -> bool:
    return is_partial(cfg, "decoder") and not cfg.no_global_attention and cfg.cross_global_attention


class PartialFormerEncoder(LayerLoopEncoder):
    """Encoder of Self-AFFN layers sharing one A^G (or, ``--partialformer-stacks decoder``,
    fairseq's pre-norm layers). Passes its input embeddings on as ``source_embedding``
    ``(src_len, B, d)`` when the decoder's cross-attention needs A^G."""

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.partial, self.export_embedding = is_partial(cfg, "encoder"), _cross_global(cfg)
        self.global_logits = build_global_logits(cfg, "encoder") if self.partial and not cfg.no_global_attention else None

    def build_encoder_layer(self, cfg):
        return wrap_layer(PartialEncoderLayer(cfg), cfg) if is_partial(cfg, "encoder") else super().build_encoder_layer(cfg)

    def run_layers(self, x, padding_mask, states, src_tokens):
        mask = padding_mask if padding_mask.any() else None
        embedding = x
        # A^G once from the input embeddings (Eq. 6); fairseq's own layers take no A^G
        layer_args = (self.global_logits(x) if self.global_logits is not None else None,) if self.partial else ()
        for layer in self.layers:
            x = layer(x, mask, *layer_args)
            if states is not None:
                states.append(x)
        return x, {"source_embedding": [embedding]} if self.export_embedding else {}

    def reorder_encoder_out(self, encoder_out, new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if "source_embedding" in encoder_out:  # T x B x C, per sentence
            reordered["source_embedding"] = [encoder_out["source_embedding"][0].index_select(1, new_order)]
        return reordered


class PartialFormerDecoder(LayerLoopDecoder):
    """Decoder of Self-AFFN + Cross-AFFN layers; A^G of both computed once per forward (per step
    when decoding, from the cached keys)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.global_self = None if cfg.no_global_attention else build_global_logits(cfg, "decoder")
        self.global_cross = build_global_logits(cfg, "decoder", self_attention=False) if _cross_global(cfg) else None

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(PartialDecoderLayer(cfg), cfg)

    def run_layers(self, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                   self_attn_padding_mask, padding_mask, inner_states, encoder_aux, alignment_layer):
        global_self = self.global_self(x, incremental_state=incremental_state) if self.global_self else None
        global_cross = None
        if self.global_cross is not None:
            global_cross = self.global_cross(x, encoder_aux["source_embedding"][0], incremental_state)
        aux = {}
        for i, layer in enumerate(self.layers):
            x, attn = layer(x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                            self_attn_padding_mask, global_self, global_cross, i == alignment_layer)
            aux.update(alignment_weights(attn))
            inner_states.append(x)
        return x, aux


def upgrade_legacy_args(args):
    """A checkpoint saved before the released code's form became the default (its config has
    ``pg_ffn_inner_residual``) is rebuilt as it was trained: Eq. 5 as printed unless that flag was
    set, A^G from the raw embeddings (no LayerNorm parameters in the checkpoint)."""
    if hasattr(args, "pg_ffn_inner_residual"):
        args.pg_ffn_as_printed = not args.pg_ffn_inner_residual
        args.no_global_attention_norm = True
        del args.pg_ffn_inner_residual


def validate_partialformer_config(args):
    """Raise ``ValueError`` naming the flag and value of the first invalid setting."""
    for side in ("encoder", "decoder"):
        require_positive(args, f"{side}_embed_dim", f"{side}_layers", f"{side}_attention_heads")
        d, qk_heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
        heads, head_dim = getattr(args, f"{side}_heads"), getattr(args, f"{side}_head_dim")
        require(heads >= 0 and head_dim >= 0, f"--{side}-heads and --{side}-head-dim must be >= 0 (0 = default), "
                                              f"got {heads} and {head_dim}")
        require(head_dim or d % qk_heads == 0,
                f"--{side}-embed-dim {d} is not a multiple of --{side}-attention-heads {qk_heads} (d_k = d / H_0 "
                f"unless --{side}-head-dim is given)")
        require(heads == 0 or heads >= qk_heads,
                f"--{side}-heads {heads} must be >= --{side}-attention-heads {qk_heads} (H >= H_0, Sec. 3.4)")
        if is_partial(args, side) and not args.no_pg_ffn:
            require_positive(args, f"{side}_pg_ffn_ratio")
        if not is_partial(args, side):
            require_positive(args, f"{side}_ffn_embed_dim")
    reject_unapplied(args, "partialformer", "quant_noise_pq", "cross_self_attention")
    require(args.activation_fn == "relu" or args.no_pg_ffn,
            f"--activation-fn {args.activation_fn}: the PG-FFNs use ReLU (Eq. 5); leave it out")
    require(args.encoder_normalize_before and args.decoder_normalize_before,
            "partialformer is pre-norm (Fig. 2): --encoder-normalize-before and --decoder-normalize-before are required")


@register_model("partialformer")
class PartialFormerModel(WideTransformerModel):
    """PartialFormer. Flags: ``PartialFormerConfig``; presets ``partialformer_{6_6_d512_h24_16,
    24_6_d512_h24_16, 24_6_d360_h24_16, 24_6_d360_h30_16, 24_6_d360_h8_8, 24_6_d320_h24_24, multi30k, tiny}``."""

    config = PartialFormerConfig
    encoder_class = PartialFormerEncoder
    decoder_class = PartialFormerDecoder
    paper_preset = "partialformer_24_6_d360_h30_16"

    base_preset = staticmethod(lambda args: partialformer(args))  # registered below
    validate = staticmethod(validate_partialformer_config)

    @classmethod
    def build_model(cls, args, task):
        upgrade_legacy_args(args)
        return super().build_model(args, task)

    @classmethod
    def decoder_class_for(cls, cfg):
        return cls.decoder_class if is_partial(cfg, "decoder") else TransformerDecoderBase


@register_model_architecture("partialformer", "partialformer")
def partialformer(args):
    """Base preset: Table 12's body (pre-norm, all dropouts 0.1, shared vocabulary), d = 512,
    H_0 = 8 Q/K heads (d_k = 64), 6+6 layers, no head scaling."""
    set_defaults(args, **_PARTIALFORMER_DEFAULTS, encoder_normalize_before=True, decoder_normalize_before=True,
                 share_all_embeddings=True, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
    base_architecture(args)


def paper_preset(name: str, layers: int, dim: int, encoder_heads: int, decoder_heads: int, source: str):
    """Register the paper's model ``name``: ``layers`` encoder layers, 6 decoder layers, width ``dim``,
    H = ``encoder_heads``-``decoder_heads`` over H_0 = 8 Q/K heads (d_k = d / 8)."""
    register_preset("partialformer", name, partialformer,
                    f"PartialFormer {name[len('partialformer_'):].replace('_', ' ')} ({source}): {layers}-6 layers, "
                    f"d = {dim}, d_k = {dim // 8}, H = {encoder_heads}-{decoder_heads} over H_0 = 8 Q/K heads.",
                    encoder_layers=layers, encoder_embed_dim=dim, encoder_heads=encoder_heads,
                    decoder_heads=decoder_heads)


paper_preset("partialformer_6_6_d512_h24_16", 6, 512, 24, 16, "Table 1, 63M")
paper_preset("partialformer_24_6_d512_h24_16", 24, 512, 24, 16, "Table 1, 115M")
paper_preset("partialformer_24_6_d360_h24_16", 24, 360, 24, 16, "Table 1, 61M")
paper_preset("partialformer_24_6_d360_h30_16", 24, 360, 30, 16, "Tables 1, 5, 7, 68M")
paper_preset("partialformer_24_6_d360_h8_8", 24, 360, 8, 8, "Tables 5, 7 'w/o head scaling', 36M")
paper_preset("partialformer_24_6_d320_h24_24", 24, 320, 24, 24, "Table 3, WMT16 En-Ro, 48M")


@register_model_architecture("partialformer", "partialformer_multi30k")
def partialformer_multi30k(args):
    """Quick-start size: the shared Multi30k body (d = 128, H_0 = 4, d_k = 32, 3 decoder layers)
    with the saved FFN parameters spent on depth and heads (Sec. 3.4): 6 encoder layers, H = 12-8."""
    set_defaults(args, **{**MULTI30K_BODY, "encoder_layers": 6}, encoder_heads=12, decoder_heads=8)
    partialformer(args)


@register_model_architecture("partialformer", "partialformer_tiny")
def partialformer_tiny(args):
    """Tiny model for tests: d = 32, H_0 = 4 (d_k = 8), H = 6-5 (head scaling), 2+2 layers, and the
    cross-attention A^G (so the conformance suite covers every cache)."""
    set_defaults(args, encoder_embed_dim=32, encoder_attention_heads=4, encoder_layers=2, decoder_layers=2,
                 decoder_attention_heads=4, encoder_heads=6, decoder_heads=5, cross_global_attention=True)
    partialformer(args)
