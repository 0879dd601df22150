"""LayerSelect: latent layer selection with Gumbel-sigmoid samples (Li et al. 2020, "Deep
Transformers with Latent Depth", Sec. 3, Eqs. 2 and 5).

Layer l computes ``x_{l+1} = x_l + z_l · F_l(x_l)`` (Eq. 2) with one z_l per layer and language
pair (one posterior per pair, Sec. 2.2 / Eq. 7), shared by every sentence of that pair in the
batch; a batch mixing pairs draws one sample per pair and gives each sentence its pair's. The
posterior of z_l is a Bernoulli with logit α_l; training uses the two-class Gumbel-softmax of Eq. 5, which equals

    z_l = σ((α_l + g_1 − g_2) / τ),   g_1, g_2 ~ Gumbel(0, 1)

(one logit per layer: α_l = α_l(1) − α_l(0)). Inference: soft weights equal to the expectation
of the z that training draws at the current step, E[σ((α_l + g_1 − g_2)/τ)] (computed by
quadrature over g_1 − g_2 ~ Logistic(0, 1), not sampled; σ(α_l) once training draws
straight-through hard samples, whose mean it is); a sampled selection, one draw of what training
draws per sentence, held for all of its decoding steps (``LayerSelect.sentence_samples``); or
a hard selection σ(α_l) > threshold. σ(α_l)
alone is *not* the training expectation of the relaxed samples: at τ = 5, α = 2 gives E[z] = 0.596
against σ(α) = 0.881, so soft weights of σ(α) would scale residual branches by ~1.5x their
training scale.
"""
import logging
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch import Tensor

logger = logging.getLogger(__name__)

INFERENCE_MODES = ("soft", "sampled", "hard")

#: The paper prunes layers at inference "once q_φ is near-discrete" without a number; ours: every
#: q(z_l = 1) within this of 0 or 1.
NEAR_DISCRETE_MARGIN = 0.1

#: Quadrature points of E[f(L)], L ~ Logistic(0, 1): logit(u) at the midpoints u of 512 equal
#: probability intervals (the error of E[σ((α + L)/τ)] is below 1e-5 for τ >= 0.5).
LOGISTIC_NODES = torch.logit((torch.arange(512, dtype=torch.float64) + 0.5) / 512).float()


def expected_relaxed_sample(logits: Tensor, temperature: float) -> Tensor:
    """E[σ((α + g_1 − g_2)/τ)] for g_1, g_2 ~ Gumbel(0, 1), element-wise over ``logits`` α: the mean
    of Eq. 5's relaxed samples at temperature τ (g_1 − g_2 ~ Logistic(0, 1)). Same shape as α."""
    nodes = LOGISTIC_NODES.to(logits)
    return torch.sigmoid((logits.unsqueeze(-1) + nodes) / temperature).mean(-1)


def logistic_noise(rows: int, layers: int, device=None) -> Tensor:
    """g_1 − g_2 ``(rows, layers)``, fp32, g ~ Gumbel(0, 1) (Eq. 5's noise), from torch's default
    generator (seeded by fairseq's ``--seed``)."""
    # fp32 whatever the model's dtype: fp16 uniforms are 0 with probability 2^-11, and
    # clamp_min(1e-10) is 0 in fp16, so g_1 − g_2 would be −inf + inf = NaN once in 4M draws
    u1, u2 = (torch.rand(rows, layers, device=device) for _ in range(2))
    return -torch.log(-torch.log(u1.clamp_min(1e-10))) + torch.log(-torch.log(u2.clamp_min(1e-10)))


