"""Architectures; importing a module registers its model and presets with fairseq."""
from . import multipath_transformer
from .multipath_transformer import MultiPathTransformerConfig, MultiPathTransformerModel

__all__ = ["multipath_transformer", "MultiPathTransformerConfig", "MultiPathTransformerModel"]
