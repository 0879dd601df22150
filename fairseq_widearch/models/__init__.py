"""Architectures; importing a module registers its model and presets with fairseq."""
from . import latent_depth_transformer, multipath_transformer, partialformer, widenet
from .latent_depth_transformer import LatentDepthConfig, LatentDepthTransformerModel
from .multipath_transformer import MultiPathTransformerConfig, MultiPathTransformerModel
from .partialformer import PartialFormerConfig, PartialFormerModel
from .widenet import WideNetConfig, WideNetModel

__all__ = ["latent_depth_transformer", "multipath_transformer", "partialformer", "widenet", "LatentDepthConfig",
           "LatentDepthTransformerModel", "MultiPathTransformerConfig", "MultiPathTransformerModel",
           "PartialFormerConfig", "PartialFormerModel", "WideNetConfig", "WideNetModel"]
