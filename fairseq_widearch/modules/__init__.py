"""Reusable building blocks, each named by its paper's term."""
from .batched_linear import BatchedLinear
from .moe import MoELayer, Routing, TopKRouter
from .multi_path import MultiPathAttention, MultiPathFFN, MultiPathSublayer, PathFusion
from .path_norm import PathNorm

__all__ = ["BatchedLinear", "MoELayer", "MultiPathAttention", "MultiPathFFN", "MultiPathSublayer", "PathFusion",
           "PathNorm", "Routing", "TopKRouter"]
