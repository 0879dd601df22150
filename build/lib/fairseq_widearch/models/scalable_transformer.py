"""Scalable Transformers (Gao et al. 2021, "Scalable Transformers for Neural Machine Translation").

One widest Transformer (width M_max, 6 + 6 post-norm layers) whose top-left weight blocks form
every narrower sub-Transformer (Sec. 3.2): width C for embeddings-after-projection, residual
stream and LayerNorms, attention width D^i (D^i / 64 heads of 64) and FFN hidden 4·D^i per layer.
The word embedding stays M_max wide; an input projection W'_e (Eq. 3, cropped to its first C
outputs) and an output projection W'_o (Eq. 4, its first C inputs, full bias) connect it to the
sub-Transformer (Eq. 5); ``--no-io-projections`` crops the embedding itself (Table 1's "I/O
cropping"). Type-1 sub-Transformers use one width everywhere (C = D^i); type-2 keep C = M_max and
choose D^i per layer.

``model.set_sample_config(width, layer_widths=None)`` selects the active sub-Transformer; the
blocks are in ``fairseq_widearch.modules.slimmable``.
"""
import logging
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq import utils
from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, base_architecture
from fairseq.modules import SinusoidalPositionalEmbedding
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.tasks import TASK_REGISTRY, FairseqTask
from torch import Tensor

from ..modules.encoder_layer import EncoderLayer
from ..modules.slimmable import HEAD_DIM, CroppedPositions, SlimmableAttention, SlimmableLayerNorm, SlimmableLinear
from ..modules.sub_transformers import built_widths, crop_linear, crop_norm, width_dropout, width_set
from ..validation import refuse, reject_unapplied, require
from .base import LayerLoopDecoder, LayerLoopEncoder, WideTransformerModel, added_defaults, alignment_weights
from .presets import set_defaults

logger = logging.getLogger(__name__)


@dataclass
class ScalableTransformerConfig(TransformerConfig):
    """Flags of ``scalable_transformer``; M_max is ``--encoder-embed-dim`` (= ``--decoder-embed-dim``)."""

    scalable_widths: str = field(
        default="", metadata={"help": "the width set M (comma-separated multiples of 64, Sec. 3.1); empty: every "
                                      "multiple of 64 from M_max / 4 to M_max (256, 320, ..., 1024 at M_max = 1024)"}
    )
    sub_transformer_type: ChoiceEnum(("type1", "type2")) = field(
        default="type1", metadata={"help": "sub-Transformers sampled in training: type1 one width C = D^i, type2 "
                                           "C = M_max with a width D^i per layer (Sec. 3.3)"}
    )
    width_dropout: str = field(
        default="", metadata={"help": "width-dependent dropout (Appendix B) as 'w1:p1,w2:p2,...': widths >= w_k use "
                                      "p_k; empty: --dropout at every width"}
    )
    no_io_projections: bool = field(
        default=False, metadata={"help": "no input/output projections (Eqs. 3-5): crop the embedding to its first C "
                                         "columns ('I/O cropping', Table 1)"}
    )
    exported_width: int = field(
        default=0, metadata={"help": "C the layers are built at (written by export_subnet for an exported "
                                     "sub-Transformer); 0: M_max"}
    )
    exported_layer_widths: str = field(
        default="", metadata={"help": "D^i the layers are built at, encoder then decoder layers, comma-separated "
                                      "(written by export_subnet for a type-2 sub-Transformer); empty: C everywhere"}
    )
    exported_from_width: int = field(
        default=0, metadata={"help": "M_max of the model an I/O-cropped sub-Transformer was exported from (written "
                                     "by export_subnet): embeddings scaled by √M_max and sinusoidal positions the "
                                     "first C channels of M_max's, as the parent computes them; 0: this model's own"}
    )


_SCALABLE_DEFAULTS = added_defaults(ScalableTransformerConfig)


