"""Label-smoothed cross-entropy with the latent-depth losses (Li et al. 2020, Eqs. 4 and 8), per
latent stack, read from the model's ``extra`` (``latent_probs_*``, ``latent_samples_*``,
``latent_num_updates``, ``latent_soft_updates``, and ``latent_pair`` when multilingual).

``--latent-objective released`` (the default) is the objective of the authors' released code
(fairseq's ``examples/latent_depth``, ``loss/latent_depth.py`` and its task's ``train_step``), term
for term (s = ``--latent-soft-updates``, the model's; a = ``--latent-kl-anneal-updates``; u =
updates; L latent layers):

    KL_n = (1/L) Σ_l z_l^(n) (log(z_l^(n) + ε) − log(p_l + ε))      on the samples z of pair n,
        p = 0.5 (uniform) or, aggregated, p_l = Σ_n z_l^(n) / Σ_l' Σ_n z_l'^(n) (detached;
        normalised over the layers, not over the pairs), weighted by β·min(1, (u − s)/a)
        (negative before update s) and by the pair's share of the batch's target tokens;
    L_K = (Σ_l u_l − K)² and the layer-sharing entropy −Σ_l v_l·log v_l (v = u_l, the log
        detached, as the released code computes it with ``math.log``), both from update s + a on
        and only with a target K, each weighted by λ·r(u), r = λ·(u − s − a)/a during the next a
        updates, then 1.

Its defaults are the released example's README (β = ``--sparsity-weight`` 0.1, λ =
``--share-weight`` 0.1, the uniform prior); a and K are the arch preset's, for its budget and depth
(``fairseq_widearch.models.latent_depth_transformer.training_schedule``).

``--latent-objective ours`` is Eq. 8 as printed, our reading of it:

    L_LL = CE + β(t) · Σ_l KL(q(z_l) ‖ p(z_l)) + λ · (Σ_l u_l − K)²

with the KL analytic between Bernoulli posteriors q(z_l = 1) = σ(α_l) and a Bernoulli prior:
uniform (mean 0.5), a Beta(a, b) prior read as a Bernoulli of mean a/(a+b) (the KL to a Beta
itself is undefined; paper summary Sec. 5 item 4), or, multilingual, the aggregated posterior
q̃ = (1/N) Σ_n q^(n) of Eq. 7 (detached). Each pair's KL is weighted by its share of the batch's
sentences, so a batch of one pair gives that pair's KL. u_l = (1/N) Σ_n z_l^(n) (Sec. 3, target
depth). β ramps linearly from 0 over a updates (KL annealing against posterior collapse, Sec. 3);
L_K starts once the ramp is over. Its defaults (β = 1, a = 0, K = 0, and relaxed samples
throughout from the preset) are this plugin's defaults before the released objective became one.

What stays different from the released code (docs/latent_depth_transformer.md, "Fidelity"): the
aggregated prior is built from the samples of this forward pass (the released code takes one batch
per pair in turn, and its prior for a pair reads the previous update's samples of the pairs after it
in the loop: an artefact of that loop, which one batch of all pairs does not have); when every
sample of a stack is 0, that prior's normalisation is 0/0 (the released code's loss is NaN), and
ours takes the uniform distribution over the layers instead.
"""
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from ..fairseq_fixes import left_out
from ..validation import refuse
from .auxiliary_loss import AuxiliaryLossCriterion

PRIORS = ("uniform", "beta", "aggregated")
UTILIZATION = ("samples", "probs")
OBJECTIVES = ("released", "ours")
#: What each objective trains with where a flag is left unset: the released example's README
#: (``--sparsity-weight 0.1``; a and K come from the arch preset, for its budget and depth), and
#: Eq. 8 as printed with relaxed samples throughout (``latent_soft_updates`` is the model's flag).
OBJECTIVE_DEFAULTS = {
    "released": dict(latent_kl_weight=0.1),
    "ours": dict(latent_kl_weight=1.0, latent_kl_anneal_updates=0, latent_target_layers=0, latent_soft_updates=-1),
}


