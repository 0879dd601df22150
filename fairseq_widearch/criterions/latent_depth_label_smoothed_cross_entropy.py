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

``--latent-objective anchor`` replaces all of this with the objective of the authors' released code
(fairseq's ``examples/latent_depth``, ``loss/latent_depth.py``), term for term, so that a
head-to-head can train ours under either objective (s = ``--latent-soft-updates``, a =
``--latent-kl-anneal-updates``, u = updates):

    KL_n = (1/L) Σ_l z_l^(n) (log(z_l^(n) + ε) − log(p_l + ε))      on the samples z of pair n,
        p = 0.5 (uniform) or, aggregated, p_l = Σ_n z_l^(n) / Σ_l' Σ_n z_l'^(n) (detached;
        normalised over the layers, not over the pairs), weighted by β·min(1, (u − s)/a)
        (negative before update s);
    L_K and the layer-sharing entropy −Σ_l v_l·log v_l (v = u_l, the log detached, as the
        released code computes it with ``math.log``) from update s + a on, each weighted by
        λ·r(u), r = λ·(u − s − a)/a during the next a updates, then 1.

The released code takes one batch per language pair, where its per-pair KL weighted by the pair's
tokens is exactly ours weighted by the pair's share of the batch (tested against its loss modules);
on mixed batches each pair's KL is weighted by its share of the batch's sentences.
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
OBJECTIVES = ("ours", "anchor")
#: ε of the released code's KL on samples.
ANCHOR_EPS = 1e-7
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
    latent_objective: ChoiceEnum(OBJECTIVES) = field(
        default="ours", metadata={"help": "ours: Eq. 8 as printed (analytic KL on q, β ramped from 0, L_K after the "
                                          "ramp); anchor: the released code's objective term for term (KL on the "
                                          "samples averaged over layers, β·min(1, (u − s)/a), L_K and a "
                                          "layer-sharing entropy from update s + a, ramped; s = "
                                          "--latent-soft-updates, a = --latent-kl-anneal-updates)"}
    )


def bernoulli_kl(q: Tensor, prior) -> Tensor:
    """KL(Bernoulli(q) ‖ Bernoulli(prior)) element-wise (prior a float or a tensor broadcasting
    with q), both clamped away from 0 and 1."""
    q, p = q.clamp(1e-6, 1 - 1e-6), torch.as_tensor(prior, dtype=q.dtype).clamp(1e-6, 1 - 1e-6)
    return q * (q.log() - p.log()) + (1 - q) * ((1 - q).log() - (1 - p).log())


def anchor_kl(samples: Tensor, prior: str) -> Tensor:
    """The released code's KL term of every pair ``(P,)`` for samples z ``(P, L)``: Σ_l z_l (log(z_l
    + ε) − log(p_l + ε)) / L with p = 0.5 (``uniform``) or the pairs' summed samples normalised
    over the layers (``aggregated``, detached)."""
    if prior == "aggregated":
        summed = samples.detach().sum(0)
        log_prior = (summed / summed.sum() + ANCHOR_EPS).log()
    else:
        log_prior = torch.log(torch.tensor(0.5))
    return (samples * ((samples + ANCHOR_EPS).log() - log_prior)).sum(-1) / samples.size(-1)


def anchor_weights(num_updates: float, soft_updates: float, anneal_updates: int, kl_weight: float,
                   depth_weight: float):
    """(weight of the KL, weight of L_K and the sharing entropy) at ``num_updates`` as the released
    code schedules them (its ``LatentLayersKLLoss``/``LatentLayersSparsityLoss``)."""
    kl = min(kl_weight, (num_updates - soft_updates) * kl_weight / anneal_updates)
    start = soft_updates + anneal_updates
    if num_updates <= start:
        return kl, 0.0
    ramp = (num_updates - start) * depth_weight / anneal_updates if num_updates < start + anneal_updates else 1.0
    return kl, ramp * depth_weight


def sharing_entropy(utilization: Tensor) -> Tensor:
    """−Σ_l v_l·log v_l over the layers with v_l > 0, the log detached (``math.log`` in the released
    code), so its gradient on v_l is −log v_l."""
    used = utilization[utilization > 0]
    return -(used * used.detach().log()).sum()


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
                 latent_target_layers=0, latent_depth_weight=0.1, latent_utilization="samples",
                 latent_objective="ours"):
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
        if latent_objective == "anchor" and latent_prior == "beta":
            raise ValueError("--latent-objective anchor has the released code's priors only: --latent-prior uniform "
                             "or aggregated")
        if latent_objective == "anchor" and latent_kl_anneal_updates <= 0:
            raise ValueError("--latent-objective anchor needs --latent-kl-anneal-updates > 0 (the released code's "
                             "--anneal-updates)")
        self.objective = latent_objective

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

    def stacks(self, extra):
        """The latent stacks in ``extra``. Raises ``ValueError`` if there are none, or K exceeds one's depth."""
        stacks = [s for s in STACKS if f"latent_probs_{s}" in extra]
        if not stacks:
            raise ValueError("latent_depth_label_smoothed_cross_entropy needs a model with latent layers "
                             "(extra has no latent_probs_encoder/latent_probs_decoder)")
        for stack in stacks:
            if self.target_layers > extra[f"latent_probs_{stack}"][0].size(1):
                raise ValueError(f"--latent-target-layers {self.target_layers} exceeds the "
                                 f"{extra[f'latent_probs_{stack}'][0].size(1)} latent layers of the {stack}")
        return stacks

    def auxiliary(self, extra, ce_loss):
        if self.objective == "anchor":
            return self.anchor_auxiliary(extra, ce_loss)
        stacks = self.stacks(extra)
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
                depth_loss = depth_loss + (depth - self.target_layers) ** 2
        stats.update(latent_kl=kl, latent_depth_loss=depth_loss)
        depth_on = float(progress >= 1.0 and self.target_layers > 0)
        return self.kl_weight * progress * kl + self.depth_weight * depth_on * depth_loss, stats

    def anchor_auxiliary(self, extra, ce_loss):
        """``--latent-objective anchor``: the released code's KL, L_K and sharing entropy (module
        docstring), per stack, on the samples."""
        kl_weight, depth_weight = anchor_weights(float(extra["latent_num_updates"][0]),
                                                 float(extra["latent_soft_updates"][0]), self.kl_anneal_updates,
                                                 self.kl_weight, self.depth_weight)
        kl, depth_loss, sharing = (ce_loss.new_zeros(()) for _ in range(3))
        stats = {}
        pair = extra["latent_pair"][0] if "latent_pair" in extra else None
        for stack in self.stacks(extra):
            samples = extra[f"latent_samples_{stack}"][0].float()  # (P, L)
            kl = kl + pair_shares(pair, len(samples), samples) @ anchor_kl(samples, self.prior)
            utilization = samples.mean(0)
            stats[f"latent_depth_{stack}"] = utilization.sum()
            if self.target_layers:  # the released code adds neither term without a target depth
                sharing = sharing + sharing_entropy(utilization)
                depth_loss = depth_loss + (utilization.sum() - self.target_layers) ** 2
        stats.update(latent_kl=kl, latent_depth_loss=depth_loss)
        return kl_weight * kl + depth_weight * (depth_loss + sharing), stats
