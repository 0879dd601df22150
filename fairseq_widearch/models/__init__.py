"""Architectures; importing a module registers its model and presets with fairseq."""
from . import multipath_transformer, widenet
from .multipath_transformer import MultiPathTransformerConfig, MultiPathTransformerModel
from .widenet import WideNetConfig, WideNetModel

__all__ = ["multipath_transformer", "widenet", "MultiPathTransformerConfig", "MultiPathTransformerModel",
           "WideNetConfig", "WideNetModel"]