def objective_of(args) -> str:
    """The objective a config trains under: ``ours`` where it says so, else ``released`` (the
    default; configs stored before this name call it ``anchor``)."""
    return "ours" if getattr(args, "latent_objective", "released") == "ours" else "released"


#: ε of the released code's KL on samples.
RELEASED_EPS = 1e-7
STACKS = ("encoder", "decoder")


@dataclass
class LatentDepthCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    latent_objective: ChoiceEnum(OBJECTIVES) = field(
        default="released", metadata={"help": "released: the authors' released code's objective term for term (KL "
                                              "on the samples averaged over layers, weighted by β·min(1, (u − s)/a) "
                                              "and the pairs' tokens; L_K and a layer-sharing entropy from update "
                                              "s + a, ramped; s = --latent-soft-updates, a = "
                                              "--latent-kl-anneal-updates); ours: Eq. 8 as printed (analytic KL on "
                                              "q, β ramped from 0, L_K after the ramp)"}
    )
    latent_kl_weight: Optional[float] = field(
        default=None, metadata={"help": "β of Eq. 8 after annealing (Table 6: 0, 1, 10); unset: 0.1 under released "
                                        "(its --sparsity-weight, on the KL averaged over layers), 1 under ours "
                                        "(on the KL summed over layers)"}
    )
    latent_kl_anneal_updates: Optional[int] = field(
        default=None, metadata={"help": "a: β ramps linearly over this many updates (released: from update s); "
                                        "unset: the arch preset's (the released example's 5,000 at its 24-layer "
                                        "budget), 0 under ours (no annealing)"}
    )
    latent_prior: ChoiceEnum(PRIORS) = field(
        default="uniform", metadata={"help": "prior p(z_l) of the KL (Eq. 4); aggregated: Eq. 7, multilingual"})
    latent_prior_beta: str = field(
        default="1,1", metadata={"help": "a,b of the Beta(a, b) prior, read as a Bernoulli of mean a/(a+b)"}
    )
    latent_target_layers: Optional[int] = field(
        default=None, metadata={"help": "K, target depth of each latent stack (Eq. 8's L_K); 0 = no target; unset: "
                                        "the arch preset's (half its latent depth, the released example's 12 of "
                                        "24), 0 under ours"}
    )
    latent_depth_weight: float = field(
        default=0.1, metadata={"help": "λ of L_K (not given in the paper; the released example's --share-weight)"}
    )
    latent_utilization: ChoiceEnum(UTILIZATION) = field(
        default="samples", metadata={"help": "u_l estimated from the samples z_l (the paper) or from q(z_l = 1); ours only"}
    )


def bernoulli_kl(q: Tensor, prior) -> Tensor:
    """KL(Bernoulli(q) ‖ Bernoulli(prior)) element-wise (prior a float or a tensor broadcasting
    with q), both clamped away from 0 and 1."""
    q, p = q.clamp(1e-6, 1 - 1e-6), torch.as_tensor(prior, dtype=q.dtype).clamp(1e-6, 1 - 1e-6)
    return q * (q.log() - p.log()) + (1 - q) * ((1 - q).log() - (1 - p).log())


def released_kl(samples: Tensor, prior: str) -> Tensor:
    """The released code's KL term of every pair ``(P,)`` for samples z ``(P, L)``: Σ_l z_l (log(z_l
    + ε) − log(p_l + ε)) / L with p = 0.5 (``uniform``) or the pairs' summed samples normalised
    over the layers (``aggregated``, detached). An all-zero sum (every layer dropped for every pair,
    where the released code divides 0 by 0) normalises to the uniform distribution 1/L instead."""
    if prior == "aggregated":
        summed = samples.detach().sum(0)
        total = summed.sum()
        normed = torch.where(total > 0, summed / total.clamp_min(RELEASED_EPS), 1.0 / samples.size(-1))
        log_prior = (normed + RELEASED_EPS).log()
    else:
        log_prior = torch.log(torch.tensor(0.5))
    return (samples * ((samples + RELEASED_EPS).log() - log_prior)).sum(-1) / samples.size(-1)


