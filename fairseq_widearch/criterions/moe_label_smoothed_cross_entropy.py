"""Label-smoothed cross-entropy plus the MoE balance loss (Xue et al. 2022, Eq. 8):

    loss = l_CE + λ · Σ_{t=1..T} l_balance^t

over the T routing calls of the step (one per routing block of the encoder and decoder), with
l_balance^t = E · Σ_i m_i P_i (Eqs. 3-5) read from the model's ``extra["moe_balance_loss"]``.
"""
import math
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics


@dataclass
class MoELabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    moe_balance_weight: float = field(
        default=0.01, metadata={"help": "λ of Eq. 8, weight of the summed balance losses (paper: 0.01)"}
    )


@register_criterion("moe_label_smoothed_cross_entropy", dataclass=MoELabelSmoothedCrossEntropyConfig)
class MoELabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed CE + λ · Σ_t l_balance^t (Eq. 8).

    The balance term is a per-batch mean, so it is scaled by the sample size like the summed CE
    (fairseq divides the gradient by the sample size). Logged: ``loss`` (total), ``ce_loss``,
    ``nll_loss``, ``moe_balance_loss`` (Σ_t l^t per batch), ``moe_dropped`` (fraction of
    token-to-expert assignments over capacity, mean over calls) and ``moe_load_cv`` (coefficient
    of variation of the tokens each expert processed, mean over calls).

    Raises:
        KeyError: if the model's ``extra`` has no ``moe_balance_loss`` (not an MoE model).
    """

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 moe_balance_weight=0.01):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.moe_balance_weight = moe_balance_weight

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        ce_loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        extra = net_output[1]
        calls = extra["moe_balance_loss"]
        balance = torch.stack(calls).sum() if calls else ce_loss.new_zeros(())
        loss = ce_loss + self.moe_balance_weight * balance.to(ce_loss.dtype) * sample_size
        loads = extra["moe_load"]
        logging_output = {
            "loss": loss.data,
            "ce_loss": ce_loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
            "moe_batches": 1,
            "moe_balance_loss": balance.data,
            "moe_dropped": torch.stack(extra["moe_dropped"]).mean().data if calls else 0.0,
            "moe_load_cv": torch.stack([l.std(unbiased=False) / l.mean().clamp(min=1) for l in loads]).mean().data
            if loads else 0.0,
        }
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        batches = sum(log.get("moe_batches", 0) for log in logging_outputs)
        ce = sum(log.get("ce_loss", 0) for log in logging_outputs)
        metrics.log_scalar("ce_loss", ce / sample_size / math.log(2), sample_size, round=3)
        for key in ("moe_balance_loss", "moe_dropped", "moe_load_cv"):
            metrics.log_scalar(key, sum(log.get(key, 0) for log in logging_outputs) / max(batches, 1), batches,
                               round=4)
