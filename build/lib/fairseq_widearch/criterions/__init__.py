"""Training criteria (auxiliary losses are read from the model's ``extra`` output): every module of
this folder is imported, as fairseq imports its own criterions, and so registers its criterion."""
import importlib
import pkgutil

from .latent_depth_label_smoothed_cross_entropy import LatentDepthCriterion
from .moe_label_smoothed_cross_entropy import MoELabelSmoothedCrossEntropyCriterion
from .scalable_self_distillation import ScalableSelfDistillationCriterion

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["LatentDepthCriterion", "MoELabelSmoothedCrossEntropyCriterion", "ScalableSelfDistillationCriterion"]