class ScalableLayer(EncoderLayer):
    """A post-norm (or pre-norm) Transformer layer of slimmable parts, with fairseq's parameter
    names: self-attention, optional cross-attention (decoder), FFN of hidden 4·D (Eq. 2)."""

    def __init__(self, cfg, width: int, dim: int, cross_attention: bool = False):
        """``width``: the widest C of the layer; ``dim``: its widest attention width D."""
        super().__init__()
        self.normalize_before = cfg.encoder_normalize_before
        self.self_attn = SlimmableAttention(width, dim, dropout=cfg.attention_dropout)
        self.self_attn_layer_norm = SlimmableLayerNorm(width)
        self.encoder_attn = SlimmableAttention(width, dim, dropout=cfg.attention_dropout,
                                               self_attention=False) if cross_attention else None
        self.encoder_attn_layer_norm = SlimmableLayerNorm(width) if cross_attention else None
        self.fc1, self.fc2 = SlimmableLinear(width, 4 * dim), SlimmableLinear(4 * dim, width)
        self.final_layer_norm = SlimmableLayerNorm(width)
        self.activation_fn = utils.get_activation_fn(cfg.activation_fn)
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)
        self.activation_dropout_module = FairseqDropout(cfg.activation_dropout, module_name=self.__class__.__name__)

    def set_active_width(self, dim: int):
        """Attention width D (Q, K, V cropped to D, D / 64 heads) and FFN hidden 4·D."""
        for attn in (self.self_attn, self.encoder_attn):
            if attn is not None:
                attn.set_active_width(dim)
        self.fc1.set_active_width(4 * dim)

    def cropped_state(self, width: int) -> Dict[str, Tensor]:
        """This layer's parameters as the active sub-Transformer of width C = ``width`` uses them."""
        dim, cropped = self.self_attn.active_dim, {}
        for name in ("self_attn", "encoder_attn"):
            attn = getattr(self, name)
            if attn is not None:
                for proj in ("q_proj", "k_proj", "v_proj"):
                    cropped.update(crop_linear(f"{name}.{proj}", getattr(attn, proj), dim, width))
                cropped.update(crop_linear(f"{name}.out_proj", attn.out_proj, width, dim))
                cropped.update(crop_norm(f"{name}_layer_norm", getattr(self, f"{name}_layer_norm"), width))
        cropped.update(crop_linear("fc1", self.fc1, 4 * dim, width))
        cropped.update(crop_linear("fc2", self.fc2, width, 4 * dim))
        cropped.update(crop_norm("final_layer_norm", self.final_layer_norm, width))
        return cropped

    def _sublayer(self, x: Tensor, norm, fn) -> Tuple[Tensor, Optional[Tensor]]:
        """Pre-norm ``x + fn(LN(x))`` or post-norm ``LN(x + fn(x))``; ``fn`` returns ``(h, weights)``."""
        h, weights = fn(norm(x) if self.normalize_before else x)
        x = x + self.dropout_module(h)
        return (x if self.normalize_before else norm(x)), weights

    def _ffn(self, x: Tensor) -> Tuple[Tensor, None]:
        return self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))), x.size(-1)), None

    def forward(self, x: Tensor, padding_mask: Optional[Tensor], encoder_out: Optional[Tensor] = None,
                encoder_padding_mask: Optional[Tensor] = None, incremental_state=None,
                self_attn_mask: Optional[Tensor] = None, need_head_weights: bool = False
                ) -> Tuple[Tensor, Optional[Tensor]]:
        """x ``(T, B, C)``; padding_mask ``(B, T)``; encoder_out ``(S, B, C)`` for a decoder layer ->
        ``(x, cross-attention weights (heads, B, T, S) if need_head_weights, else None)``."""
        x, _ = self._sublayer(x, self.self_attn_layer_norm, lambda h: self.self_attn(
            h, key_padding_mask=padding_mask, attn_mask=self_attn_mask, incremental_state=incremental_state))
        attn = None
        if self.encoder_attn is not None:
            x, attn = self._sublayer(x, self.encoder_attn_layer_norm, lambda h: self.encoder_attn(
                h, encoder_out, key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                need_head_weights=need_head_weights))
        return self._sublayer(x, self.final_layer_norm, self._ffn)[0], attn


