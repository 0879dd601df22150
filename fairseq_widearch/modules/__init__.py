"""Reusable building blocks, each named by its paper's term."""
from .multi_path import MultiPathAttention, MultiPathFFN, MultiPathSublayer, PathFusion, PathwiseLinear
from .path_norm import PathNorm

__all__ = ["MultiPathAttention", "MultiPathFFN", "MultiPathSublayer", "PathFusion", "PathNorm", "PathwiseLinear"]
