"""Latent-depth Transformer (Li et al. 2020, "Deep Transformers with Latent Depth", NeurIPS 2020).

A pre-norm Transformer whose latent stacks (encoder: LL-E, decoder: LL-D, both: LL-Both) scale
every residual branch of layer l by one selection weight z_l (Eq. 2, reading (A) of the paper
summary: the same z_l on the self-attention, cross-attention and FFN branches of layer l):

    x ← x + z_l · SubLayer(LN(x))       for every sub-layer of layer l

z comes from ``fairseq_widearch.modules.LayerSelect``: Gumbel-sigmoid samples in training
(Eq. 5), deterministic at inference (the mean of the training samples, or hard selection with
z = 0 layers skipped).
Layers subclass fairseq's own, so parameter names equal a stock pre-norm ``transformer``'s.
The posterior q(z = 1) and the samples z of each latent stack travel in ``encoder_out`` /
``extra`` (``latent_probs_encoder``/``latent_samples_encoder``, the ``_decoder`` pair, and
``latent_num_updates`` for the criterion's schedules); see ``LayerSelect.outputs``.

Multilingual (Sec. 2.2, Eq. 7): on fairseq's ``translation_multi_simple_epoch`` task every language
pair of ``--lang-pairs`` gets its own posterior, in both latent stacks. A sentence's pair is read
from the encoder language token in front of its source (``--encoder-langtok tgt`` for
one-to-many, ``src`` for many-to-one; ``fairseq_widearch.modules.LanguagePairIndex``); the
encoder passes the pair indices on as ``latent_pair`` ``(B,)``, reordered with the beams.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    base_architecture,
)
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor

from ..criterions.latent_depth_label_smoothed_cross_entropy import OBJECTIVE_DEFAULTS, objective_of
from ..modules.language_pair import LanguagePairIndex
from ..modules.layer_select import INFERENCE_MODES, LayerSelect, logistic_noise
from ..validation import reject_unapplied, require, validate_transformer_sizes
from .base import (
    NO_ALIGNMENT,
    LayerLoopDecoder,
    LayerLoopEncoder,
    WideTransformerModel,
    added_defaults,
    alignment_weights,
    wrap_layer,
)
from .presets import MULTI30K_BODY, register_preset, set_defaults, set_unset


@dataclass
class LatentDepthConfig(TransformerConfig):
    """Flags of ``latent_depth_transformer`` on top of fairseq's ``TransformerConfig``."""

    encoder_latent_layer: bool = field(default=False, metadata={"help": "latent layers in the encoder (LL-E)"})
    decoder_latent_layer: bool = field(default=False, metadata={"help": "latent layers in the decoder (LL-D)"})
    latent_logit_init: float = field(
        default=0.0, metadata={"help": "initial logit α_l of every layer (0: q(z_l = 1) = 0.5)"}
    )
    latent_temperature: float = field(default=5.0, metadata={"help": "Gumbel-sigmoid temperature τ at update 0 (Eq. 5)"})
    latent_min_temperature: float = field(
        default=5.0, metadata={"help": "τ at the end of --latent-temperature-anneal-updates (exponential decay)"}
    )
    latent_temperature_anneal_updates: int = field(default=0, metadata={"help": "τ anneal window; 0 = constant τ"})
    latent_soft_updates: Optional[int] = field(
        default=None, metadata={"help": "s: relaxed samples of z for this many updates, straight-through hard ones "
                                        "after (the released example's --soft-update); -1 = always relaxed (the "
                                        "paper's text); unset: the preset's, the released example's scaled to its "
                                        "budget (-1 under --latent-objective ours)"}
    )
    latent_inference: ChoiceEnum(INFERENCE_MODES) = field(
        default="soft", metadata={"help": "z at inference: soft = the mean of the z training draws at the current "
                                           "update (E[σ((α_l + g_1 − g_2)/τ)], or q(z_l = 1) once samples are "
                                           "straight-through hard); sampled = one draw of what training draws per "
                                           "sentence (Eq. 5), kept for all its decoding steps, reproducible for a "
                                           "given --seed and batching; hard = 1[q > threshold] (z = 0 layers "
                                           "skipped)"}
    )
    latent_threshold: float = field(default=0.5, metadata={"help": "threshold of hard selection"})
    latent_lang_pairs: str = field(
        default="", metadata={"help": "language pairs, one posterior each (Eq. 7), comma-separated; filled in from "
                                      "translation_multi_simple_epoch's --lang-pairs; empty: bilingual"}
    )
    latent_pair_langtoks: str = field(
        default="", metadata={"help": "the encoder language token that identifies each pair of --latent-lang-pairs; "
                                      "filled in from the task's --encoder-langtok"}
    )


