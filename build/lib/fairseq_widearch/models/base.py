"""What every Transformer variant of the plugin shares: flags from one config dataclass, and a
build that applies the base preset and validates the flags before fairseq builds the model."""
from argparse import Namespace
from dataclasses import dataclass, fields
from typing import Callable, Dict, List, Optional, Tuple

import torch
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from omegaconf import DictConfig, OmegaConf
from torch import Tensor


def added_defaults(config_cls) -> dict:
    """``{field: default}`` of the fields ``config_cls`` adds to fairseq's TransformerConfig."""
    base = {f.name for f in fields(TransformerConfig)}
    return {f.name: f.default for f in fields(config_cls) if f.name not in base}


def wrap_layer(layer: torch.nn.Module, cfg) -> torch.nn.Module:
    """What fairseq's ``build_encoder_layer``/``build_decoder_layer`` do to every layer they build:
    activation checkpointing with ``--checkpoint-activations`` (``--offload-activations`` keeps the
    saved inputs on the CPU), then ``fsdp_wrap`` (a no-op outside fully sharded training). Every
    plugin layer goes through it, so these flags work as for a stock Transformer. fairseq's
    checkpointing carries gradients through the tensors among a layer's positional arguments and
    outputs only: layers pass their auxiliary tensors flat (e.g. WideNet's routing)."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # as fairseq: a checkpointed layer is always FSDP-wrapped, whatever its size
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def alignment_weights(attn: Optional[Tensor]) -> Dict[str, List[Tensor]]:
    """A decoder layer's cross-attention weights ``(heads, B, T, S)`` as the auxiliary output
    ``attn`` of ``LayerLoopDecoder.run_layers`` (nothing when the layer returned none)."""
    return {} if attn is None else {"attn": [attn]}


def targets_right_padded(task) -> bool:
    """Whether ``task`` pads target sentences on the right: its ``left_pad_target`` (fairseq's
    translation tasks, dataclass ``cfg`` or legacy ``args``) is False. A task without the setting
    is not assumed to."""
    config = getattr(task, "cfg", None) or getattr(task, "args", None)
    return getattr(config, "left_pad_target", True) is False


def use_causal_kernel(decoder: torch.nn.Module, enabled: bool = True):
    """Let the decoder's self-attention modules that support it (a ``causal_kernel`` attribute)
    run whole-sequence forwards on SDPA's own causal mask (``is_causal=True``, no mask tensor; see
    ``fairseq_widearch.modules.attention_utils``). Only valid where targets are right-padded;
    ``enabled=False`` restores the additive masks."""
    for module in decoder.modules():
        if hasattr(module, "causal_kernel") and module.self_attention:
            module.causal_kernel = enabled


#: An ``alignment_layer`` that no layer has: no layer computes its attention weights.
NO_ALIGNMENT = -1


class AlignmentsWhenRead:
    """Decoder mixin: a forward in training mode computes no attention weights (``extra["attn"]``
    is ``[None]``) unless the caller names an ``alignment_layer`` (fairseq's alignment models do)
    or ``alignments_in_training`` is set (by fairseq-train when the criterion reads them:
    ``fairseq_widearch.fairseq_fixes.alignments_for_criterion``). fairseq's decoder computes
    the last layer's cross-attention weights in every forward, which keeps that attention off the
    fused kernels although no training loss reads them. Validation, scoring and generation (eval
    mode) get them as before (``--print-alignment``)."""

    alignments_in_training = False

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                         alignment_heads: Optional[int] = None):
        if alignment_layer is None and self.training and not self.alignments_in_training:
            alignment_layer = NO_ALIGNMENT
        return super().extract_features(prev_output_tokens, encoder_out, incremental_state,
                                        full_context_alignment=full_context_alignment,
                                        alignment_layer=alignment_layer, alignment_heads=alignment_heads)


#: Keys of fairseq's own ``encoder_out``; any other key is an auxiliary output of the model.
FAIRSEQ_ENCODER_OUT_KEYS = {"encoder_out", "encoder_padding_mask", "encoder_embedding", "encoder_states",
                            "fc_results", "src_tokens", "src_lengths"}


class WideTransformerModel(TransformerModel):
    """Subclasses set ``config`` (a TransformerConfig subclass whose fields are the model's flags),
    ``encoder_class`` and ``decoder_class``, and implement ``base_preset(args)`` and
    ``validate(args)`` (raises ``ValueError`` naming the flag). The encoder and decoder are built
    from fairseq's TransformerConfig, which carries the subclass's fields."""

    config = TransformerConfig
    encoder_class = TransformerEncoderBase
    decoder_class = TransformerDecoderBase
    #: The registered criterion that adds this model's auxiliary losses (from ``extra``) to the
    #: objective, and what those losses are; fairseq-train with another criterion stops at
    #: start-up (``fairseq_widearch.fairseq_fixes``). None: no auxiliary losses.
    auxiliary_criterion: Optional[str] = None
    auxiliary_losses = ""
    #: The preset of the paper's own size that the benchmarks measure beside the ``_multi30k`` one
    #: (benchmarks/training_utilisation.py, operator_counts.py); None: the base preset.
    paper_preset: Optional[str] = None

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, cls.config(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        if isinstance(args, DictConfig):  # a checkpoint whose model config is a plain dict (export_subnet)
            args = Namespace(**OmegaConf.to_container(args))  # fairseq would keep only TransformerConfig's keys
        cls.base_preset(args)
        cls.validate(args)
        model = super().build_model(args, task)
        use_causal_kernel(model.decoder, targets_right_padded(task))
        return model

    @classmethod
    def encoder_class_for(cls, cfg):
        """The encoder class for ``cfg``; override where a flag keeps fairseq's own stack."""
        return cls.encoder_class

    @classmethod
    def decoder_class_for(cls, cfg):
        """The decoder class for ``cfg``; override where a flag keeps fairseq's own stack."""
        return cls.decoder_class

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return cls.encoder_class_for(cfg)(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return cls.decoder_class_for(cfg)(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None):
        """fairseq's encoder-decoder forward; the decoder's ``extra`` also gets the encoder's
        auxiliary outputs (keys beyond fairseq's own), encoder entries first, for the criterion."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        out, extra = self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                                  alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                                  src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        for key, value in encoder_out.items():
            if key not in FAIRSEQ_ENCODER_OUT_KEYS:
                extra[key] = value + extra.get(key, [])
        return out, extra

    @staticmethod
    def base_preset(args):
        raise NotImplementedError

    @staticmethod
    def validate(args):
        raise NotImplementedError


@dataclass(frozen=True)
class LayerSlot:
    """Where the layer being built sits in its stack: what fairseq's ``build_encoder_layer(cfg)`` and
    ``build_decoder_layer(cfg, no_encoder_attn)`` are not told."""

    index: int  #: its position in the stack, from 0
    built: Tuple[torch.nn.Module, ...]  #: the stack's layers built before it (``index`` of them, wrapped)


_BUILT = "_layers_built"  # a plain attribute: fairseq builds the layers before ``self.layers`` holds any


class PerLayerBuild:
    """For stacks whose layers differ by position (per-layer widths, blocks sharing the first
    block's parts). fairseq's constructor builds a stack's layers in order, one ``build_*_layer``
    call each, before ``self.layers`` holds any; ``build_next_layer`` hands each call its
    ``LayerSlot``. The record of built layers lives only while the constructor runs."""

    def build_next_layer(self, cfg, build: Callable[[LayerSlot], torch.nn.Module]) -> torch.nn.Module:
        """``build(slot)`` for the stack's next layer, wrapped as fairseq wraps its layers (``wrap_layer``)."""
        built = self.__dict__.setdefault(_BUILT, [])
        layer = wrap_layer(build(LayerSlot(len(built), tuple(built))), cfg)
        built.append(layer)
        return layer

    def forget_built_layers(self):
        """Drop the record once fairseq's constructor has put the layers in ``self.layers``."""
        self.__dict__.pop(_BUILT, None)


class LayerLoopEncoder(PerLayerBuild, TransformerEncoderBase):
    """fairseq's Transformer encoder with the layer loop left to ``run_layers``, for layers that
    take or return more than fairseq's loop passes (MoE routing, layer-selection weights).
    Embeddings, padding, the final LayerNorm and the ``encoder_out`` dict stay fairseq's; the
    auxiliary outputs ``run_layers`` returns are added to ``encoder_out`` and carried unchanged by
    ``reorder_encoder_out`` (batch statistics; subclasses reorder the per-sentence ones)."""

    def __init__(self, cfg, dictionary, embed_tokens, return_fc: bool = False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.forget_built_layers()

    def run_layers(self, x: Tensor, padding_mask: Tensor, states: Optional[List[Tensor]], src_tokens: Tensor
                   ) -> Tuple[Tensor, Dict[str, List[Tensor]]]:
        """x ``(src_len, B, C)``, padding_mask and src_tokens ``(B, src_len)``; appends each layer's
        output to ``states`` when given. Returns the last layer's output and the auxiliary outputs."""
        raise NotImplementedError

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        padding_mask = src_tokens.eq(self.padding_idx)
        x, embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        states = [x] if return_all_hiddens else None
        x, aux = self.run_layers(x, padding_mask, states, src_tokens)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {"encoder_out": [x], "encoder_padding_mask": [padding_mask], "encoder_embedding": [embedding],
                "encoder_states": states or [], "fc_results": [], "src_tokens": [], "src_lengths": [src_lengths],
                **aux}

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        return {**{key: value for key, value in encoder_out.items() if key not in reordered}, **reordered}


class LayerLoopDecoder(AlignmentsWhenRead, PerLayerBuild, TransformerDecoderBase):
    """fairseq's Transformer decoder with the layer loop left to ``run_layers`` (see
    ``LayerLoopEncoder``); the auxiliary outputs are added to the decoder's ``extra``."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn: bool = False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self.forget_built_layers()

    def run_layers(self, x: Tensor, encoder_out: Optional[Tensor], encoder_padding_mask: Optional[Tensor],
                   incremental_state, self_attn_mask: Optional[Tensor], self_attn_padding_mask: Optional[Tensor],
                   padding_mask: Tensor, inner_states: List[Optional[Tensor]], encoder_aux: Dict[str, List[Tensor]],
                   alignment_layer: int) -> Tuple[Tensor, Dict[str, List[Tensor]]]:
        """x ``(tgt_len, B, C)``; padding_mask ``(B, tgt_len)`` marks padding tokens (also when
        ``self_attn_padding_mask`` is None); appends each layer's output to ``inner_states``;
        ``encoder_aux`` holds the encoder's auxiliary outputs (e.g. each sentence's language pair).
        The auxiliary outputs include ``attn``: the cross-attention weights ``(heads, B, tgt_len,
        src_len)`` of layer ``alignment_layer`` (``alignment_weights``)."""
        raise NotImplementedError

    def embed(self, prev_output_tokens, incremental_state):
        """Token + position embeddings as fairseq's decoder computes them -> ``((tgt_len, B, C), tokens)``."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:  # only the newest token is decoded
            prev_output_tokens = prev_output_tokens[:, -1:]
            positions = positions[:, -1:] if positions is not None else None
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x = x + positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x).transpose(0, 1), prev_output_tokens  # B x T x C -> T x B x C

    def self_attn_padding(self, padding_mask: Tensor) -> Optional[Tensor]:
        """The self-attention's key padding mask ``(B, tgt_len)``: None where no target token is padding,
        as fairseq's decoder has it (the check is a host wait)."""
        return padding_mask if padding_mask.any() else None

    def extract_features_scriptable(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                                    incremental_state=None, full_context_alignment: bool = False,
                                    alignment_layer: Optional[int] = None, alignment_heads: Optional[int] = None):
        """Returns ``(features (B, tgt_len, C), extra)``; ``full_context_alignment`` drops the
        causal mask, as in fairseq's decoder (alignment training); ``extra["attn"]`` holds the alignment as
        fairseq's decoder computes it: the cross-attention weights of layer ``alignment_layer``
        (default the last), averaged over its first ``alignment_heads`` heads (default all),
        ``(B, tgt_len, src_len)``."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        enc = encoder_out["encoder_out"][0] if encoder_out and encoder_out["encoder_out"] else None
        enc_mask = (encoder_out["encoder_padding_mask"][0]
                    if encoder_out and encoder_out["encoder_padding_mask"] else None)
        x, tokens = self.embed(prev_output_tokens, incremental_state)
        padding_mask = tokens.eq(self.padding_idx)
        self_attn_padding_mask = self.self_attn_padding(padding_mask)
        # as fairseq's decoder: full_context_alignment lets every position attend to the whole target
        self_attn_mask = (self.buffered_future_mask(x) if incremental_state is None and not full_context_alignment
                          else None)
        inner_states: List[Optional[Tensor]] = [x]
        encoder_aux = {k: v for k, v in encoder_out.items() if k not in FAIRSEQ_ENCODER_OUT_KEYS} if encoder_out else {}
        x, aux = self.run_layers(x, enc, enc_mask, incremental_state, self_attn_mask, self_attn_padding_mask,
                                 padding_mask, inner_states, encoder_aux, alignment_layer)
        attn = aux.pop("attn", [None])[0]
        if attn is not None:  # (heads, B, T, S) -> (B, T, S)
            attn = attn.float().to(x)[:alignment_heads].mean(dim=0)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states, **aux}
