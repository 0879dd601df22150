"""Training criteria (auxiliary losses are read from the model's ``extra`` output)."""
from . import moe_label_smoothed_cross_entropy
from .moe_label_smoothed_cross_entropy import MoELabelSmoothedCrossEntropyCriterion

__all__ = ["moe_label_smoothed_cross_entropy", "MoELabelSmoothedCrossEntropyCriterion"]
