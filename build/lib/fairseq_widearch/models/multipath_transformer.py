"""Multi-Path Transformer (Lin et al. 2022, "Multi-Path Transformer is Better: A Case Study on
Neural Machine Translation", Findings of EMNLP 2022).

A pre-norm Transformer whose sub-layers are *wide*: each runs n attention or FFN paths on one
shared LN(X), normalises every path with PathNorm and fuses them with learnable scalars,
``Y = βX + Σ α_i PathNorm_i(Func_i(LN(X)))`` (Eqs. 4-6), plus the leave-one-out averages of
Eq. 7 ("more features") when n >= 3. The paper widens the encoder only (decoder: 1 path, i.e. the
standard pre-norm fairseq decoder layer); ``--decoder-paths`` widens the decoder too.

The blocks live in ``fairseq_widearch.modules.multi_path``; this file wires them into
fairseq's encoder/decoder through ``build_encoder_layer`` / ``build_decoder_layer``.
"""
from dataclasses import dataclass, field

import torch.nn as nn
from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    base_architecture,
)

from ..modules.encoder_layer import EncoderLayer
from ..modules.multi_path import (
    ALPHA_INIT,
    PATH_WEIGHTS,
    MultiPathAttention,
    MultiPathAttentionSublayer,
    MultiPathFFN,
    MultiPathSublayer,
    PathFusion,
)
from ..validation import reject_unapplied, require, require_positive, validate_transformer_sizes
from .base import AlignmentsWhenRead, WideTransformerModel, added_defaults, wrap_layer
from .presets import MULTI30K_BODY, register_preset, set_defaults


@dataclass
class MultiPathTransformerConfig(TransformerConfig):
    """Flags of ``multipath_transformer`` on top of fairseq's ``TransformerConfig``."""

    encoder_paths: int = field(default=2, metadata={"help": "n, the number of paths in every encoder sub-layer (Eq. 4)"})
    decoder_paths: int = field(
        default=1, metadata={"help": "n for the decoder sub-layers; 1 (the paper) keeps fairseq's pre-norm decoder layer"}
    )
    no_path_norm: bool = field(
        default=False, metadata={"help": "drop PathNorm (Eq. 5) on the path outputs (Table 4 ablation)"}
    )
    path_weights: ChoiceEnum(PATH_WEIGHTS) = field(
        default="learnable",
        metadata={"help": "path weights α and residual weight β of Eq. 4: learnable (Sec. 3.3), or fixed "
                          "α = 1/F or 1/√F with β = 1, F = fused features (Table 4)"},
    )
    path_alpha_init: ChoiceEnum(ALPHA_INIT) = field(
        default="sqrt_features",
        metadata={"help": "initial α (Sec. 3.3): 1/√F with F the features actually fused (n, or 2n with more "
                          "features), or the literal 1/√(2n)"},
    )
    no_more_features: bool = field(
        default=False,
        metadata={"help": "drop the n leave-one-out path averages of Eq. 7 (used only when n >= 3)"},
    )


# Fields this model adds to TransformerConfig, with their defaults (applied by the base preset).
_MULTIPATH_DEFAULTS = added_defaults(MultiPathTransformerConfig)


def _fusion(cfg, side, num_paths: int) -> PathFusion:
    """Eq. 4's fusion for a sub-layer of ``side`` (``cfg.encoder`` or ``cfg.decoder``)."""
    return PathFusion(
        num_paths,
        side.embed_dim,
        path_norm=not cfg.no_path_norm,
        path_weights=cfg.path_weights,
        alpha_init=cfg.path_alpha_init,
        more_features=not cfg.no_more_features,
        dropout=cfg.dropout,
    )


def _ffn(cfg, side, num_paths: int) -> MultiPathFFN:
    return MultiPathFFN(num_paths, side.embed_dim, side.ffn_embed_dim, cfg.activation_fn,
                        cfg.activation_dropout or cfg.relu_dropout or 0.0)


class MultiPathEncoderLayer(EncoderLayer):
    """Pre-norm encoder layer of two multi-path sub-layers: self-attention, then FFN (Eqs. 4-7)."""

    def __init__(self, cfg):
        super().__init__()
        n, d = cfg.encoder_paths, cfg.encoder.embed_dim
        attn = MultiPathAttention(n, d, cfg.encoder.attention_heads, dropout=cfg.attention_dropout)
        self.self_attn = MultiPathAttentionSublayer(d, attn, _fusion(cfg, cfg.encoder, n))
        self.ffn = MultiPathSublayer(d, _ffn(cfg, cfg.encoder, n), _fusion(cfg, cfg.encoder, n))

    def forward(self, x, encoder_padding_mask=None):
        """x ``(src_len, batch, C)``, encoder_padding_mask ``(batch, src_len)`` -> ``(src_len, batch, C)``."""
        x, _ = self.self_attn(x, key_padding_mask=encoder_padding_mask)
        return self.ffn(x)


