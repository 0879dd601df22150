"""Reusable building blocks, each named by its paper's term."""
from .batched_linear import BatchedLinear
from .language_pair import LanguagePairIndex
from .layer_select import LayerSelect
from .moe import Experts, MoELayer, Routing, TopKRouter
from .multi_path import MultiPathAttention, MultiPathAttentionSublayer, MultiPathFFN, MultiPathSublayer, PathFusion
from .partial_attention import PGFFN, GlobalAttentionLogits, HeadExpansion, PartialAttention
from .path_norm import PathNorm
from .slimmable import SlimmableAttention, SlimmableLayerNorm, SlimmableLinear

__all__ = ["BatchedLinear", "Experts", "GlobalAttentionLogits", "HeadExpansion", "LanguagePairIndex", "LayerSelect",
           "MoELayer", "MultiPathAttention", "MultiPathAttentionSublayer", "MultiPathFFN", "MultiPathSublayer",
           "PartialAttention", "PathFusion", "PathNorm", "PGFFN", "Routing", "SlimmableAttention", "SlimmableLayerNorm",
           "SlimmableLinear", "TopKRouter"]
