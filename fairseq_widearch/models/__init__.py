"""Architectures; importing a module registers its model and presets with fairseq."""
from . import latent_depth_transformer, multipath_transformer, partialformer, scalable_transformer, widenet
from .latent_depth_transformer import LatentDepthConfig, LatentDepthTransformerModel
from .multipath_transformer import MultiPathTransformerConfig, MultiPathTransformerModel
from .partialformer import PartialFormerConfig, PartialFormerModel
from .scalable_transformer import ScalableTransformerConfig, ScalableTransformerModel
from .widenet import WideNetConfig, WideNetModel

__all__ = ["latent_depth_transformer", "multipath_transformer", "partialformer", "scalable_transformer", "widenet",
           "LatentDepthConfig", "LatentDepthTransformerModel", "MultiPathTransformerConfig", "MultiPathTransformerModel",
           "PartialFormerConfig", "PartialFormerModel", "ScalableTransformerConfig", "ScalableTransformerModel",
           "WideNetConfig", "WideNetModel"]