class WidthSelection:
    """What the encoder and the decoder share: the input projection W'_e (Eq. 3) cropped to the
    active width C (or the embedding itself cropped), and per-layer widths.

    A stack is built at width C_b with layer widths D_b^i (``built_widths``): the widest
    model's, or an exported sub-Transformer's."""

    def build_layer(self, cfg, first_layer: int, cross_attention: bool = False):
        """The stack's next layer; ``first_layer``: the index of the stack's first layer among the
        encoder's then the decoder's (D^i are listed in that order)."""
        width, dims = built_widths(cfg)
        return self.build_next_layer(cfg, lambda slot: ScalableLayer(
            cfg, width, dims[first_layer + slot.index], cross_attention))

    def build_width_selection(self, cfg, learned_positions: bool, max_positions: int):
        """The input projection, the pre-norm final LayerNorm at width C, and, in an I/O-cropped
        export (``--exported-from-width``), the parent's embedding scale and sinusoidal positions
        (``learned_positions``: this stack's flag; ``max_positions``: its maximum length)."""
        self.width = self.built_width = built_widths(cfg)[0]
        full = cfg.encoder_embed_dim
        self.input_projection = None if cfg.no_io_projections else SlimmableLinear(full, self.built_width)
        if self.layer_norm is not None:  # pre-norm: the final LayerNorm at width C
            self.layer_norm = SlimmableLayerNorm(self.built_width)
        if cfg.exported_from_width:  # an I/O-cropped export embeds as its M_max parent did
            if not cfg.no_scale_embedding:
                self.embed_scale = math.sqrt(cfg.exported_from_width)
            if self.embed_positions is not None and not learned_positions:
                self.embed_positions = CroppedPositions(
                    SinusoidalPositionalEmbedding(cfg.exported_from_width, self.padding_idx,
                                                  init_size=max_positions + self.padding_idx + 1), full)

    def set_widths(self, width: int, layer_widths: Sequence[int]):
        self.width = width
        if self.input_projection is not None:
            self.input_projection.set_active_width(width)
        for layer, dim in zip(self.layers, layer_widths):
            layer.set_active_width(dim)

    def cropped_state(self) -> Dict[str, Tensor]:
        """Embedding (M_max wide, or its first C columns without I/O projections), the input
        projection's first C outputs, every layer's crop and the final LayerNorm's."""
        width, full = self.width, self.embed_tokens.embedding_dim
        embedded = full if self.input_projection else width  # channels kept of what is embedded
        cropped = {"embed_tokens.weight": self.embed_tokens.weight[:, :embedded]}
        if "embed_positions.weight" in self.state_dict():  # learned positions
            cropped["embed_positions.weight"] = self.embed_positions.weight[:, :embedded]
        if self.input_projection is not None:
            cropped.update(crop_linear("input_projection", self.input_projection, width, full))
        for i, layer in enumerate(self.layers):
            cropped.update({f"layers.{i}.{k}": v for k, v in layer.cropped_state(width).items()})
        if self.layer_norm is not None:
            cropped.update(crop_norm("layer_norm", self.layer_norm, width))
        return cropped

    def project_in(self, x: Tensor) -> Tensor:
        """``(T, B, M_max)`` embeddings -> ``(T, B, C)``."""
        return self.input_projection(x) if self.input_projection is not None else x[..., : self.width]


class ScalableEncoder(WidthSelection, LayerLoopEncoder):
    """Encoder of slimmable layers (width C, attention widths D^1..D^6)."""

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.build_width_selection(cfg, cfg.encoder_learned_pos, cfg.max_source_positions)

    def build_encoder_layer(self, cfg):
        return self.build_layer(cfg, first_layer=0)

    def run_layers(self, x, padding_mask, states, src_tokens):
        x = self.project_in(x)
        mask = padding_mask if padding_mask.any() else None
        for layer in self.layers:
            x, _ = layer(x, mask)
            if states is not None:
                states.append(x)
        return x, {}