class MultiPathDecoderLayer(nn.Module):
    """Pre-norm decoder layer of three multi-path sub-layers: causal self-attention,
    encoder-decoder attention (each path with its own K/V cache) and FFN.

    Follows the call signature of fairseq's ``TransformerDecoderLayerBase.forward`` and returns
    ``(x, attn, None)`` like it: with ``need_head_weights`` the cross-attention weights of each head
    ``(H, B, T, S)``, averaged over the paths; with ``need_attn`` alone also averaged over the
    heads ``(B, T, S)``; else None.
    """

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__()
        n, d, heads = cfg.decoder_paths, cfg.decoder.embed_dim, cfg.decoder.attention_heads
        self.self_attn = MultiPathAttentionSublayer(
            d, MultiPathAttention(n, d, heads, dropout=cfg.attention_dropout), _fusion(cfg, cfg.decoder, n)
        )
        self.encoder_attn = None
        if not no_encoder_attn:
            cross = MultiPathAttention(n, d, heads, kdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
                                       self_attention=False)
            self.encoder_attn = MultiPathAttentionSublayer(d, cross, _fusion(cfg, cfg.decoder, n))
        self.ffn = MultiPathSublayer(d, _ffn(cfg, cfg.decoder, n), _fusion(cfg, cfg.decoder, n))

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                prev_self_attn_state=None, prev_attn_state=None, self_attn_mask=None,
                self_attn_padding_mask=None, need_attn=False, need_head_weights=False):
        """x ``(tgt_len, batch, C)``; encoder_out ``(src_len, batch, C)``; masks as in fairseq."""
        x, _ = self.self_attn(x, key_padding_mask=self_attn_padding_mask, attn_mask=self_attn_mask,
                              incremental_state=incremental_state)
        attn = None
        if self.encoder_attn is not None:
            x, attn = self.encoder_attn(x, key=encoder_out, key_padding_mask=encoder_padding_mask,
                                        incremental_state=incremental_state,
                                        need_head_weights=need_attn or need_head_weights)
            if attn is not None and not need_head_weights:
                attn = attn.mean(dim=0)
        return self.ffn(x), attn, None


class MultiPathTransformerEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder with multi-path layers."""

    def build_encoder_layer(self, cfg):
        return wrap_layer(MultiPathEncoderLayer(cfg), cfg)


class MultiPathTransformerDecoder(AlignmentsWhenRead, TransformerDecoderBase):
    """fairseq's Transformer decoder; multi-path layers when ``--decoder-paths`` > 1."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        if cfg.decoder_paths > 1:
            return wrap_layer(MultiPathDecoderLayer(cfg, no_encoder_attn), cfg)
        return super().build_decoder_layer(cfg, no_encoder_attn)


def validate_multipath_config(args):
    """Raise ``ValueError`` naming the flag and value of the first invalid setting."""
    validate_transformer_sizes(args)
    require_positive(args, "encoder_paths", "decoder_paths")
    require(args.encoder_normalize_before,
            "multipath_transformer is pre-norm (Lin et al. 2022, Eq. 5): --encoder-normalize-before is required")
    reject_unapplied(args, "multipath_transformer", "quant_noise_pq", *(
        ["cross_self_attention"] if args.decoder_paths > 1 else []))
    require(args.decoder_paths == 1 or args.decoder_normalize_before,
            f"--decoder-paths {args.decoder_paths} builds pre-norm multi-path decoder layers (Eq. 5): "
            "--decoder-normalize-before is required")


@register_model("multipath_transformer")
class MultiPathTransformerModel(WideTransformerModel):
    """Multi-Path Transformer (Lin et al. 2022). Flags: ``MultiPathTransformerConfig``;
    presets ``multipath_transformer_{L}l_{P}p`` reproduce Table 2."""

    config = MultiPathTransformerConfig
    encoder_class = MultiPathTransformerEncoder
    decoder_class = MultiPathTransformerDecoder
    paper_preset = "multipath_transformer_6l_4p"

    base_preset = staticmethod(lambda args: multipath_transformer(args))  # registered below
    validate = staticmethod(validate_multipath_config)


@register_model_architecture("multipath_transformer", "multipath_transformer")
def multipath_transformer(args):
    """Base preset: Table 2's shape (d = 512, FFN 2048, 8 heads, 6+6 layers), pre-norm, 2 encoder
    paths, and the dropouts of the deep pre-norm recipe the paper follows (Wang et al. 2019:
    residual, attention and activation dropout 0.1; the paper gives none)."""
    set_defaults(args, **_MULTIPATH_DEFAULTS, encoder_normalize_before=True, decoder_normalize_before=True,
                 dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
    base_architecture(args)


def table2(name: str, layers: int, paths: int):
    """Register Table 2's row ``name``: an L-layer P-path encoder, 6-layer decoder, shared vocabulary."""
    register_preset("multipath_transformer", name, multipath_transformer,
                    f"Lin et al. 2022, Table 2: {layers}-layer {paths}-path encoder, 6-layer decoder, α initialised "
                    f"to 1/√(2n) as in Sec. 3.3.",
                    encoder_layers=layers, encoder_paths=paths, share_all_embeddings=True, path_alpha_init="sqrt_2n")


table2("multipath_transformer_6l_2p", 6, 2)
table2("multipath_transformer_12l_2p", 12, 2)
table2("multipath_transformer_6l_4p", 6, 4)
table2("multipath_transformer_12l_3p", 12, 3)
table2("multipath_transformer_6l_6p", 6, 6)
table2("multipath_transformer_24l_2p", 24, 2)
table2("multipath_transformer_12l_4p", 12, 4)
table2("multipath_transformer_6l_8p", 6, 8)


@register_model_architecture("multipath_transformer", "multipath_transformer_multi30k")
def multipath_transformer_multi30k(args):
    """Quick-start size for Multi30k on 2 CPU cores: d = 128, FFN 512, 3-layer 2-path encoder,
    3-layer decoder, shared vocabulary."""
    set_defaults(args, **MULTI30K_BODY)
    multipath_transformer(args)


@register_model_architecture("multipath_transformer", "multipath_transformer_tiny")
def multipath_transformer_tiny(args):
    """Tiny model for tests: 3 encoder paths (so more features are on), 2 decoder paths."""
    set_defaults(args, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4, encoder_layers=2,
                 encoder_paths=3, decoder_layers=2, decoder_attention_heads=4, decoder_paths=2)
    multipath_transformer(args)
