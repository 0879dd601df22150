"""WideNet (Xue et al. 2022, "Go Wider Instead of Deeper", AAAI 2022) for encoder-decoder NMT.

Each stack shares one attention and one Mixture-of-Experts layer (router included) across all
of its blocks; only the LayerNorms stay per block, so the same shared weights see differently
normalised inputs at every depth (Sec. 3.2, Eq. 6, pre-norm):

    x = MHA(LN_i^att(x)) + x;   x = MoE(LN_i^moe(x)) + x      (block i)

The paper tests encoders only; for the decoder we apply the same scheme to self-attention,
cross-attention and the MoE (docs/widenet.md). Balance losses of every routing call travel in
``encoder_out`` / the decoder's ``extra`` (keys ``moe_balance_loss``, ``moe_dropped``,
``moe_load``) and are summed by ``moe_label_smoothed_cross_entropy`` (Eq. 8).
"""
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    base_architecture,
)
from fairseq.modules import LayerNorm, MultiheadAttention
from fairseq.modules.fairseq_dropout import FairseqDropout
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import Tensor

from ..checkpoint_loading import CONFIG_UPGRADES
from ..modules.encoder_layer import EncoderLayer
from ..modules.moe import EXPERT_FORMS, RELEASED_BIAS_STD, ROUTINGS, ExpertForm, Experts, MoELayer, Routing, TopKRouter
from ..modules.sharing import share_parameters
from ..validation import reject_unapplied, require, require_positive, validate_transformer_sizes
from .base import LayerLoopDecoder, LayerLoopEncoder, LayerSlot, WideTransformerModel, added_defaults, alignment_weights
from .presets import MULTI30K_BODY, register_preset, set_defaults, set_unset

#: Keys of the auxiliary MoE outputs, each a list with one entry per routing call.
MOE_KEYS = ("moe_balance_loss", "moe_dropped", "moe_load")
#: ``--widenet-attention-init``
ATTENTION_INITS = ("released", "fairseq")