class ScalableDecoder(WidthSelection, LayerLoopDecoder):
    """Decoder of slimmable layers; its output goes back to M_max through W'_o (Eq. 4, held in
    fairseq's ``project_out_dim`` slot, applied after the final LayerNorm) before the tied softmax."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.build_width_selection(cfg, cfg.decoder_learned_pos, cfg.max_target_positions)
        self.project_out_dim = None if cfg.no_io_projections else SlimmableLinear(self.built_width, self.width_max)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return self.build_layer(cfg, first_layer=cfg.encoder_layers, cross_attention=True)

    def cropped_state(self) -> Dict[str, Tensor]:
        cropped = super().cropped_state()
        if self.project_out_dim is not None:  # W'_o: the first C inputs, the full bias (Eq. 5)
            cropped.update(crop_linear("project_out_dim", self.project_out_dim, self.width_max, self.width,
                                       full_bias=True))
        return cropped

    def output_layer(self, features):
        if self.project_out_dim is None and features.size(-1) < self.width_max:  # I/O cropping: cropped tied softmax
            return features @ self.output_projection.weight[:, : features.size(-1)].t()
        return super().output_layer(features)

    @property
    def width_max(self) -> int:
        return self.embed_tokens.embedding_dim

    def run_layers(self, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                   self_attn_padding_mask, padding_mask, inner_states, encoder_aux, alignment_layer):
        x = self.project_in(x)
        aux = {}
        for i, layer in enumerate(self.layers):
            x, attn = layer(x, self_attn_padding_mask, encoder_out, encoder_padding_mask, incremental_state,
                            self_attn_mask, i == alignment_layer)
            aux.update(alignment_weights(attn))
            inner_states.append(x)
        return x, aux


def _parsed(flag: str, text: str, parse):
    try:
        return parse()
    except ValueError:
        refuse(f"{flag} must be comma-separated integers, got {text!r}")


def validate_scalable_config(args):
    """Raise ``ValueError`` naming the flag and value of the first invalid setting."""
    width = args.encoder_embed_dim
    require(width % HEAD_DIM == 0, f"--encoder-embed-dim {width} (M_max) must be a multiple of {HEAD_DIM}")
    require(args.decoder_embed_dim == width,
            f"--decoder-embed-dim {args.decoder_embed_dim} must equal --encoder-embed-dim {width} (one M_max)")
    widths = _parsed("--scalable-widths", args.scalable_widths, lambda: width_set(args))
    bad = [w for w in widths if w <= 0 or w > width or w % HEAD_DIM]
    require(not bad, f"--scalable-widths {args.scalable_widths!r}: {bad} are not multiples of {HEAD_DIM} in "
                     f"(0, {width}]")
    require(widths == sorted(set(widths)), f"--scalable-widths {args.scalable_widths!r} must be ascending, no repeats")
    require(args.exported_from_width == 0 or (args.no_io_projections and args.exported_from_width >= width),
            f"--exported-from-width {args.exported_from_width} is for I/O-cropped exports (--no-io-projections) "
            f"of a model at least --encoder-embed-dim {width} wide")
    require(args.exported_width % HEAD_DIM == 0 and args.exported_width <= width,
            f"--exported-width {args.exported_width} must be a multiple of {HEAD_DIM} in (0, {width}]")
    dims = _parsed("--exported-layer-widths", args.exported_layer_widths, lambda: built_widths(args)[1])
    num_layers = args.encoder_layers + args.decoder_layers
    require(len(dims) == num_layers, f"--exported-layer-widths {args.exported_layer_widths!r} needs {num_layers} "
                                     f"widths (encoder then decoder layers), got {len(dims)}")
    require(all(0 < d <= width and d % HEAD_DIM == 0 for d in dims),
            f"--exported-layer-widths {args.exported_layer_widths!r}: widths must be multiples of {HEAD_DIM} in "
            f"(0, {width}]")
    # FFN hidden 4·D and D / 64 heads follow from the widths: a different value would be ignored
    built = args.exported_width if args.exported_width and not args.exported_layer_widths else width
    for side in ("encoder", "decoder"):
        for name, derived in ((f"{side}_ffn_embed_dim", 4 * built), (f"{side}_attention_heads", built // HEAD_DIM)):
            require(getattr(args, name) == derived,
                    f"scalable_transformer derives the FFN size and the heads from the widths (Gao et al. 2021, Sec. "
                    f"3.2: FFN 4·D and D / {HEAD_DIM} heads at width D): --{name.replace('_', '-')} must be "
                    f"{derived} at M_max = {built} (leave it out), got {getattr(args, name)}")
    if args.width_dropout:
        try:
            width_dropout(args, width)
        except ValueError:
            refuse(f"--width-dropout must look like '256:0,448:0.1', got {args.width_dropout!r}")
    reject_unapplied(args, "scalable_transformer", "quant_noise_pq", "cross_self_attention")
    require(args.encoder_normalize_before == args.decoder_normalize_before,
            "--encoder-normalize-before and --decoder-normalize-before must agree")


def warn_if_widest_only(args, task):
    """Log a warning when a fairseq task other than ``scalable_translation`` builds a model that is
    not an export: such a task trains and decodes only the widest sub-Transformer (C = M_max), never
    the narrower ones Sec. 3.3 trains, which the user of this arch is unlikely to mean."""
    trains_sub_transformers = TASK_REGISTRY.get("scalable_translation", ())  # by name: the task imports this package
    if isinstance(task, FairseqTask) and not isinstance(task, trains_sub_transformers) and not args.exported_width:
        logger.warning(f"{type(task).__name__} trains and decodes only the widest sub-Transformer (width "
                       f"{args.encoder_embed_dim}); --task scalable_translation trains the narrower ones too (Sec. 3.3)")


@register_model("scalable_transformer")
class ScalableTransformerModel(WideTransformerModel):
    """Scalable Transformer (Gao et al. 2021). Flags: ``ScalableTransformerConfig``; presets
    ``scalable_transformer{,_wmt_en_de,_type2_wmt_en_de,_wmt_en_fr,_tiny}``. Select a sub-Transformer with
    ``set_sample_config``; the widest is active after building."""

    config = ScalableTransformerConfig
    encoder_class = ScalableEncoder
    decoder_class = ScalableDecoder
    paper_preset = "scalable_transformer_wmt_en_de"

    base_preset = staticmethod(lambda args: scalable_transformer(args))  # registered below
    validate = staticmethod(validate_scalable_config)

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        model.set_sample_config(*model.widest_config())
        warn_if_widest_only(args, task)
        return model

    def widest_config(self) -> Tuple[int, List[int]]:
        """C and D^i (encoder then decoder layers) of the widest sub-Transformer this model holds:
        M_max everywhere, or the exported sub-Transformer's built widths."""
        return self.encoder.built_width, [layer.self_attn.max_dim for layer in self.all_layers()]

    def all_layers(self) -> List[ScalableLayer]:
        """Encoder then decoder layers."""
        return [*self.encoder.layers, *self.decoder.layers]

    def set_sample_config(self, width: int, layer_widths: Optional[Sequence[int]] = None):
        """Activate a sub-Transformer (Sec. 3.3).

        Args:
            width (int): C, a multiple of 64 in (0, M_max]. Type-1: alone (D^i = C everywhere).
            layer_widths (list of int, optional): type-2: D^i of each encoder layer then each decoder
                layer (multiples of 64 in (0, M_max]); C is then normally M_max.

        Raises:
            ValueError: on a width outside the range or not a multiple of 64, or a wrong number of
                layer widths.
        """
        layers = self.all_layers()
        layer_widths = list(layer_widths) if layer_widths is not None else [width] * len(layers)
        if len(layer_widths) != len(layers):
            raise ValueError(f"--layer-widths needs {len(layers)} widths (encoder then decoder layers), "
                             f"got {len(layer_widths)}")
        widest, widest_dims = self.widest_config()
        for w, maximum in [(width, widest), *zip(layer_widths, widest_dims)]:
            if not 0 < w <= maximum or w % HEAD_DIM:
                raise ValueError(f"sub-Transformer widths must be multiples of {HEAD_DIM} in (0, {maximum}], got {w}")
        self.encoder.set_widths(width, layer_widths[: len(self.encoder.layers)])
        self.decoder.set_widths(width, layer_widths[len(self.encoder.layers):])
        if self.cfg.width_dropout:  # residual and embedding dropout follow the width C (Appendix B)
            p = width_dropout(self.cfg, width)
            for stack in (self.encoder, self.decoder):
                for module in (stack, *stack.layers):
                    module.dropout_module.p = p

    def sub_transformer_state_dict(self) -> Dict[str, Tensor]:
        """The active sub-Transformer's parameters, cropped (views of the shared tensors), named as
        in this model's state dict; the tied output embedding appears once, as the embedding."""
        return {**{f"encoder.{k}": v for k, v in self.encoder.cropped_state().items()},
                **{f"decoder.{k}": v for k, v in self.decoder.cropped_state().items()}}

    def sub_transformer_num_params(self) -> int:
        """Parameters of the active sub-Transformer, tensors shared by the stacks counted once."""
        unique = {(t.data_ptr(), tuple(t.shape)): t.numel() for t in self.sub_transformer_state_dict().values()}
        return sum(unique.values())


