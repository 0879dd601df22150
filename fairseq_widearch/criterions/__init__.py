"""Training criteria (auxiliary losses are read from the model's ``extra`` output)."""
from . import latent_depth_label_smoothed_cross_entropy, moe_label_smoothed_cross_entropy, scalable_self_distillation
from .latent_depth_label_smoothed_cross_entropy import LatentDepthCriterion
from .moe_label_smoothed_cross_entropy import MoELabelSmoothedCrossEntropyCriterion
from .scalable_self_distillation import ScalableSelfDistillationCriterion

__all__ = ["latent_depth_label_smoothed_cross_entropy", "moe_label_smoothed_cross_entropy", "LatentDepthCriterion",
           "MoELabelSmoothedCrossEntropyCriterion", "scalable_self_distillation", "ScalableSelfDistillationCriterion"]
