"""PathNorm (Lin et al. 2022, "Multi-Path Transformer is Better", Sec. 3.1, Eq. 5)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class PathNorm(nn.Module):
    """One LayerNorm with its own affine parameters per fused feature, for F features at once.

    The paper defines PathNorm only as a normalisation with few parameters that brings every
    path output to mean 0 / variance 1 (Sec. 3.1); we read it as a LayerNorm with affine
    parameters (paper summary, Sec. 5 item 3). All F features are normalised in one
    ``F.layer_norm`` call over the channel axis.

    Args:
        num_features (int): F, the number of features normalised (paths, plus the leave-one-out
            averages of Eq. 7 when "more features" is on).
        embed_dim (int): C, the channel size.

    Shapes:
        input ``(F, T, B, C)``; output ``(F, T, B, C)``.
    """

    def __init__(self, num_features: int, embed_dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_features, embed_dim))
        self.bias = nn.Parameter(torch.zeros(num_features, embed_dim))

    def _normalize(self, x):
        return F.layer_norm(x, x.shape[-1:], eps=self.eps)

    def forward(self, x):
        """x: ``(F, T, B, C)`` -> PathNorm_f(x_f) for every f, ``(F, T, B, C)``."""
        return self._normalize(x) * self.weight[:, None, None] + self.bias[:, None, None]

    def weighted_sum(self, x, alpha):
        """Σ_f α_f · PathNorm_f(x_f) (the sum of Eq. 4) without materialising the F scaled copies.

        Folds α into the affine parameters: Σ_f (α_f γ_f) ⊙ norm(x_f) + Σ_f α_f b_f, one einsum.

        Args:
            x: ``(F, T, B, C)`` features; alpha: ``(F,)`` path weights.
        Returns:
            ``(T, B, C)``.
        """
        scale = alpha[:, None] * self.weight
        shift = (alpha[:, None] * self.bias).sum(0)
        return torch.einsum("ftbc,fc->tbc", self._normalize(x), scale.to(x.dtype)) + shift.to(x.dtype)
