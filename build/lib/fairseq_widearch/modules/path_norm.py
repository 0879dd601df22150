"""PathNorm (Lin et al. 2022, "Multi-Path Transformer is Better", Sec. 3.1, Eq. 5)."""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

#: Features as groups ``(x, d)``: ``x`` of shape ``(k, T, B, C)`` holds k features, each equal to
#: ``x[i] / d`` (d lets the leave-one-out averages of Eq. 7 skip their division).
FeatureGroups = Sequence[Tuple[Tensor, float]]


def weighted_feature_sum(groups: FeatureGroups, weights: Tensor, norm_eps: Optional[float] = None) -> Tensor:
    """Σ_f w_f ⊙ φ(x_f) over all features of ``groups``; φ is a LayerNorm without affine
    parameters when ``norm_eps`` is given, else the identity.

    Args:
        groups: see ``FeatureGroups`` (F features in all).
        weights: ``(F, C)`` or ``(F, 1)``.
    Returns:
        ``(T, B, C)``.
    """
    out, offset = 0, 0
    for x, divisor in groups:
        w = weights[offset:offset + x.shape[0]].to(x.dtype)[:, None, None]
        offset += x.shape[0]
        if norm_eps is None:
            w = w / divisor
        else:  # LayerNorm_eps(x / d) = LayerNorm_{eps·d²}(x)
            x = F.layer_norm(x, x.shape[-1:], eps=norm_eps * divisor * divisor)
        out = out + (x * w).sum(0)
    return out


class PathNorm(nn.Module):
    """One LayerNorm with its own affine parameters per fused feature, fused with the path
    weights: returns Σ_f α_f · PathNorm_f(x_f), the sum of Eq. 4 (and Eq. 7's features).

    The paper defines PathNorm only as a normalisation with few parameters that brings every
    path output to mean 0 / variance 1 (Sec. 3.1); we read it as a LayerNorm with affine
    parameters γ_f, b_f (paper summary, Sec. 5 item 3).

    α is folded into the affine parameters, Σ_f (α_f γ_f) ⊙ norm(x_f) + Σ_f α_f b_f, and each
    group is normalised in one ``F.layer_norm`` call (no concatenation of the groups).

    Args:
        num_features (int): F, the number of features (paths, plus Eq. 7's averages).
        embed_dim (int): C, the channel size.

    Shapes:
        ``forward(groups, alpha)``: groups of ``(k, T, B, C)`` tensors with Σk = F (see
        ``FeatureGroups``), alpha ``(F,)`` -> ``(T, B, C)``.
    """

    def __init__(self, num_features: int, embed_dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_features, embed_dim))
        self.bias = nn.Parameter(torch.zeros(num_features, embed_dim))

    def forward(self, groups: FeatureGroups, alpha: Tensor) -> Tensor:
        shift = (alpha[:, None] * self.bias).sum(0).to(groups[0][0].dtype)
        return weighted_feature_sum(groups, alpha[:, None] * self.weight, self.eps) + shift
