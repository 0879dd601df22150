"""Reusable building blocks, each named by its paper's term."""
from .batched_linear import BatchedLinear
from .layer_select import LayerSelect
from .moe import Experts, MoELayer, Routing, TopKRouter
from .multi_path import MultiPathAttention, MultiPathFFN, MultiPathSublayer, PathFusion
from .path_norm import PathNorm

__all__ = ["BatchedLinear", "Experts", "LayerSelect", "MoELayer", "MultiPathAttention", "MultiPathFFN", "MultiPathSublayer", "PathFusion",
           "PathNorm", "Routing", "TopKRouter"]