@dataclass
class WideNetConfig(TransformerConfig):
    """Flags of ``widenet`` on top of fairseq's ``TransformerConfig``."""

    moe_experts: int = field(default=4, metadata={"help": "E, experts of the shared MoE layer (Eq. 1)"})
    moe_top_k: int = field(default=2, metadata={"help": "K, experts per token (TopK of Eq. 2)"})
    moe_capacity_factor: float = field(
        default=1.2, metadata={"help": "C in training: expert capacity B = floor(C·K·tokens/E) - 1 (released "
                                       "routing) or ceil(C·K·tokens/E) (ours) (Sec. 3.1)"}
    )
    moe_eval_capacity_factor: float = field(
        default=0.0, metadata={"help": "C at inference; 0 = no limit, nothing dropped (not in the paper)"}
    )
    moe_no_router_noise: bool = field(
        default=False, metadata={"help": "no exploration noise ε ~ N(0, 1/E²) on the router logits (Eq. 2)"}
    )
    moe_renormalize_gates: bool = field(
        default=False, metadata={"help": "renormalise the K gate values to sum to 1 (Eq. 2 does not)"}
    )
    moe_routing: ChoiceEnum(ROUTINGS) = field(
        default="released",
        metadata={"help": "released: as the authors' code routes (m_i of Eq. 4 over the K·N assignments, capacity "
                          "floor(C·K·N/E) with its first slot unused, tokens fill it batch-major with both choices "
                          "at the token's place); ours: m_i over the N tokens (a K times larger l), ceil(C·K·N/E), "
                          "every first choice before any second, fairseq's T x B order; docs/widenet.md, 'Decisions'"},
    )
    widenet_experts: ChoiceEnum(EXPERT_FORMS) = field(
        default="released",
        metadata={"help": "released: e_i(x) of Eq. 1 as the authors' code builds it (the activation and a dropout "
                          "after both dense layers, the block adding the experts' output undropped, Xavier-uniform "
                          "kernels and router, N(0, 1e-6) biases; the presets' activation is the tanh GELU, "
                          "gelu_accurate, and --activation-dropout is --dropout); ours: the activation after the "
                          "first only, the block's dropout after the combine, nn.Linear's init, exact GELU; "
                          "docs/widenet.md"},
    )
    widenet_attention_init: ChoiceEnum(ATTENTION_INITS) = field(
        default="released",
        metadata={"help": "released: the attention as the authors' code (Keras' MultiHeadAttention) initialises it, "
                          "Glorot-uniform with the fans of its 3-D kernels (q, k, v (d, H, d/H): fan_in H·d, "
                          "fan_out d/H·d; output (H, d/H, d): fan_in d, fan_out H·d) and zero biases; fairseq: "
                          "fairseq's MultiheadAttention init (Xavier, gain 1/√2 for q, k, v, with nn.Linear's biases; "
                          "a zero output bias); "
                          "docs/widenet.md"},
    )
    moe_activation_fn: Optional[str] = field(
        default=None,
        metadata={"help": "the experts' activation (of e_i in Eq. 1); unset: --activation-fn where given, else the "
                          "form's (released: gelu_accurate, the released code's tanh GELU; ours: gelu)"},
    )
    moe_activation_dropout: Optional[float] = field(
        default=None,
        metadata={"help": "the experts' dropout after their activation; unset: --activation-dropout where given, "
                          "else the form's (released: --dropout, the released code's one rate; ours: 0)"},
    )
    widenet_standard_decoder: bool = field(
        default=False, metadata={"help": "keep fairseq's pre-norm decoder, its FFN as fairseq's transformer builds it "
                                         "(WideNet in the encoder only)"}
    )
    widenet_shared_layer_norm: bool = field(
        default=False, metadata={"help": "share the LayerNorms across blocks too (Table 3 ablation)"}
    )
    widenet_dense_ffn: bool = field(
        default=False, metadata={"help": "a shared dense FFN instead of the MoE layer (Table 3 'w/o MoE layer')"}
    )
    widenet_no_sharing: bool = field(
        default=False, metadata={"help": "every block has its own attention and MoE (Table 3 'w/o parameter sharing')"}
    )
    widenet_router_per_block: bool = field(
        default=False, metadata={"help": "each block its own router over the shared experts (a public PyTorch port)"}
    )
    widenet_routing_groups: int = field(
        default=0,
        metadata={"help": "G routing groups per stack: the blocks of a group reuse the routing of its first "
                          "block (Fig. 3); 0 = every block routes"},
    )


_WIDENET_DEFAULTS = added_defaults(WideNetConfig)


def upgrade_pre_released_config(model_cfg):
    """A WideNet checkpoint saved before the released code's routing and experts became the defaults
    (2026-11-27: its config has ``moe_experts`` but no ``moe_routing``) is rebuilt as it was trained,
    with ``--moe-routing ours --widenet-experts ours``. ``model_cfg``: a Namespace, DictConfig or dict."""
    get = model_cfg.get if hasattr(model_cfg, "get") else lambda key, default=None: getattr(model_cfg, key, default)
    if not str(get("arch", "") or get("_name", "")).startswith("widenet") or get("moe_experts") is None:
        return
    if get("moe_routing") is None:
        with open_dict(model_cfg) if OmegaConf.is_config(model_cfg) else nullcontext():
            for key in ("moe_routing", "widenet_experts"):
                if isinstance(model_cfg, (dict, DictConfig)):
                    model_cfg[key] = "ours"
                else:
                    setattr(model_cfg, key, "ours")


CONFIG_UPGRADES.append(upgrade_pre_released_config)


