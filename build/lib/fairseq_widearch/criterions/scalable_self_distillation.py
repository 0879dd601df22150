"""Three-stage training objective of Scalable Transformers (Gao et al. 2021, Sec. 3.3, Eqs. 6-9).

Every update trains the widest sub-Transformer T_max and the sampled ones 𝕋^(j) (the
``scalable_translation`` task draws them and runs one forward/backward per sub-Transformer):

    stage 1 (Eq. 6): L = L_ce(T_max; G) + Σ_T L_ce(T; G)
    stage 2 (Eq. 7): L = L_ce(T_max; G) + λ2^(j) Σ_T L_ce(T; G) + (1 − λ2^(j)) Σ_T L_ce(T; T_max)
    stage 3 (Eq. 9): L = L_ce(T_max; B) + λ3 Σ_T L_ce(T; B) + (1 − λ3) Σ_T L_ce(T; T_max)

with G the ground truth, B the widest model's beam outputs (stage 3 trains on a data set whose
targets are B), λ2^(j) = 1 − 0.5 j / t_j for j < t_j and 0.5 after (Eq. 8), and L_ce(T; T_max)
the cross-entropy of T against the widest model's per-token distribution of the same step,
detached (the teacher is not pulled towards its students), at temperature 1. Ground-truth and
beam terms are label-smoothed; the distillation term is not (paper summary, decisions 2-3).
"""
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
    label_smoothed_nll_loss,
)
from fairseq.logging import metrics
from omegaconf import II
from torch import Tensor

from ..validation import refuse

#: Logged sums, each divided by the sample size (bits per token) when reduced.
TERMS = ("widest_loss", "sub_loss", "sub_nll_loss", "distill_loss")


@dataclass
class ScalableSelfDistillationConfig(LabelSmoothedCrossEntropyCriterionConfig):
    distill_stage: int = field(
        default=1, metadata={"help": "1: Eq. 6 (ground truth only); 2: Eq. 7 (word-level self-distillation from "
                                     "the widest model, λ2 annealed by Eq. 8); 3: Eq. 9 (data = the widest model's "
                                     "beam outputs, λ3)"}
    )
    lambda2_anneal_updates: int = field(
        default=0, metadata={"help": "t_j of Eq. 8: λ2 falls linearly from 1 to 0.5 over the first t_j updates of "
                                     "stage 2 (not given in the paper); 0: a third of --max-update"}
    )
    lambda3: float = field(
        default=0.9, metadata={"help": "λ3 of Eq. 9, the weight of the beam targets for the sub-Transformers "
                                       "(1 − λ3 on the widest model's soft targets). Table 4 gives 0.9; the text's "
                                       "0.1 is read as the soft-target weight 1 − λ3"}
    )
    max_update: int = II("optimization.max_update")


@register_criterion("scalable_self_distillation", dataclass=ScalableSelfDistillationConfig)
class ScalableSelfDistillationCriterion(LabelSmoothedCrossEntropyCriterion):
    """Eqs. 6-9 (module docstring). ``forward`` is plain label-smoothed cross-entropy at the active
    sub-Transformer (validation, generation scoring); training calls ``widest_loss`` once and
    ``sub_transformer_loss`` per sampled sub-Transformer.

    Logged: ``loss`` (L), ``nll_loss`` (the widest model's), ``widest_loss`` (its label-smoothed
    term), ``sub_loss`` / ``sub_nll_loss`` (ground-truth or beam terms of the sub-Transformers,
    summed over them, unweighted), ``distill_loss`` (Σ_T L_ce(T; T_max), unweighted) and
    ``distill_lambda`` (λ of the step).

    Raises:
        ValueError: on a stage other than 1-3, λ3 outside [0, 1], or stage 2 with neither
            ``--lambda2-anneal-updates`` nor ``--max-update``.
    """

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 distill_stage=1, lambda2_anneal_updates=0, lambda3=0.9, max_update=0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if distill_stage not in (1, 2, 3):
            refuse(f"--distill-stage must be 1, 2 or 3, got {distill_stage}")
        if not 0 <= lambda3 <= 1:
            refuse(f"--lambda3 must be in [0, 1], got {lambda3}")
        self.stage, self.lambda3 = distill_stage, lambda3
        self.anneal_updates = lambda2_anneal_updates or (max_update or 0) // 3
        if distill_stage == 2 and self.anneal_updates <= 0:
            refuse("--distill-stage 2 needs t_j: set --lambda2-anneal-updates or --max-update")

    def mixing_weight(self, update_num: int) -> float:
        """λ of update ``update_num`` (counted from the start of the stage): 1 in stage 1,
        λ2^(j) of Eq. 8 in stage 2, λ3 in stage 3. The sub-Transformers' distillation term has
        weight 1 − λ."""
        if self.stage == 1:
            return 1.0
        if self.stage == 2:
            return 1.0 - 0.5 * min(update_num, self.anneal_updates) / self.anneal_updates
        return self.lambda3

    def _terms(self, model, sample, teacher: Optional[Tensor]):
        """Label-smoothed and NLL sums against the data targets, the distillation sum against
        ``teacher`` ``(N, V)`` probabilities (or None), and this model's ``(N, V)`` log-probabilities."""
        lprobs, target = self.get_lprobs_and_target(model, model(**sample["net_input"]), sample)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=self.padding_idx)
        # padding masked by a product, not by indexing: a boolean index waits for the GPU
        distill = None if teacher is None else -((teacher * lprobs).sum(-1) * target.ne(self.padding_idx)).sum()
        return loss, nll_loss, distill, lprobs

    def widest_loss(self, model, sample, update_num: int):
        """L_ce(T_max; G or B) with the widest sub-Transformer active.

        Returns:
            loss (scalar, summed over tokens), sample size, logging output, and the teacher
            distribution ``(N, V)`` (detached; None when λ = 1 needs none).
        """
        loss, nll_loss, _, lprobs = self._terms(model, sample, None)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        log = {"loss": loss.data, "nll_loss": nll_loss.data, "widest_loss": loss.data, "ntokens": sample["ntokens"],
               "nsentences": sample["target"].size(0), "sample_size": sample_size,
               "distill_lambda": self.mixing_weight(update_num), "distill_batches": 1}
        return loss, sample_size, log, lprobs.detach().exp() if self.mixing_weight(update_num) < 1 else None

    def sub_transformer_loss(self, model, sample, teacher: Optional[Tensor], update_num: int):
        """λ L_ce(T; G or B) + (1 − λ) L_ce(T; T_max) for the active sub-Transformer T.

        Args:
            teacher: the widest model's ``(N, V)`` probabilities from ``widest_loss``.

        Returns:
            loss (scalar), logging output of this sub-Transformer's terms (summed by the task).
        """
        weight = self.mixing_weight(update_num)
        loss, nll_loss, distill, _ = self._terms(model, sample, teacher)
        log = {"sub_loss": loss.data, "sub_nll_loss": nll_loss.data}
        if distill is not None:
            log["distill_loss"] = distill.data
            loss = weight * loss + (1 - weight) * distill
        log["loss"] = loss.data
        return loss, log

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in TERMS:
            if any(key in log for log in logging_outputs):
                total = sum(log.get(key, 0) for log in logging_outputs)
                metrics.log_scalar(key, total / sample_size / math.log(2), sample_size, round=3)
        batches = sum(log.get("distill_batches", 0) for log in logging_outputs)
        if batches:
            weight = sum(log.get("distill_lambda", 0) for log in logging_outputs) / batches
            metrics.log_scalar("distill_lambda", weight, batches, round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