def undecided_warning(probs: Tensor, margin: float = NEAR_DISCRETE_MARGIN) -> Optional[str]:
    """The warning to give before hard selection on ``probs`` q(z = 1) ``(P, L)`` when some q lies
    farther than ``margin`` from both 0 and 1, else None; raises nothing. The paper prunes once q is
    near-discrete (Li et al. 2020, Sec. 3, with Eq. 5). Such a layer's keep-or-drop is decided by
    noise, not by the posterior: in the latent-depth claim (docs/claims.md) the 12 decoder
    probabilities were 0.48-0.65 after 4,356 updates, and hard selection cost 0.08 in validation
    loss against the soft weights."""
    rows = [[round(q, 3) for q in row] for row in probs.tolist()]
    undecided = sum(margin < q < 1 - margin for row in rows for q in row)
    if not undecided:
        return None
    return (f"hard latent layer selection on a posterior that is not near-discrete: {undecided} of "
            f"{probs.numel()} q(z = 1) lie in ({margin}, {1 - margin}): {rows}. Which of those layers are kept is "
            "close to chance, and the pruned model is not the one training saw; decode with the soft weights "
            "(--model-overrides \"{'latent_inference': 'soft'}\") or train longer (docs/claims.md, latent depth).")


class LayerSelect(nn.Module):
    """Per-layer selection weights z for ``num_layers`` layers and ``num_posteriors`` posteriors.

    Args:
        num_layers (int): L.
        num_posteriors (int): one posterior per language pair (1 for bilingual models).
        logit_init (float): initial α_l for every layer (0: q(z_l = 1) = 0.5, the uniform prior's mean).
        temperature (float): τ at update 0 (the reference fairseq example uses 5).
        min_temperature (float): τ after ``temperature_anneal_updates`` updates; τ decays
            exponentially in between (the paper gives no schedule).
        temperature_anneal_updates (int): 0 keeps τ constant.
        soft_updates (int): after this many updates, training samples are straight-through hard
            (z > 0.5 forward, the soft sample's gradient backward); negative: always soft (the paper).
        inference (str): ``soft`` (z = the mean of the samples training draws at the current
            update: ``expected_relaxed_sample`` at τ, or σ(α) once the samples are
            straight-through hard), ``sampled`` (per sentence, ``sentence_samples``) or
            ``hard`` (z = 1[σ(α) > threshold]; the first hard forward logs
            ``undecided_warning`` when the posterior is not near-discrete).
        threshold (float): for hard selection.

    Shapes:
        ``forward()`` -> z ``(P, L)`` for the P posteriors; ``probs()`` -> q(z = 1) ``(P, L)``;
        ``layer_weights(z, pair)`` -> the weight of each layer, ``(L,)`` without ``pair`` (P = 1),
        else ``(L, B, 1)`` for the sentences' pair indices ``(B,)`` (broadcasts over T x B x C).
        The number of updates comes from ``set_num_updates`` (fairseq calls it).

    Raises:
        ValueError: on non-positive sizes or temperatures, an unknown inference mode or a threshold
            outside (0, 1), naming the flag.
    """

    def __init__(self, num_layers: int, num_posteriors: int = 1, logit_init: float = 0.0, temperature: float = 5.0,
                 min_temperature: float = 5.0, temperature_anneal_updates: int = 0, soft_updates: int = -1,
                 inference: str = "soft", threshold: float = 0.5):
        super().__init__()
        if num_layers < 1 or num_posteriors < 1:
            raise ValueError(f"LayerSelect needs >= 1 layers and posteriors, got {num_layers} and {num_posteriors}")
        if temperature <= 0 or min_temperature <= 0:
            raise ValueError(f"temperature and min_temperature must be > 0, got {temperature} and {min_temperature}")
        if inference not in INFERENCE_MODES:
            raise ValueError(f"inference must be one of {INFERENCE_MODES}, got {inference!r}")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.logits = nn.Parameter(torch.full((num_posteriors, num_layers), float(logit_init)))
        self.temperature, self.min_temperature = temperature, min_temperature
        self.temperature_anneal_updates, self.soft_updates = temperature_anneal_updates, soft_updates
        self.inference, self.threshold = inference, threshold
        self.num_updates = 0
        self.checked_discrete = False  # hard selection checks the posterior once (a host sync)

    def set_num_updates(self, num_updates: int):
        """Advance the temperature and soft/hard schedules (called by fairseq every update)."""
        self.num_updates = num_updates

    def current_temperature(self) -> float:
        """τ: exponential decay from ``temperature`` to ``min_temperature`` over the anneal window."""
        if self.temperature_anneal_updates <= 0:
            return self.temperature
        progress = min(self.num_updates / self.temperature_anneal_updates, 1.0)
        return self.temperature * (self.min_temperature / self.temperature) ** progress

    def probs(self) -> Tensor:
        """q(z_l = 1) = σ(α_l) for every posterior and layer, ``(P, L)``, fp32 whatever the model's
        dtype (in fp16 σ(α) rounds to 1 from α ≈ 7.6, and the KL's log(1 − q) with it)."""
        return torch.sigmoid(self.logits.float())

    def outputs(self, stack: str, z: Tensor) -> Dict[str, List[Tensor]]:
        """The auxiliary outputs of one forward pass of ``stack`` (``encoder``/``decoder``):
        ``latent_probs_<stack>`` q(z = 1) ``(P, L)``, ``latent_samples_<stack>`` z ``(P, L)`` and
        ``latent_num_updates`` and ``latent_soft_updates`` (for the criterion's schedules)."""
        return {f"latent_probs_{stack}": [self.probs()], f"latent_samples_{stack}": [z],
                "latent_num_updates": [torch.tensor(float(self.num_updates))],
                "latent_soft_updates": [torch.tensor(float(self.soft_updates))]}

    @staticmethod
    def layer_weights(z: Tensor, pair: Optional[Tensor] = None) -> Tensor:
        """z ``(P, L)`` -> ``(L,)`` if ``pair`` is None (single posterior), else each sentence's
        pair's z, ``(L, B, 1)``, for the pair indices ``(B,)``."""
        if pair is None:
            return z[0]
        return z[pair].t().unsqueeze(-1)

    def hard_samples(self) -> bool:
        """Whether training draws straight-through hard samples at the current update."""
        return 0 <= self.soft_updates <= self.num_updates

    def warn_if_undecided(self, q: Tensor):
        """Log ``undecided_warning`` for ``q`` ``(P, L)``, on the first call only."""
        if not self.checked_discrete:
            self.checked_discrete = True
            message = undecided_warning(q)
            if message:
                logger.warning(message)

    def per_sentence(self) -> bool:
        """Whether z is drawn per sentence (``sampled`` inference) rather than per language pair."""
        return not self.training and self.inference == "sampled"

    def sample(self, logits: Tensor, noise: Tensor) -> Tensor:
        """Eq. 5's z = σ((α + g_1 − g_2)/τ) for fp32 ``logits`` and ``noise`` of one shape,
        straight-through hard (z > 0.5 forward, the relaxed gradient) after ``soft_updates``."""
        z = torch.sigmoid((logits + noise) / self.current_temperature())
        if self.hard_samples():
            z = (z > 0.5).to(z.dtype) - z.detach() + z
        return z

    def sentence_samples(self, noise: Tensor, pair: Optional[Tensor] = None) -> Tensor:
        """Sampled inference: z ``(B, L)`` for B sentences, each drawn as training draws z at the
        current update (relaxed or straight-through hard) from its pair's posterior (``pair``
        ``(B,)``, else the single one), with the sentence's ``noise`` ``(B, L)`` (``logistic_noise``,
        drawn once per sentence by the encoder and reordered with the beams, so that a sentence
        keeps its layers for all of its decoding steps)."""
        logits = self.logits.float()
        return self.sample(logits[pair] if pair is not None else logits.expand(len(noise), -1), noise)

    def forward(self) -> Tensor:
        """z ``(P, L)``, fp32: Gumbel-sigmoid samples in training (Eq. 5), deterministic at inference:
        soft, the mean of those samples (for hard samples, P(z = 1) = σ(α)); or hard selection.
        (Sampled inference draws per sentence: ``sentence_samples``.)"""
        logits = self.logits.float()
        if self.training:
            return self.sample(logits, logistic_noise(*logits.shape, device=logits.device))
        q = torch.sigmoid(logits)
        if self.inference == "hard":
            self.warn_if_undecided(q)
            return (q > self.threshold).to(q.dtype)
        return q if self.hard_samples() else expected_relaxed_sample(logits, self.current_temperature())