class DenseFFN(nn.Module, ExpertForm):
    """Dense FFN with ``MoELayer``'s call signature (the 'w/o MoE layer' ablation), of the
    experts' ``form`` (``ExpertForm``): the ablation then differs from WideNet in the routing alone."""

    def __init__(self, embed_dim: int, ffn_dim: int, activation_fn: str, activation_dropout: float,
                 form: str = "released", dropout: float = 0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(embed_dim, ffn_dim), nn.Linear(ffn_dim, embed_dim)
        if form == "released":
            for linear in (self.fc1, self.fc2):
                nn.init.xavier_uniform_(linear.weight)
                nn.init.normal_(linear.bias, std=RELEASED_BIAS_STD)
        self.init_form(form, activation_fn, activation_dropout, dropout)

    def forward(self, x, padding_mask=None, routing=None):
        """x ``(T, B, C)`` -> ``((T, B, C), None)``: no routing."""
        return self.ffn(x), None


def glorot_uniform_3d_(weight: Tensor, fan_in: int, fan_out: int):
    """Keras' Glorot-uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)), in place."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


def build_attention(cfg, *args, **kwargs) -> MultiheadAttention:
    """fairseq's ``MultiheadAttention(*args, **kwargs)``, initialised as ``--widenet-attention-init`` says.

    ``released``: as Keras' ``MultiHeadAttention`` (the released code's) initialises its EinsumDense
    kernels: their fans are a convolution's (the receptive field is the product of all dimensions but
    the last two), so the (d_in, H, d/H) q/k/v kernels have fan_in H·d_in and fan_out d/H·d_in, and the
    (H, d/H, d) output kernel fan_in d and fan_out H·d; every bias is 0. At d = 128, H = 4 the q/k/v
    weights' std is 0.0208 (fairseq's 0.0625) and the output's 0.0559 (fairseq's 0.0885)."""
    attn = MultiheadAttention(*args, **kwargs)
    if getattr(cfg, "widenet_attention_init", "released") != "released":
        return attn
    heads, head_dim = attn.num_heads, attn.head_dim
    for proj, d_in in ((attn.q_proj, attn.embed_dim), (attn.k_proj, attn.kdim), (attn.v_proj, attn.vdim)):
        glorot_uniform_3d_(proj.weight, heads * d_in, head_dim * d_in)
    glorot_uniform_3d_(attn.out_proj.weight, heads * head_dim, attn.embed_dim * heads)
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        nn.init.zeros_(proj.bias)
    return attn


def build_ffn(cfg, embed_dim: int, ffn_dim: int):
    ffn = (expert_activation(cfg), expert_activation_dropout(cfg), cfg.widenet_experts)
    if cfg.widenet_dense_ffn:
        return DenseFFN(embed_dim, ffn_dim, *ffn, dropout=cfg.dropout)
    experts = Experts(cfg.moe_experts, embed_dim, ffn_dim, *ffn, dropout=cfg.dropout)
    return MoELayer(build_router(cfg, embed_dim), experts)


def expert_activation(cfg) -> str:
    """``--moe-activation-fn``; a config without it (saved before the field) built its experts with
    the model's ``--activation-fn``."""
    return getattr(cfg, "moe_activation_fn", None) or cfg.activation_fn


def expert_activation_dropout(cfg) -> float:
    """``--moe-activation-dropout``; without it, the model's activation dropout (``expert_activation``)."""
    rate = getattr(cfg, "moe_activation_dropout", None)
    return rate if rate is not None else given_activation_dropout(cfg) or 0.0


def given_activation_dropout(args) -> Optional[float]:
    """The activation dropout as fairseq reads its two flags: ``--relu-dropout`` where
    ``--activation-dropout`` is 0 or absent; None where neither is given."""
    rate, relu = getattr(args, "activation_dropout", None), getattr(args, "relu_dropout", None)
    return relu if not rate and relu is not None else rate


def build_router(cfg, embed_dim: int) -> TopKRouter:
    return TopKRouter(embed_dim, cfg.moe_experts, cfg.moe_top_k, cfg.moe_capacity_factor,
                      cfg.moe_eval_capacity_factor, noise=not cfg.moe_no_router_noise,
                      renormalize=cfg.moe_renormalize_gates, routing=cfg.moe_routing, init=cfg.widenet_experts)


