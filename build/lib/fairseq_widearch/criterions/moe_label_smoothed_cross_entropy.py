"""Label-smoothed cross-entropy plus the MoE balance loss (Xue et al. 2022, Eq. 8):

    loss = l_CE + λ · Σ_{t=1..T} l_balance^t

over the T routing calls of the step (one per routing block of the encoder and decoder), with
l_balance^t = E · Σ_i m_i P_i (Eqs. 3-5) read from the model's ``extra["moe_balance_loss"]``.
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig

from .auxiliary_loss import AuxiliaryLossCriterion


@dataclass
class MoELabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    moe_balance_weight: float = field(
        default=0.01, metadata={"help": "λ of Eq. 8, weight of the summed balance losses (paper: 0.01)"}
    )


@register_criterion("moe_label_smoothed_cross_entropy", dataclass=MoELabelSmoothedCrossEntropyConfig)
class MoELabelSmoothedCrossEntropyCriterion(AuxiliaryLossCriterion):
    """Label-smoothed CE + λ · Σ_t l_balance^t (Eq. 8).

    Logged besides the CE: ``moe_balance_loss`` (Σ_t l^t per batch), ``moe_dropped`` (fraction of
    token-to-expert assignments over capacity, mean over calls) and ``moe_load_cv`` (coefficient
    of variation of the tokens each expert processed, mean over calls).

    Raises:
        KeyError: if the model's ``extra`` has no ``moe_balance_loss`` (not an MoE model).
    """

    STATS = ("moe_balance_loss", "moe_dropped", "moe_load_cv")

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 moe_balance_weight=0.01):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.moe_balance_weight = moe_balance_weight

    def auxiliary(self, extra, ce_loss, sample):
        calls, loads = extra["moe_balance_loss"], extra["moe_load"]
        zero = ce_loss.new_zeros(())
        balance = torch.stack(calls).sum() if calls else zero
        stats = {
            "moe_balance_loss": balance,
            "moe_dropped": torch.stack(extra["moe_dropped"]).mean() if calls else zero,
            "moe_load_cv": torch.stack([load.std(unbiased=False) / load.mean().clamp(min=1) for load in loads]).mean()
            if loads else zero,
        }
        return self.moe_balance_weight * balance, stats
