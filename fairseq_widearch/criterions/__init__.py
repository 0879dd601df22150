"""Training criteria (auxiliary losses are read from the model's ``extra`` output)."""
from . import latent_depth_label_smoothed_cross_entropy, moe_label_smoothed_cross_entropy
from .latent_depth_label_smoothed_cross_entropy import LatentDepthCriterion
from .moe_label_smoothed_cross_entropy import MoELabelSmoothedCrossEntropyCriterion

__all__ = ["latent_depth_label_smoothed_cross_entropy", "moe_label_smoothed_cross_entropy", "LatentDepthCriterion",
           "MoELabelSmoothedCrossEntropyCriterion"]