class BlockSharing:
    """What block i takes from block 0 (Sec. 3.2): attention and MoE unless
    ``--widenet-no-sharing``; LayerNorms only with ``--widenet-shared-layer-norm``. Block 0 (and
    every unshared part) is built anew; a shared part is block 0's module itself, never a copy.
    ``routes``: whether the block routes (False: it reuses its routing group's routing)."""

    def __init__(self, cfg, first: Optional[nn.Module], routes: bool = True):
        self.cfg, self.first, self.routes = cfg, first, routes

    def norm(self, name: str, dim: int):
        if self.first is not None and self.cfg.widenet_shared_layer_norm:
            return getattr(self.first, name)
        return LayerNorm(dim)

    def module(self, name: str, build):
        if self.first is None or self.cfg.widenet_no_sharing:
            return build()
        return getattr(self.first, name)

    def attention(self, name: str, build):
        """Like ``module``, but a distinct module tied to block 0's weights: each decoder block
        needs its own incremental-decoding cache key. Built on the meta device, so no memory is
        allocated for weights that are replaced at once."""
        if self.first is None or self.cfg.widenet_no_sharing:
            return build()
        with torch.device("meta"):
            attn = build()
        share_parameters(attn, getattr(self.first, name))
        return attn

    def moe(self, embed_dim: int, ffn_dim: int):
        """Block 0's MoE layer; with ``--widenet-router-per-block``, its experts behind a router of
        this block's own, for every block that routes (a block that reuses its group's routing
        never calls a router, so it gets none of its own: DDP would find it unused)."""
        shared = self.module("moe", lambda: build_ffn(self.cfg, embed_dim, ffn_dim))
        if shared is getattr(self.first, "moe", None) and self.cfg.widenet_router_per_block and self.routes:
            return MoELayer(build_router(self.cfg, embed_dim), shared.experts)
        return shared


class MoESublayer:
    """The last sub-layer of every WideNet block (encoder and decoder), ``x + MoE(LN_i^moe(x))``;
    the block has ``moe_layer_norm``, ``moe`` and ``dropout_module``. The released experts drop their
    own outputs (``ExpertForm``), so the block adds theirs undropped."""

    def moe_sublayer(self, x: Tensor, padding_mask: Optional[Tensor], reused: tuple) -> tuple:
        """x ``(T, B, C)`` -> ``(x, *routing fields)`` (no fields for the dense-FFN ablation)."""
        h, routing = self.moe(self.moe_layer_norm(x), padding_mask, Routing(*reused) if reused else None)
        h = h if self.moe.drops_output else self.dropout_module(h)
        return (x + h, *(routing.as_tuple() if routing is not None else ()))


class WideNetEncoderLayer(EncoderLayer, MoESublayer):
    """Block i of Eq. 6: pre-norm self-attention and MoE, each behind this block's own LayerNorm.
    ``first`` is block 0, whose attention and MoE this block shares (None for block 0)."""

    def __init__(self, cfg, first: Optional["WideNetEncoderLayer"] = None, routes: bool = True):
        super().__init__()
        d, share = cfg.encoder.embed_dim, BlockSharing(cfg, first, routes)
        self.self_attn_layer_norm = share.norm("self_attn_layer_norm", d)
        self.self_attn = share.module("self_attn", lambda: build_attention(
            cfg, d, cfg.encoder.attention_heads, dropout=cfg.attention_dropout, self_attention=True))
        self.moe_layer_norm = share.norm("moe_layer_norm", d)
        self.moe = share.moe(d, cfg.encoder.ffn_embed_dim)
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)

    def forward(self, x, padding_mask: Optional[Tensor], *reused):
        """x ``(src_len, B, C)``, padding_mask ``(B, src_len)``, ``reused`` the fields of a routing
        to reuse (``Routing.as_tuple``; none: route) -> ``(x, *fields of this block's routing)``."""
        h = self.self_attn_layer_norm(x)
        h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=padding_mask, need_weights=False)
        x = x + self.dropout_module(h)
        return self.moe_sublayer(x, padding_mask, reused)


