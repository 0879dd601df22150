"""Label-smoothed cross-entropy with the latent-depth losses (Li et al. 2020, Eqs. 4 and 8):

    L_LL = CE + β(t) · Σ_l KL(q(z_l) ‖ p(z_l)) + λ · (Σ_l u_l − K)²

per latent stack, read from the model's ``extra`` (``latent_probs_*``, ``latent_samples_*``,
``latent_num_updates``, and ``latent_pair`` when multilingual). The KL is analytic between
Bernoulli posteriors q(z_l = 1) = σ(α_l) and a Bernoulli prior: uniform (mean 0.5), a Beta(a, b)
prior read as a Bernoulli of mean a/(a+b) (the KL to a Beta itself is undefined; paper summary
Sec. 5 item 4), or, multilingual, the aggregated posterior q̃ = (1/N) Σ_n q^(n) of Eq. 7
(detached, as the reference code does). Each pair's KL is weighted by its share of the batch's
sentences, so a batch of one pair gives that pair's KL, as in the paper. u_l = (1/N) Σ_n z_l^(n)
(Sec. 3, target depth). β ramps linearly from 0 over ``--latent-kl-anneal-updates`` (KL annealing
against posterior collapse, Sec. 3); the target-depth loss starts once the ramp is over.
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from .auxiliary_loss import AuxiliaryLossCriterion

PRIORS = ("uniform", "beta", "aggregated")
UTILIZATION = ("samples", "probs")
STACKS = ("encoder", "decoder")


@dataclass
class LatentDepthCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    latent_kl_weight: float = field(default=1.0, metadata={"help": "β of Eq. 8 after annealing (Table 6: 0, 1, 10)"})
    latent_kl_anneal_updates: int = field(
        default=0, metadata={"help": "β ramps linearly from 0 over this many updates; 0 = no annealing"}
    )
    latent_prior: ChoiceEnum(PRIORS) = field(default="uniform", metadata={"help": "prior p(z_l) of the KL (Eq. 4); aggregated: Eq. 7, multilingual"})
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


def bernoulli_kl(q: Tensor, prior) -> Tensor:
    """KL(Bernoulli(q) ‖ Bernoulli(prior)) element-wise (prior a float or a tensor broadcasting
    with q), both clamped away from 0 and 1."""
    q, p = q.clamp(1e-6, 1 - 1e-6), torch.as_tensor(prior, dtype=q.dtype).clamp(1e-6, 1 - 1e-6)
    return q * (q.log() - p.log()) + (1 - q) * ((1 - q).log() - (1 - p).log())


def pair_shares(pair, num_pairs: int, like: Tensor) -> Tensor:
    """Share of the batch's sentences of each language pair ``(P,)``; uniform without ``pair``."""
    if pair is None:
        return like.new_full((num_pairs,), 1.0 / num_pairs)
    return torch.bincount(pair, minlength=num_pairs).to(like.dtype) / pair.numel()


@register_criterion("latent_depth_label_smoothed_cross_entropy", dataclass=LatentDepthCriterionConfig)
class LatentDepthCriterion(AuxiliaryLossCriterion):
    """Label-smoothed CE + β(t)·KL + λ·L_K (Eq. 8). Logged besides the CE: ``latent_kl``,
    ``latent_depth_loss``, and ``latent_depth_<stack>`` = Σ_l u_l, the effective depth.

    Raises:
        ValueError: at construction on a malformed ``--latent-prior-beta`` or negative K; at the
            first batch if K exceeds a latent stack's depth, the model has no latent layers, or the
            aggregated prior meets a model with one posterior.
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
        self.prior, self.prior_mean = latent_prior, a / (a + b) if latent_prior == "beta" else 0.5
        self.kl_weight, self.kl_anneal_updates = latent_kl_weight, latent_kl_anneal_updates
        self.target_layers, self.depth_weight = latent_target_layers, latent_depth_weight
        self.utilization = latent_utilization

    def annealing(self, num_updates: float) -> float:
        """Fraction of β reached after ``num_updates`` updates."""
        if self.kl_anneal_updates <= 0:
            return 1.0
        return min(num_updates / self.kl_anneal_updates, 1.0)

    def prior_for(self, probs: Tensor):
        """p(z_l = 1): a constant, or the aggregated posterior ``(1, L)`` of the P posteriors (Eq. 7)."""
        if self.prior != "aggregated":
            return self.prior_mean
        if len(probs) < 2:
            raise ValueError("--latent-prior aggregated needs a multilingual model (one posterior per language "
                             "pair); with one posterior the KL to it is 0: use uniform or beta")
        return probs.mean(0, keepdim=True).detach()

    def auxiliary(self, extra, ce_loss):
        stacks = [s for s in STACKS if f"latent_probs_{s}" in extra]
        if not stacks:
            raise ValueError("latent_depth_label_smoothed_cross_entropy needs a model with latent layers "
                             "(extra has no latent_probs_encoder/latent_probs_decoder)")
        progress = self.annealing(float(extra["latent_num_updates"][0]))
        kl, depth_loss, stats = ce_loss.new_zeros(()), ce_loss.new_zeros(()), {}
        pair = extra["latent_pair"][0] if "latent_pair" in extra else None
        for stack in stacks:
            probs = extra[f"latent_probs_{stack}"][0].float()  # (P, L)
            kl = kl + (pair_shares(pair, len(probs), probs) @ bernoulli_kl(probs, self.prior_for(probs))).sum()
            used = extra[f"latent_samples_{stack}"][0] if self.utilization == "samples" else probs
            depth = used.float().mean(0).sum()  # Σ_l u_l, u_l averaged over the pairs
            stats[f"latent_depth_{stack}"] = depth
            if self.target_layers:
                if self.target_layers > probs.size(1):
                    raise ValueError(f"--latent-target-layers {self.target_layers} exceeds the {probs.size(1)} "
                                     f"latent layers of the {stack}")
                depth_loss = depth_loss + (depth - self.target_layers) ** 2
        stats.update(latent_kl=kl, latent_depth_loss=depth_loss)
        depth_on = float(progress >= 1.0 and self.target_layers > 0)
        return self.kl_weight * progress * kl + self.depth_weight * depth_on * depth_loss, stats
