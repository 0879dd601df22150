"""Reusable building blocks, each named by its paper's term."""
from .batched_linear import BatchedLinear
from .language_pair import LanguagePairIndex
from .layer_select import LayerSelect
from .moe import Experts, MoELayer, Routing, TopKRouter
from .multi_path import MultiPathAttention, MultiPathFFN, MultiPathSublayer, PathFusion
from .path_norm import PathNorm

__all__ = ["BatchedLinear", "Experts", "LanguagePairIndex", "LayerSelect", "MoELayer", "MultiPathAttention",
           "MultiPathFFN", "MultiPathSublayer", "PathFusion", "PathNorm", "Routing", "TopKRouter"]