class WideNetDecoderLayer(nn.Module, MoESublayer):
    """Decoder block: pre-norm causal self-attention, cross-attention and MoE, each behind this
    block's own LayerNorm; attention and MoE weights shared with block 0 (``first``)."""

    def __init__(self, cfg, first: Optional["WideNetDecoderLayer"] = None, routes: bool = True):
        super().__init__()
        d, heads, share = cfg.decoder.embed_dim, cfg.decoder.attention_heads, BlockSharing(cfg, first, routes)
        self.self_attn_layer_norm = share.norm("self_attn_layer_norm", d)
        self.self_attn = share.attention("self_attn", lambda: build_attention(
            cfg, d, heads, dropout=cfg.attention_dropout, self_attention=True))
        self.encoder_attn_layer_norm = share.norm("encoder_attn_layer_norm", d)
        self.encoder_attn = share.attention("encoder_attn", lambda: build_attention(
            cfg, d, heads, kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
            encoder_decoder_attention=True))
        self.moe_layer_norm = share.norm("moe_layer_norm", d)
        self.moe = share.moe(d, cfg.decoder.ffn_embed_dim)
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)

    def forward(self, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                self_attn_padding_mask, need_head_weights: bool, *reused):
        """x ``(tgt_len, B, C)``, encoder_out ``(src_len, B, C)``, ``reused`` as in
        ``WideNetEncoderLayer.forward`` -> ``(x, cross-attention weights (heads, B, tgt_len,
        src_len) if need_head_weights else None, *fields of this block's routing)``."""
        h = self.self_attn_layer_norm(x)
        h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                              incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask)
        x = x + self.dropout_module(h)
        h = self.encoder_attn_layer_norm(x)
        h, attn = self.encoder_attn(query=h, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                                    incremental_state=incremental_state, static_kv=True,
                                    need_weights=need_head_weights, need_head_weights=need_head_weights)
        x = x + self.dropout_module(h)
        x, *routing = self.moe_sublayer(x, self_attn_padding_mask, reused)
        return (x, attn, *routing)


