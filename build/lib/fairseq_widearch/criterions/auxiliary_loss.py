"""Label-smoothed cross-entropy plus a model's auxiliary losses, read from its ``extra`` output."""
import math
from typing import Dict, Tuple

from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.logging import metrics
from torch import Tensor


class AuxiliaryLossCriterion(LabelSmoothedCrossEntropyCriterion):
    """In training ``loss = CE + sample_size · aux``: subclasses return the weighted auxiliary
    loss ``aux`` (a per-batch mean, hence scaled by the sample size like the summed CE, since
    fairseq divides the gradient by the sample size) and per-batch statistics to log, from the
    model's ``extra``. In evaluation (``model.eval()``: validation, ``fairseq-validate``) ``loss``
    is the label-smoothed translation loss alone, so that ``--best-checkpoint-metric loss`` and
    validation losses compare translation quality, not a mix that changes with the auxiliary
    weights and their schedules; the auxiliary terms are still logged, each under its own name.

    Logged: ``loss``, ``ce_loss``, ``nll_loss``, and every statistic of ``STATS`` that the
    batches report, averaged over batches (and data-parallel workers).
    """

    STATS: Tuple[str, ...] = ()

    def auxiliary(self, extra: Dict, ce_loss: Tensor, sample: Dict) -> Tuple[Tensor, Dict[str, Tensor]]:
        """The model's ``extra``, the summed CE and the batch -> (weighted auxiliary loss, scalar
        tensor; {stat: scalar tensor} for ``STATS``)."""
        raise NotImplementedError

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        ce_loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        aux, stats = self.auxiliary(net_output[1], ce_loss, sample)
        loss = ce_loss + aux.to(ce_loss.dtype) * sample_size if model.training else ce_loss
        logging_output = {
            "loss": loss.data, "ce_loss": ce_loss.data, "nll_loss": nll_loss.data, "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0), "sample_size": sample_size, "aux_batches": 1,
            **{key: value.data for key, value in stats.items()},
        }
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        batches = max(sum(log.get("aux_batches", 0) for log in logging_outputs), 1)
        ce = sum(log.get("ce_loss", 0) for log in logging_outputs)
        metrics.log_scalar("ce_loss", ce / sample_size / math.log(2), sample_size, round=3)
        for key in cls.STATS:
            if any(key in log for log in logging_outputs):
                metrics.log_scalar(key, sum(log.get(key, 0) for log in logging_outputs) / batches, batches, round=4)