_LATENT_DEFAULTS = added_defaults(LatentDepthConfig)


def language_pairs(cfg) -> List[str]:
    return cfg.latent_lang_pairs.split(",") if cfg.latent_lang_pairs else []


def build_layer_select(cfg, num_layers: int) -> LayerSelect:
    return LayerSelect(num_layers, max(len(language_pairs(cfg)), 1), cfg.latent_logit_init, cfg.latent_temperature,
                       cfg.latent_min_temperature, cfg.latent_temperature_anneal_updates, cfg.latent_soft_updates,
                       cfg.latent_inference, cfg.latent_threshold)


def latent_residual(layer, x: Tensor, layer_norm, sublayer, z: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    """One residual branch scaled by z_l: ``x + z·F(Norm(x))`` pre-norm (Eqs. 1-2), ``Norm(x + z·F(x))``
    post-norm (the released example's ``residual_connection`` in its ``latent_multilingual_transformer``,
    where z = 0 still normalises). x ``(T, B, C)``; z scalar or ``(B, 1)`` per sentence; ``sublayer`` maps
    ``(T, B, C)`` to (output ``(T, B, C)``, attention weights or None); returns (x, those weights)."""
    h, weights = sublayer(layer_norm(x) if layer.normalize_before else x)
    x = x + z * layer.dropout_module(h)
    return (x if layer.normalize_before else layer_norm(x)), weights


def feed_forward(layer, h: Tensor) -> Tuple[Tensor, None]:
    """The FFN sub-layer of a fairseq encoder or decoder layer, ``(T, B, C) -> (T, B, C)``, in
    ``latent_residual``'s (output, weights) form."""
    return layer.fc2(layer.activation_dropout_module(layer.activation_fn(layer.fc1(h)))), None


class LatentEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer (pre- or post-norm) with both residual branches scaled by z_l (Eq. 2)."""

    def forward(self, x, encoder_padding_mask, z: Tensor):
        """x ``(src_len, B, C)``, encoder_padding_mask ``(B, src_len)`` or None, z scalar or ``(B, 1)``
        per sentence -> ``(src_len, B, C)``."""
        x, _ = latent_residual(self, x, self.self_attn_layer_norm, lambda h: self.self_attn(
            query=h, key=h, value=h, key_padding_mask=encoder_padding_mask, need_weights=False), z)
        return latent_residual(self, x, self.final_layer_norm, lambda h: feed_forward(self, h), z)[0]


class LatentDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer (pre- or post-norm) with its three residual branches scaled by z_l (Eq. 2)."""

    def forward(self, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                self_attn_padding_mask, need_head_weights: bool, z: Tensor):
        """x ``(tgt_len, B, C)``, encoder_out ``(src_len, B, C)``, z scalar or ``(B, 1)`` -> ``(x (tgt_len, B,
        C), cross-attention weights (heads, B, tgt_len, src_len) if need_head_weights else None)``."""
        x, _ = latent_residual(self, x, self.self_attn_layer_norm, lambda h: self.self_attn(
            query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask, incremental_state=incremental_state,
            need_weights=False, attn_mask=self_attn_mask), z)
        x, attn = latent_residual(self, x, self.encoder_attn_layer_norm, lambda h: self.encoder_attn(
            query=h, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state, static_kv=True, need_weights=need_head_weights,
            need_head_weights=need_head_weights), z)
        return latent_residual(self, x, self.final_layer_norm, lambda h: feed_forward(self, h), z)[0], attn


def _skipped(select: LayerSelect, weight: Tensor, prunable: bool) -> bool:
    """A layer deselected for every sentence at hard inference is not computed (the pruned model);
    a post-norm layer is (``prunable`` False): with z = 0 it still applies its LayerNorms."""
    return prunable and not select.training and select.inference == "hard" and not bool(weight.any())


def pair_means(z: Tensor, pair: Optional[Tensor], num_pairs: int) -> Tensor:
    """Per-sentence z ``(B, L)`` -> the mean over each pair's sentences ``(P, L)`` (0 for a pair with
    none), the ``latent_samples_*`` output of sampled inference."""
    pair = pair if pair is not None else z.new_zeros(len(z), dtype=torch.long)
    sums = z.new_zeros(num_pairs, z.size(1)).index_add_(0, pair, z)
    return sums / torch.bincount(pair, minlength=num_pairs).clamp_min(1).unsqueeze(-1).to(z)


def layer_weights(select: LayerSelect, pair: Optional[Tensor], stack: str, noise: Optional[Tensor]):
    """(the weight of each layer: ``(L,)`` or ``(L, B, 1)``; the stack's auxiliary outputs)."""
    if not select.per_sentence():
        z = select()
        return select.layer_weights(z, pair), select.outputs(stack, z)
    if noise is None:
        raise ValueError(f"sampled latent inference needs per-sentence noise for the {stack} from the encoder "
                         "(LatentDepthEncoder, built when --latent-inference is sampled)")
    z = select.sentence_samples(noise, pair)  # (B, L)
    return z.t().unsqueeze(-1), select.outputs(stack, pair_means(z, pair, len(select.logits)))


def run_latent_layers(layers, select: Optional[LayerSelect], pair: Optional[Tensor], stack: str, x: Tensor,
                      states: Optional[List], *layer_args, alignment_layer: Optional[int] = None,
                      noise: Optional[Tensor] = None, prunable: bool = True) -> Tuple[Tensor, Dict[str, List[Tensor]]]:
    """``x ← layer(x, *layer_args, z_l)`` for each layer (z = 1 for a static stack), appending each
    output to ``states``; returns x and the stack's auxiliary outputs. Decoder layers (given an
    ``alignment_layer``) also return their cross-attention weights: those of the alignment layer,
    or, if hard selection skips it, of the last computed layer before it (``attn``). ``noise``
    ``(B, L)``: each sentence's noise for sampled inference; ``prunable``: the stack is pre-norm (a
    post-norm layer with z = 0 is not the identity)."""
    if select is None:
        weights, aux = [1.0] * len(layers), {}
    else:
        weights, aux = layer_weights(select, pair, stack, noise)
    computed = {i for i, weight in enumerate(weights) if select is None or not _skipped(select, weight, prunable)}
    # the last computed layer up to it (else the first computed one)
    if alignment_layer is not None and alignment_layer != NO_ALIGNMENT:
        before = [i for i in computed if i <= alignment_layer]
        alignment_layer = max(before) if before else min(computed, default=-1)
    for i, (layer, weight) in enumerate(zip(layers, weights)):
        if i in computed:
            z_l = weight if select is None else weight.to(x.dtype)
            if alignment_layer is None:
                x = layer(x, *layer_args, z_l)
            else:
                x, attn = layer(x, *layer_args, i == alignment_layer, z_l)
                aux.update(alignment_weights(attn))
        if states is not None:
            states.append(x)
    return x, aux


#: Per-sentence auxiliary outputs of the encoder, reordered with the beams (the rest are batch statistics).
PER_SENTENCE = ("latent_pair", "latent_noise_decoder")


class LatentDepthEncoder(LayerLoopEncoder):
    """Encoder of latent layers (``extra`` keys ``latent_probs_encoder``, ``latent_samples_encoder``);
    also the static encoder of an LL-D model where a sentence needs more than its tokens: in
    multilingual mode it identifies each sentence's language pair (``latent_pair`` ``(B,)``), and
    under sampled inference it draws each sentence's noise for the latent decoder once, before
    beam search copies the sentence (``latent_noise_decoder`` ``(B, L_dec)``), so that every beam
    and decoding step of a sentence uses the same layers."""

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.layer_select = build_layer_select(cfg, cfg.encoder.layers) if cfg.encoder_latent_layer else None
        pairs = language_pairs(cfg)
        self.language_pair = LanguagePairIndex(dictionary, cfg.latent_pair_langtoks.split(",")) if pairs else None
        sampled = cfg.decoder_latent_layer and cfg.latent_inference == "sampled"
        self.decoder_noise_layers = cfg.decoder.layers if sampled else 0

    def build_encoder_layer(self, cfg):
        return wrap_layer(LatentEncoderLayer(cfg), cfg)

    def run_layers(self, x, padding_mask, states, src_tokens):
        pair = self.language_pair(src_tokens) if self.language_pair is not None else None
        mask = padding_mask if padding_mask.any() else None
        select, batch_size = self.layer_select, len(src_tokens)
        noise = (logistic_noise(batch_size, len(self.layers), x.device)
                 if select is not None and select.per_sentence() else None)
        x, aux = run_latent_layers(self.layers, select, pair, "encoder", x, states, mask, noise=noise,
                                   prunable=self.cfg.encoder.normalize_before)
        if self.decoder_noise_layers and not self.training:
            aux["latent_noise_decoder"] = [logistic_noise(batch_size, self.decoder_noise_layers, x.device)]
        return x, aux if pair is None else {**aux, "latent_pair": [pair]}

    def reorder_encoder_out(self, encoder_out, new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        for key in PER_SENTENCE:
            if key in encoder_out:
                reordered[key] = [encoder_out[key][0].index_select(0, new_order)]
        return reordered


class LatentDepthDecoder(LayerLoopDecoder):
    """Decoder of latent layers: ``extra`` keys ``latent_probs_decoder``, ``latent_samples_decoder``."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.layer_select = build_layer_select(cfg, cfg.decoder.layers)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(LatentDecoderLayer(cfg, no_encoder_attn), cfg)

    def run_layers(self, x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask,
                   self_attn_padding_mask, padding_mask, inner_states, encoder_aux, alignment_layer):
        pair = encoder_aux["latent_pair"][0] if "latent_pair" in encoder_aux else None
        noise = encoder_aux["latent_noise_decoder"][0] if "latent_noise_decoder" in encoder_aux else None
        return run_latent_layers(self.layers, self.layer_select, pair, "decoder", x, inner_states, encoder_out,
                                 encoder_padding_mask, incremental_state, self_attn_mask, self_attn_padding_mask,
                                 alignment_layer=alignment_layer, noise=noise,
                                 prunable=self.cfg.decoder.normalize_before)


def configure_language_pairs(args, task):
    """Multilingual mode on ``translation_multi_simple_epoch``: one posterior per pair of the task's
    ``--lang-pairs``, each identified by its encoder language token. Kept from the checkpoint when
    loading. Raises ``ValueError`` if the language tokens cannot tell the pairs apart."""
    if getattr(args, "latent_lang_pairs", "") or not hasattr(task, "data_manager"):
        return
    spec = task.args.langtoks["main"][0]
    require(spec is not None and not task.args.lang_tok_replacing_bos_eos,
            "multilingual latent depth reads a sentence's language pair from the language token in front of its "
            "source: set --encoder-langtok (tgt for one-to-many, src for many-to-one), without "
            "--lang-tok-replacing-bos-eos")
    langtoks = [task.source_dictionary[task.data_manager.get_encoder_langtok(*pair.split("-"), spec)]
                for pair in task.lang_pairs]
    require(len(set(langtoks)) == len(langtoks),
            f"--encoder-langtok {spec} gives the language pairs {task.lang_pairs} the tokens {langtoks}, which do "
            f"not tell them apart (tgt tells one-to-many pairs apart, src many-to-one)")
    args.latent_lang_pairs, args.latent_pair_langtoks = ",".join(task.lang_pairs), ",".join(langtoks)


def validate_latent_depth_config(args):
    """Raise ``ValueError`` naming the flag and value of the first invalid setting."""
    validate_transformer_sizes(args)
    require(args.encoder_latent_layer or args.decoder_latent_layer,
            "latent_depth_transformer needs --encoder-latent-layer and/or --decoder-latent-layer")
    # LayerSelect is itself a learned layer drop; fairseq's random one would misalign z_l and layer l
    reject_unapplied(args, "latent_depth_transformer", "encoder_layerdrop", "decoder_layerdrop", "cross_self_attention")
    require(0 < args.latent_threshold < 1, f"--latent-threshold must be in (0, 1), got {args.latent_threshold}")
    require(args.latent_temperature > 0 and args.latent_min_temperature > 0,
            f"--latent-temperature and --latent-min-temperature must be > 0, got {args.latent_temperature} and "
            f"{args.latent_min_temperature}")
    pairs, langtoks = args.latent_lang_pairs, args.latent_pair_langtoks
    require(len(pairs.split(",")) == len(langtoks.split(",")) if pairs else not langtoks,
            f"--latent-pair-langtoks {langtoks!r} needs one token per pair of --latent-lang-pairs {pairs!r}")


@register_model("latent_depth_transformer")
class LatentDepthTransformerModel(WideTransformerModel):
    """Latent-depth Transformer (Li et al. 2020), bilingual or multilingual. Flags: ``LatentDepthConfig``;
    presets ``latent_depth_transformer_{lld_12_24, lld_12_48, llboth_36_36, llboth_48_48,
    llboth_64_64, o2m_12_24, multi30k, tiny}``. A non-latent stack is fairseq's own stack."""

    config = LatentDepthConfig
    auxiliary_criterion = "latent_depth_label_smoothed_cross_entropy"
    auxiliary_losses = "latent depth's KL and target-depth losses (Li et al. 2020, Eq. 8)"
    paper_preset = "latent_depth_transformer_lld_12_24"

    base_preset = staticmethod(lambda args: latent_depth_transformer(args))  # registered below
    validate = staticmethod(validate_latent_depth_config)

    @classmethod
    def build_model(cls, args, task):
        configure_language_pairs(args, task)
        return super().build_model(args, task)

    @classmethod
    def encoder_class_for(cls, cfg):
        per_sentence = bool(cfg.latent_lang_pairs) or cfg.latent_inference == "sampled"
        return LatentDepthEncoder if cfg.encoder_latent_layer or per_sentence else TransformerEncoderBase

    @classmethod
    def decoder_class_for(cls, cfg):
        return LatentDepthDecoder if cfg.decoder_latent_layer else TransformerDecoderBase


#: The released example's schedule (its README: --soft-update 500 --anneal-updates 5000), for the
#: presets of the paper's budgets.
RELEASED_SCHEDULE = (500, 5000)
#: The same scaled to the Multi30k recipes, by their warm-up: the released example warms up over
#: 8,000 updates, ours over 300, so s = 500·300/8000 ≈ 19 and a = 5000·300/8000 ≈ 188 (the L_K ramp
#: ends at s + 2a = 395 of the 1,320-update comparison). The one-to-many regime study scales the
#: same way (examples/latent_depth/depth_regime.py).
MULTI30K_SCHEDULE = (19, 188)
#: The tests' budget of a few updates: relaxed for 1, the KL ramp over 2, L_K fully on from update 5.
TINY_SCHEDULE = (1, 2)


def training_schedule(args, soft_updates: int, kl_anneal_updates: int):
    """A preset's training schedule, where the user left it unset: s = ``--latent-soft-updates`` (relaxed
    samples before it, straight-through hard from it) and a = ``--latent-kl-anneal-updates`` (the
    criterion's KL ramp), the released example's scaled to the preset's budget, and β =
    ``--latent-kl-weight``; under ``--latent-objective ours``, ours' (relaxed throughout, no ramp, β = 1:
    ``OBJECTIVE_DEFAULTS``). The first preset in a chain wins."""
    objective = objective_of(args)
    schedule = dict(latent_soft_updates=soft_updates, latent_kl_anneal_updates=kl_anneal_updates)
    set_unset(args, **{**schedule, **{k: v for k, v in OBJECTIVE_DEFAULTS[objective].items() if k in schedule}},
              latent_kl_weight=OBJECTIVE_DEFAULTS[objective]["latent_kl_weight"])


def target_depth(args) -> int:
    """K where unset: half the depth of the shallowest latent stack (the released example's 12 of 24),
    0 (none) under ``--latent-objective ours``."""
    if objective_of(args) == "ours":
        return OBJECTIVE_DEFAULTS["ours"]["latent_target_layers"]
    depths = [n for latent, n in ((args.encoder_latent_layer, args.encoder_layers),
                                  (args.decoder_latent_layer, args.decoder_layers)) if latent]
    return min(depths, default=0) // 2


@register_model_architecture("latent_depth_transformer", "latent_depth_transformer")
def latent_depth_transformer(args):
    """Base preset: the body that fits Table 1's counts (d = 512, FFN 1024, 8 heads, pre-norm,
    tied decoder input/output embeddings, separate vocabularies), latent decoder (LL-D), trained as
    the released example trains (``training_schedule`` at its 500 and 5,000 updates; K
    ``target_depth``)."""
    training_schedule(args, *RELEASED_SCHEDULE)
    set_defaults(args, **{**_LATENT_DEFAULTS, "decoder_latent_layer": True}, encoder_ffn_embed_dim=1024,
                 encoder_normalize_before=True, decoder_normalize_before=True,
                 share_decoder_input_output_embed=True)
    base_architecture(args)
    set_unset(args, latent_target_layers=target_depth(args))


def table1(name: str, encoder_layers: int, decoder_layers: int, both: bool):
    """Register Table 1's row ``name``: latent decoder (LL-D), or latent encoder and decoder (LL-Both)."""
    register_preset("latent_depth_transformer", name, latent_depth_transformer,
                    f"Li et al. 2020, Table 1: {'LL-Both' if both else 'LL-D'}, {encoder_layers}/{decoder_layers} "
                    f"layers, K = {decoder_layers // 2}.", encoder_layers=encoder_layers, decoder_layers=decoder_layers,
                    encoder_latent_layer=both, decoder_latent_layer=True)


table1("latent_depth_transformer_lld_12_24", 12, 24, both=False)
table1("latent_depth_transformer_lld_12_48", 12, 48, both=False)
table1("latent_depth_transformer_llboth_36_36", 36, 36, both=True)
table1("latent_depth_transformer_llboth_48_48", 48, 48, both=True)
table1("latent_depth_transformer_llboth_64_64", 64, 64, both=True)


register_preset("latent_depth_transformer", "latent_depth_transformer_o2m_12_24", latent_depth_transformer,
                "Li et al. 2020, Table 3: LL-D 12/24 as fairseq's examples/latent_depth trains it (the body of "
                "the example's latent_multilingual_transformer, which its README's command calls "
                "multilingual_transformer_iwslt_de_en: post-norm, d = 512, FFN 1024, 4 heads; dropout and attention "
                "dropout 0.3; s 500, a 5,000, K 12).", encoder_layers=12, decoder_layers=24, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_normalize_before=False, decoder_normalize_before=False,
                dropout=0.3, attention_dropout=0.3)


@register_model_architecture("latent_depth_transformer", "latent_depth_transformer_multi30k")
def latent_depth_transformer_multi30k(args):
    """Quick-start size (the shared Multi30k body) with 6 latent decoder layers (LL-D 3/6), the released
    schedule scaled to the Multi30k recipes' warm-up (``MULTI30K_SCHEDULE``: s 19, a 188; K 3)."""
    set_defaults(args, **{**MULTI30K_BODY, "decoder_layers": 6})
    training_schedule(args, *MULTI30K_SCHEDULE)
    latent_depth_transformer(args)


@register_model_architecture("latent_depth_transformer", "latent_depth_transformer_tiny")
def latent_depth_transformer_tiny(args):
    """Tiny model for tests: LL-Both, 2 encoder and 3 decoder layers, d = 32; ``TINY_SCHEDULE``, K 1."""
    set_defaults(args, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4, encoder_layers=2,
                 decoder_layers=3, decoder_attention_heads=4, encoder_latent_layer=True)
    training_schedule(args, *TINY_SCHEDULE)
    latent_depth_transformer(args)