def routes(index: int, num_layers: int, groups: int) -> bool:
    """Whether block ``index`` of a stack of ``num_layers`` routes: the first block of each of the
    ``groups`` routing groups (Fig. 3), or every block when ``groups`` is 0."""
    return index % (num_layers // groups if groups else 1) == 0


def build_block(layer_cls, cfg, slot: LayerSlot, num_layers: int):
    """Block ``slot.index`` of a stack of ``num_layers``: block 0 built anew, later blocks sharing
    block 0's parts (block 0 stays registered once, as ``layers.0``)."""
    return layer_cls(cfg, slot.built[0] if slot.built else None,
                     routes(slot.index, num_layers, cfg.widenet_routing_groups))


class RoutingGroups:
    """Which blocks route and which reuse their group's routing (Fig. 3); collects the per-call
    auxiliary outputs of one forward pass as return values (no module state)."""

    def __init__(self, num_layers: int, groups: int):
        self.num_layers, self.groups = num_layers, groups
        self.routing: Optional[Routing] = None
        self.aux: Dict[str, List[Tensor]] = {key: [] for key in MOE_KEYS}

    def for_layer(self, index: int) -> tuple:
        """The routing fields block ``index`` reuses (``()``: it routes)."""
        if routes(index, self.num_layers, self.groups) or self.routing is None:
            return ()
        return self.routing.as_tuple()

    def record(self, fields: tuple, reused: bool):
        """Keep a fresh routing for the rest of its group and record its statistics once."""
        if not fields or reused:
            return
        self.routing = routing = Routing(*fields)
        self.aux["moe_balance_loss"].append(routing.balance_loss)
        kept = routing.kept_load.float()  # assignments kept per expert
        real = routing.load.sum()  # the real tokens' assignments (padding is routed, never counted)
        self.aux["moe_dropped"].append((real - kept.sum()) / real.clamp_min(1))
        self.aux["moe_load"].append(kept)


class WideNetEncoder(LayerLoopEncoder):
    """Pre-norm encoder whose blocks share one self-attention and one MoE layer; its
    ``encoder_out`` holds ``MOE_KEYS`` (one entry per routing call)."""

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.routing_groups = cfg.widenet_routing_groups

    def build_encoder_layer(self, cfg):
        return self.build_next_layer(cfg, lambda slot: build_block(WideNetEncoderLayer, cfg, slot, cfg.encoder.layers))

    def run_layers(self, x, padding_mask, states, src_tokens):
        groups = RoutingGroups(len(self.layers), self.routing_groups)
        for i, layer in enumerate(self.layers):
            reuse = groups.for_layer(i)
            x, *routing = layer(x, padding_mask, *reuse)
            groups.record(routing, reused=bool(reuse))
            if states is not None:
                states.append(x)
        return x, groups.aux


class WideNetDecoder(LayerLoopDecoder):
    """Pre-norm decoder whose blocks share one self-attention, one cross-attention and one MoE
    layer; its ``extra`` holds ``MOE_KEYS`` of the decoder's routing calls."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.routing_groups = cfg.widenet_routing_groups

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return self.build_next_layer(cfg, lambda slot: build_block(WideNetDecoderLayer, cfg, slot, cfg.decoder.layers))

    def self_attn_padding(self, padding_mask: Tensor) -> Tensor:
        """Always the mask: no host wait for fairseq's "any padding?" check."""
        return padding_mask

    def run_layers(self, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                   self_attn_padding_mask, padding_mask, inner_states, encoder_aux, alignment_layer):
        groups, aux = RoutingGroups(len(self.layers), self.routing_groups), {}
        for i, layer in enumerate(self.layers):
            reuse = groups.for_layer(i)
            x, attn, *routing = layer(x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                                      self_attn_padding_mask, i == alignment_layer, *reuse)
            groups.record(routing, reused=bool(reuse))
            aux.update(alignment_weights(attn))
            inner_states.append(x)
        return x, {**groups.aux, **aux}


def validate_widenet_config(args):
    """Raise ``ValueError`` naming the flag and value of the first invalid setting."""
    validate_transformer_sizes(args)
    require_positive(args, "moe_experts", "moe_top_k")
    require(args.moe_top_k <= args.moe_experts,
            f"--moe-top-k {args.moe_top_k} exceeds --moe-experts {args.moe_experts}")
    require(args.moe_capacity_factor > 0, f"--moe-capacity-factor must be > 0, got {args.moe_capacity_factor}")
    require(args.moe_eval_capacity_factor >= 0,
            f"--moe-eval-capacity-factor must be >= 0 (0: no limit), got {args.moe_eval_capacity_factor}")
    require(not (args.widenet_dense_ffn and args.widenet_router_per_block),
            "--widenet-router-per-block needs the MoE layer; it cannot go with --widenet-dense-ffn")
    groups = args.widenet_routing_groups
    for side in ("encoder", "decoder"):
        layers = getattr(args, f"{side}_layers")
        require(groups >= 0 and (groups == 0 or layers % groups == 0),
                f"--widenet-routing-groups {groups} must be 0 or divide --{side}-layers {layers}")
    reject_unapplied(args, "widenet", "encoder_layerdrop", "decoder_layerdrop", "quant_noise_pq",
                     "cross_self_attention")
    require(args.encoder_normalize_before,
            "widenet is pre-norm (Xue et al. 2022, Eq. 6): --encoder-normalize-before is required")
    require(args.decoder_normalize_before or args.widenet_standard_decoder,
            "widenet decoder blocks are pre-norm (Eq. 6): --decoder-normalize-before is required")


@register_model("widenet")
class WideNetModel(WideTransformerModel):
    """WideNet (Xue et al. 2022). Flags: ``WideNetConfig``; presets ``widenet_{tiny,wmt_en_de,b,l,h}``."""

    config = WideNetConfig
    encoder_class = WideNetEncoder
    decoder_class = WideNetDecoder
    auxiliary_criterion = "moe_label_smoothed_cross_entropy"
    auxiliary_losses = "WideNet's balance loss (Xue et al. 2022, Eq. 8)"
    paper_preset = "widenet_wmt_en_de"

    base_preset = staticmethod(lambda args: widenet(args))  # registered below
    validate = staticmethod(validate_widenet_config)

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        if args.widenet_dense_ffn:  # no router, no balance loss: any criterion trains it
            model.auxiliary_criterion = None
        return model

    @classmethod
    def decoder_class_for(cls, cfg):
        return TransformerDecoderBase if cfg.widenet_standard_decoder else cls.decoder_class


@register_model_architecture("widenet", "widenet")
def widenet(args):
    """Base preset: transformer-base body (d = 512, FFN 2048, 8 heads, 6+6 blocks), pre-norm,
    E = 4 experts, top-2, C = 1.2 (the paper's defaults). The released experts take the released
    code's activation and its one dropout rate: tanh-approximated GELU (fairseq's ``gelu_accurate``)
    and an activation dropout equal to ``--dropout``; ``--widenet-experts ours``: exact GELU, no
    activation dropout. Those are the experts' own (``--moe-activation-fn``,
    ``--moe-activation-dropout``; ``--activation-fn``/``--activation-dropout`` where given), so that
    ``--widenet-standard-decoder``'s FFN stays fairseq's."""
    set_defaults(args, **_WIDENET_DEFAULTS, encoder_normalize_before=True, decoder_normalize_before=True)
    set_defaults(args, dropout=0.1)  # base_architecture's, needed here for the released experts' rate
    released = args.widenet_experts == "released"
    user_rate = given_activation_dropout(args)
    set_unset(args, moe_activation_fn=getattr(args, "activation_fn", None) or ("gelu_accurate" if released else "gelu"),
              moe_activation_dropout=user_rate if user_rate is not None else (args.dropout if released else 0.0))
    base_architecture(args)


@register_model_architecture("widenet", "widenet_wmt_en_de")
def widenet_wmt_en_de(args):
    """NMT base for WMT14 En-De: transformer-base body with shared vocabulary, WideNet in both stacks."""
    set_defaults(args, share_all_embeddings=True, dropout=0.1, attention_dropout=0.1)
    if given_activation_dropout(args) is None:  # the experts' 0.1 unless the user gave a rate
        set_defaults(args, moe_activation_dropout=0.1)
    widenet(args)


def vit_body(name: str, size: str, dim: int, heads: int, ffn: int, blocks: int):
    """Register ``name``: WideNet-``size``'s body (ViT widths, Sec. 4.1) in both stacks."""
    register_preset("widenet", name, widenet,
                    f"Xue et al. 2022, WideNet-{size} body (ViT widths, Sec. 4.1) in both stacks: d = {dim}, "
                    f"{heads} heads, FFN {ffn}, {blocks} blocks, E = 4, K = 2.",
                    encoder_embed_dim=dim, encoder_attention_heads=heads, encoder_ffn_embed_dim=ffn,
                    encoder_layers=blocks, decoder_attention_heads=heads, decoder_layers=blocks)


vit_body("widenet_b", "B", 768, 12, 4096, 12)
vit_body("widenet_l", "L", 1024, 16, 4096, 24)
vit_body("widenet_h", "H", 1280, 16, 5120, 32)


@register_model_architecture("widenet", "widenet_multi30k")
def widenet_multi30k(args):
    """Quick-start size for Multi30k on 2 CPU cores: d = 128, FFN 512, 4 heads, 3+3 blocks."""
    set_defaults(args, **MULTI30K_BODY)
    widenet(args)


@register_model_architecture("widenet", "widenet_tiny")
def widenet_tiny(args):
    """Tiny model for tests: d = 32, 3 encoder and 2 decoder blocks, E = 4, K = 2."""
    set_defaults(args, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4, encoder_layers=3,
                 decoder_layers=2, decoder_attention_heads=4)
    widenet(args)