@register_model_architecture("scalable_transformer", "scalable_transformer")
def scalable_transformer(args):
    """Base preset: the paper's widest model, M_max = 1024, 6 + 6 post-norm layers, 16 heads of 64,
    FFN 4096, shared vocabulary with tied output embedding. Another ``--encoder-embed-dim`` (or an
    exported width) brings its own FFN 4·D and D / 64 heads unless they are given."""
    set_defaults(args, **_SCALABLE_DEFAULTS, encoder_embed_dim=1024, share_all_embeddings=True)
    exported = getattr(args, "exported_width", None) and not getattr(args, "exported_layer_widths", None)
    built = args.exported_width if exported else args.encoder_embed_dim
    set_defaults(args, encoder_ffn_embed_dim=4 * built, encoder_attention_heads=built // HEAD_DIM,
                 decoder_attention_heads=built // HEAD_DIM)
    base_architecture(args)


#: Appendix B's width-dependent dropout: En-De (Table 1), En-Fr (Table 8).
EN_DE_DROPOUT, EN_FR_DROPOUT = "256:0,448:0.1,704:0.2,896:0.3", "256:0,640:0.1"


@register_model_architecture("scalable_transformer", "scalable_transformer_wmt_en_de")
def scalable_transformer_wmt_en_de(args):
    """The paper's En-De model: type-1, widths 256..1024, dropout 0 / 0.1 / 0.2 / 0.3 by width."""
    set_defaults(args, width_dropout=EN_DE_DROPOUT, dropout=0.3)
    scalable_transformer(args)


@register_model_architecture("scalable_transformer", "scalable_transformer_type2_wmt_en_de")
def scalable_transformer_type2_wmt_en_de(args):
    """The En-De model trained with type-2 sub-Transformers (C = 1024, D^i per layer)."""
    set_defaults(args, sub_transformer_type="type2")
    scalable_transformer_wmt_en_de(args)


@register_model_architecture("scalable_transformer", "scalable_transformer_wmt_en_fr")
def scalable_transformer_wmt_en_fr(args):
    """The paper's En-Fr model: type-1, dropout 0 up to width 576, 0.1 from 640 (Table 8)."""
    set_defaults(args, width_dropout=EN_FR_DROPOUT, dropout=0.1)
    scalable_transformer(args)


@register_model_architecture("scalable_transformer", "scalable_transformer_tiny")
def scalable_transformer_tiny(args):
    """Tiny model for tests: M_max = 128 (widths 64, 128), 2 + 2 layers."""
    set_defaults(args, encoder_embed_dim=128, encoder_ffn_embed_dim=512, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_layers=2, decoder_layers=2, scalable_widths="64,128")
    scalable_transformer(args)


@register_model_architecture("scalable_transformer", "scalable_transformer_multi30k")
def scalable_transformer_multi30k(args):
    """Multi30k on CPU (examples/scalable_transformer/multi30k.sh): M_max = 256, widths 64..256,
    3 + 3 layers, dropout 0 / 0.1 / 0.2 / 0.3 by width (Appendix B's shape)."""
    set_defaults(args, encoder_embed_dim=256, encoder_ffn_embed_dim=1024, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_layers=3, decoder_layers=3, scalable_widths="64,128,192,256",
                 width_dropout="64:0,128:0.1,192:0.2,256:0.3", dropout=0.3)
    scalable_transformer(args)
