"""Label-smoothed cross-entropy with the latent-depth losses (Li et al. 2020, Eqs. 4 and 8):

    L_LL = CE + β(t) · Σ_l KL(q(z_l) ‖ p(z_l)) + λ · (Σ_l u_l − K)²

per latent stack, read from the model's ``extra`` (``latent_probs_*``, ``latent_samples_*``,
``latent_num_updates``). The KL is analytic between Bernoulli posteriors q(z_l = 1) = σ(α_l)
and a Bernoulli prior: uniform (mean 0.5), or a Beta(a, b) prior read as a Bernoulli of mean
a/(a+b) (the KL to a Beta itself is undefined; paper summary Sec. 5 item 4). β ramps linearly from
0 over ``--latent-kl-anneal-updates`` (KL annealing against posterior collapse, Sec. 3); the
target-depth loss starts once the ramp is over.
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from .auxiliary_loss import AuxiliaryLossCriterion

PRIORS = ("uniform", "beta")
UTILIZATION = ("samples", "probs")
STACKS = ("encoder", "decoder")


@dataclass
class LatentDepthCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    latent_kl_weight: float = field(default=1.0, metadata={"help": "β of Eq. 8 after annealing (Table 6: 0, 1, 10)"})
    latent_kl_anneal_updates: int = field(
        default=0, metadata={"help": "β ramps linearly from 0 over this many updates; 0 = no annealing"}
    )
    latent_prior: ChoiceEnum(PRIORS) = field(default="uniform", metadata={"help": "prior p(z_l) of the KL (Eq. 4)"})
    latent_prior_beta: str = field(
        default="1,1", metadata={"help": "a,b of the Beta(a, b) prior, read as a Bernoulli of mean a/(a+b)"}
    )
    latent_target_layers: int = field(
        default=0, metadata={"help": "K, target depth of each latent stack (Eq. 8's L_K); 0 = no target"}
    )
    latent_depth_weight: float = field(default=0.1, metadata={"help": "λ of L_K (not given in the paper)"})
    latent_utilization: ChoiceEnum(UTILIZATION) = field(
        default="samples", metadata={"help": "u_l estimated from the samples z_l (the paper) or from q(z_l = 1)"}
    )


def bernoulli_kl(q: Tensor, prior: float) -> Tensor:
    """KL(Bernoulli(q) ‖ Bernoulli(prior)) element-wise, q clamped away from 0 and 1."""
    q = q.clamp(1e-6, 1 - 1e-6)
    return q * (q.log() - torch.log(torch.tensor(prior))) + (1 - q) * ((1 - q).log() - torch.log(torch.tensor(1 - prior)))


@register_criterion("latent_depth_label_smoothed_cross_entropy", dataclass=LatentDepthCriterionConfig)
class LatentDepthCriterion(AuxiliaryLossCriterion):
    """Label-smoothed CE + β(t)·KL + λ·L_K (Eq. 8). Logged besides the CE: ``latent_kl``,
    ``latent_depth_loss``, and ``latent_depth_<stack>`` = Σ_l u_l, the effective depth.

    Raises:
        ValueError: at construction on a malformed ``--latent-prior-beta`` or negative K; at the
            first batch if K exceeds a latent stack's depth or the model has no latent layers.
    """

    STATS = ("latent_kl", "latent_depth_loss", "latent_depth_encoder", "latent_depth_decoder")

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 latent_kl_weight=1.0, latent_kl_anneal_updates=0, latent_prior="uniform", latent_prior_beta="1,1",
                 latent_target_layers=0, latent_depth_weight=0.1, latent_utilization="samples"):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        try:
            a, b = (float(v) for v in latent_prior_beta.split(","))
            assert a > 0 and b > 0
        except (ValueError, AssertionError):
            raise ValueError(f"--latent-prior-beta must be 'a,b' with a, b > 0, got {latent_prior_beta!r}")
        if latent_target_layers < 0:
            raise ValueError(f"--latent-target-layers must be >= 0, got {latent_target_layers}")
        self.prior_mean = a / (a + b) if latent_prior == "beta" else 0.5
        self.kl_weight, self.kl_anneal_updates = latent_kl_weight, latent_kl_anneal_updates
        self.target_layers, self.depth_weight = latent_target_layers, latent_depth_weight
        self.utilization = latent_utilization

    def annealing(self, num_updates: float) -> float:
        """Fraction of β reached after ``num_updates`` updates."""
        if self.kl_anneal_updates <= 0:
            return 1.0
        return min(num_updates / self.kl_anneal_updates, 1.0)

    def auxiliary(self, extra, ce_loss):
        stacks = [s for s in STACKS if f"latent_probs_{s}" in extra]
        if not stacks:
            raise ValueError("latent_depth_label_smoothed_cross_entropy needs a model with latent layers "
                             "(extra has no latent_probs_encoder/latent_probs_decoder)")
        progress = self.annealing(float(extra["latent_num_updates"][0]))
        kl, depth_loss, stats = ce_loss.new_zeros(()), ce_loss.new_zeros(()), {}
        for stack in stacks:
            probs = extra[f"latent_probs_{stack}"][0].float()
            kl = kl + bernoulli_kl(probs, self.prior_mean).sum()
            used = extra[f"latent_samples_{stack}"][0] if self.utilization == "samples" else probs
            depth = used.float().sum()
            stats[f"latent_depth_{stack}"] = depth
            if self.target_layers:
                if self.target_layers > probs.numel():
                    raise ValueError(f"--latent-target-layers {self.target_layers} exceeds the {probs.numel()} "
                                     f"latent layers of the {stack}")
                depth_loss = depth_loss + (depth - self.target_layers) ** 2
        stats.update(latent_kl=kl, latent_depth_loss=depth_loss)
        depth_on = float(progress >= 1.0 and self.target_layers > 0)
        return self.kl_weight * progress * kl + self.depth_weight * depth_on * depth_loss, stats
