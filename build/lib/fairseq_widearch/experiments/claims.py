"""The claims of the claims study (docs/claims.md): each paper's central claim in miniature, its
design and its own baselines, each the shared Multi30k body (d 128, FFN 512, 4 heads) changed the
way the paper changes it. ``.study`` trains and scores them."""
from dataclasses import dataclass, field
from typing import Dict, Tuple

from .settings import BODY, PRE_NORM

#: Scalable Transformers (Gao et al. 2021, Appendix B): dropout by width, on both sides of the claim.
SCALABLE_DROPOUT = {64: 0.0, 128: 0.1, 192: 0.2, 256: 0.3}
#: Latent depth: fairseq's examples/latent_depth README's --sparsity-weight, β on the KL averaged over layers.
RELEASED_KL_WEIGHT = 0.1
#: A scalable model trains its sub-Transformers under its own task and criterion, stage by stage.
SCALABLE_TASK = ("--task", "scalable_translation", "--criterion", "scalable_self_distillation")


@dataclass(frozen=True)
class System:
    """One trained model: ``flags`` for fairseq-train (arch and model), ``evaluate``: extra
    ``--model-overrides`` for validation and decoding, ``widths``: a scalable model, scored per width."""

    name: str
    flags: Tuple[str, ...]
    evaluate: Dict[str, str] = field(default_factory=dict)
    widths: Tuple[int, ...] = ()


@dataclass(frozen=True)
class Claim:
    """The paper's design against its own baselines; ``pairs``: the (design row, baseline row)
    comparisons that decide it (rows are system names, ``"<name> w<width>"`` for a scalable model)."""

    name: str
    statement: str
    systems: Tuple[System, ...]
    pairs: Tuple[Tuple[str, str], ...]


def transformer(name: str, encoder_layers: int, decoder_layers: int, *extra: str) -> System:
    """The stock pre-norm fairseq Transformer on the shared Multi30k body."""
    return System(name, ("--arch", "transformer", *BODY, "--encoder-layers", str(encoder_layers), "--decoder-layers",
                         str(decoder_layers), *PRE_NORM, *extra))


def independent(width: int) -> System:
    """A post-norm Transformer of one width, shaped as the scalable model's sub-Transformer of that
    width (3 + 3 layers, heads of 64, FFN 4 × width, its width's dropout)."""
    return System(f"independent w{width}", (
        "--arch", "transformer", "--encoder-embed-dim", str(width), "--encoder-ffn-embed-dim", str(4 * width),
        "--encoder-attention-heads", str(width // 64), "--decoder-attention-heads", str(width // 64),
        "--encoder-layers", "3", "--decoder-layers", "3", "--share-all-embeddings",
        "--dropout", str(SCALABLE_DROPOUT[width])))


def build_claims() -> Dict[str, Claim]:
    multipath = ("--arch", "multipath_transformer_multi30k", "--encoder-paths", "4", "--encoder-layers", "3")
    widenet = ("--arch", "widenet_multi30k", "--moe-balance-weight", "0.01")
    # LL-D as its rows in docs/data/claims.jsonl were trained: Eq. 8 as printed (--latent-objective
    # ours) at the released example's KL strength (its --sparsity-weight 0.1 on the KL averaged over
    # layers; ours sums it: 0.1 / 12), straight-through hard samples after 300 updates, the KL ramped
    # over 300, K 6, λ 0.1. The released objective, the latent-depth default, trains apart from these
    # rows (the claims table's latent-depth row in docs/claims.md says so).
    latent = ("--arch", "latent_depth_transformer_multi30k", "--decoder-layers", "12", "--latent-objective", "ours",
              "--latent-kl-weight", str(RELEASED_KL_WEIGHT / 12), "--latent-kl-anneal-updates", "300",
              "--latent-soft-updates", "300", "--latent-target-layers", "6", "--latent-depth-weight", "0.1")
    widths = tuple(SCALABLE_DROPOUT)
    scalable = ("--arch", "scalable_transformer_multi30k", *SCALABLE_TASK,
                "--dropout", str(SCALABLE_DROPOUT[widths[-1]]))
    claims = [
        Claim("multipath", "Multi-path (Table 2, Fig. 1): at equal parameters and FLOPs a shallow multi-path encoder "
              "beats a deep single-path one and the plain shallow one",
              (System("multi-path 3 x 4", multipath), transformer("deep 12 x 1", 12, 3),
               transformer("shallow 3 x 1", 3, 3)),
              (("multi-path 3 x 4", "deep 12 x 1"), ("multi-path 3 x 4", "shallow 3 x 1"))),
        Claim("widenet", "WideNet (Tables 2-3): one MoE shared across blocks with individual LayerNorms beats one "
              "shared dense FFN, and sharing the LayerNorms too hurts",
              (System("WideNet", widenet), System("shared dense FFN", (*widenet, "--widenet-dense-ffn")),
               System("shared LayerNorms", (*widenet, "--widenet-shared-layer-norm")),
               transformer("unshared Transformer", 3, 3)),
              (("WideNet", "shared dense FFN"), ("WideNet", "shared LayerNorms"))),
        Claim("scalable", "Scalable Transformers (Table 2): the sub-Transformers of one model trained in three stages "
              "match or beat models of those widths trained independently",
              (System("scalable", scalable, widths=widths), *(independent(w) for w in widths)),
              tuple((f"scalable w{w}", f"independent w{w}") for w in widths)),
        Claim("latent_depth", "Latent depth (Tables 2-3): with a deeper decoder, learned layer selection matches or "
              "beats the static model of that depth and the static model of the selected depth",
              # decoded with the soft weights, the expectation of training's z: hard selection on its
              # undecided posterior (q 0.48-0.65) ran a depth training never sampled
              (System("LL-D 12, K = 6", latent, evaluate={"latent_inference": "soft"}),
               transformer("static 12", 3, 12), transformer("static 6", 3, 6)),
              (("LL-D 12, K = 6", "static 12"), ("LL-D 12, K = 6", "static 6"))),
        Claim("partialformer", "PartialFormer (Table 1): fewer parameters than the Transformer, and better BLEU",
              (System("PartialFormer", ("--arch", "partialformer_multi30k")),
               transformer("Transformer 4 + 4", 4, 4)),
              (("PartialFormer", "Transformer 4 + 4"),)),
    ]
    return {claim.name: claim for claim in claims}


CLAIMS = build_claims()