def released_weights(num_updates: float, soft_updates: float, anneal_updates: int, kl_weight: float,
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


def pair_shares(pair, num_pairs: int, like: Tensor, weights: Optional[Tensor] = None) -> Tensor:
    """Share of the batch of each language pair ``(P,)``: of its sentences, or of ``weights`` ``(B,)``
    (e.g. each sentence's target tokens) summed per pair; uniform without ``pair``."""
    if pair is None:
        return like.new_full((num_pairs,), 1.0 / num_pairs)
    weights = torch.ones_like(pair, dtype=like.dtype) if weights is None else weights.to(like.dtype)
    per_pair = like.new_zeros(num_pairs).index_add_(0, pair, weights)
    return per_pair / per_pair.sum()


@register_criterion("latent_depth_label_smoothed_cross_entropy", dataclass=LatentDepthCriterionConfig)
class LatentDepthCriterion(AuxiliaryLossCriterion):
    """Label-smoothed CE + the latent-depth losses (module docstring): the released code's
    (``--latent-objective released``, the default) or Eq. 8 as printed (``ours``). Logged besides
    the CE: ``latent_kl``, ``latent_depth_loss``, and ``latent_depth_<stack>`` = Σ_l u_l, the
    effective depth.

    Raises:
        ValueError: at construction on a malformed ``--latent-prior-beta``, a negative K, a Beta prior
            a non-positive or unset a, an unset K or ``--latent-utilization probs`` under the released
            objective (every preset sets a and K); at
            the first batch if K exceeds a
            latent stack's depth, the model has no latent layers, or the aggregated prior meets a model
            with one posterior.
    """

    STATS = ("latent_kl", "latent_depth_loss", "latent_depth_encoder", "latent_depth_decoder")

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 latent_objective="released", latent_kl_weight=None, latent_kl_anneal_updates=None,
                 latent_prior="uniform", latent_prior_beta="1,1", latent_target_layers=None, latent_depth_weight=0.1,
                 latent_utilization="samples"):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if latent_objective not in OBJECTIVES:
            refuse(f"--latent-objective must be one of {OBJECTIVES}, got {latent_objective!r}")
        unset = {**dict(latent_kl_anneal_updates=0, latent_target_layers=0), **OBJECTIVE_DEFAULTS[latent_objective]}
        latent_kl_weight = unset["latent_kl_weight"] if latent_kl_weight is None else latent_kl_weight
        if latent_target_layers is None and latent_objective == "released":
            refuse(f"--latent-objective released needs --latent-target-layers K (0: none; every "
                             f"latent_depth_transformer preset sets half its latent layers"
                             f"{left_out('presets_reach_the_criterion', 'under fairseq-hydra-train')})")
        latent_target_layers = unset["latent_target_layers"] if latent_target_layers is None else latent_target_layers
        if latent_kl_anneal_updates is None:
            latent_kl_anneal_updates = unset["latent_kl_anneal_updates"]
        try:
            a, b = (float(v) for v in latent_prior_beta.split(","))
            assert a > 0 and b > 0
        except (ValueError, AssertionError):
            refuse(f"--latent-prior-beta must be 'a,b' with a, b > 0, got {latent_prior_beta!r}")
        if latent_target_layers < 0:
            refuse(f"--latent-target-layers must be >= 0, got {latent_target_layers}")
        if latent_objective == "released" and latent_prior == "beta":
            refuse("--latent-objective released has the released code's priors only: --latent-prior "
                             "uniform or aggregated")
        if latent_objective == "released" and latent_utilization != "samples":
            refuse("--latent-objective released estimates u_l from the samples, as the released code "
                             "does: --latent-utilization probs is Eq. 8's option (--latent-objective ours)")
        if latent_objective == "released" and latent_kl_anneal_updates <= 0:
            refuse(f"--latent-objective released needs --latent-kl-anneal-updates > 0 (the released code's "
                             f"--anneal-updates; every latent_depth_transformer preset sets it for its budget"
                             f"{left_out('presets_reach_the_criterion', 'under fairseq-hydra-train')}), "
                             f"got {latent_kl_anneal_updates}")
        self.prior, self.prior_mean = latent_prior, a / (a + b) if latent_prior == "beta" else 0.5
        self.kl_weight, self.kl_anneal_updates = latent_kl_weight, latent_kl_anneal_updates
        self.target_layers, self.depth_weight = latent_target_layers, latent_depth_weight
        self.utilization = latent_utilization
        self.objective = latent_objective

    def annealing(self, num_updates: float) -> float:
        """Fraction of β reached after ``num_updates`` updates (``ours``)."""
        if self.kl_anneal_updates <= 0:
            return 1.0
        return min(num_updates / self.kl_anneal_updates, 1.0)

    def prior_for(self, probs: Tensor):
        """p(z_l = 1): a constant, or the aggregated posterior ``(1, L)`` of the P posteriors (Eq. 7)."""
        if self.prior != "aggregated":
            return self.prior_mean
        if len(probs) < 2:
            refuse("--latent-prior aggregated needs a multilingual model (one posterior per language "
                             "pair); with one posterior the KL to it is 0: use uniform or beta")
        return probs.mean(0, keepdim=True).detach()

    def stacks(self, extra):
        """The latent stacks in ``extra``. Raises ``ValueError`` if there are none, or K exceeds one's depth."""
        stacks = [s for s in STACKS if f"latent_probs_{s}" in extra]
        if not stacks:
            refuse("latent_depth_label_smoothed_cross_entropy needs a model with latent layers "
                             "(extra has no latent_probs_encoder/latent_probs_decoder)")
        for stack in stacks:
            if self.target_layers > extra[f"latent_probs_{stack}"][0].size(1):
                refuse(f"--latent-target-layers {self.target_layers} exceeds the "
                                 f"{extra[f'latent_probs_{stack}'][0].size(1)} latent layers of the {stack}")
        return stacks

    def auxiliary(self, extra, ce_loss, sample):
        if self.objective == "released":
            return self.released_auxiliary(extra, ce_loss, sample)
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

    def released_auxiliary(self, extra, ce_loss, sample):
        """``--latent-objective released``: the released code's KL, L_K and sharing entropy (module
        docstring), per stack, on the samples; each pair's KL weighted by its share of ``sample``'s
        sample size (its target tokens, or its sentences with ``--sentence-avg``), as the released
        code weights each pair's batch by its sample size."""
        kl_weight, depth_weight = released_weights(float(extra["latent_num_updates"][0]),
                                                   float(extra["latent_soft_updates"][0]), self.kl_anneal_updates,
                                                   self.kl_weight, self.depth_weight)
        kl, depth_loss, sharing = (ce_loss.new_zeros(()) for _ in range(3))
        stats = {}
        pair = extra["latent_pair"][0] if "latent_pair" in extra else None
        # each pair weighted by its part of the sample size, as the released task weights each pair's batch
        sizes = None if pair is None or self.sentence_avg else sample["target"].ne(self.padding_idx).sum(-1)  # (B,)
        for stack in self.stacks(extra):
            samples = extra[f"latent_samples_{stack}"][0].float()  # (P, L)
            kl = kl + pair_shares(pair, len(samples), samples, sizes) @ released_kl(samples, self.prior)
            utilization = samples.mean(0)
            stats[f"latent_depth_{stack}"] = utilization.sum()
            if self.target_layers:  # the released code adds neither term without a target depth
                sharing = sharing + sharing_entropy(utilization)
                depth_loss = depth_loss + (utilization.sum() - self.target_layers) ** 2
        stats.update(latent_kl=kl, latent_depth_loss=depth_loss)
        return kl_weight * kl + depth_weight * (depth_loss + sharing), stats
