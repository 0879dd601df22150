"""Multi-path sub-layers (Lin et al. 2022, "Multi-Path Transformer is Better", Sec. 3, Eqs. 4-7).

A multi-path sub-layer runs n independent copies ("paths") of an attention or FFN block on one
shared ``LN(X)`` and fuses them:

    Y = β X + Σ_{i=1..n} α_i PathNorm_i(f_i) [+ Σ_{j=1..n} α'_j PathNorm'_j(AVG_{-j})]   (Eq. 4, 7)
    f_i = Func_i(LN(X)),  Func = MHA or FFN                                               (Eq. 5, 6)

The paths are batched, never looped over: the n attentions run as one attention with n·H heads
and one fused projection; the n FFNs as one wide first projection and one batched second one.
"""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from .attention_utils import (
    append_to_cache,
    attention_mask,
    dot_product_attention,
    head_weights,
    reorder_cache,
    static_cache,
)
from .batched_linear import BatchedLinear
from .path_norm import FeatureGroups, PathNorm, weighted_feature_sum

PATH_WEIGHTS = ("learnable", "fixed_inverse", "fixed_inverse_sqrt")
ALPHA_INIT = ("sqrt_features", "sqrt_2n")


def _xavier_blocks_(weight: Tensor, block: int, gain: float):
    """Xavier-init each ``(block, in)`` row block of a fused projection as its own matrix."""
    for w in weight.split(block, dim=0):
        nn.init.xavier_uniform_(w, gain=gain)


@with_incremental_state
class MultiPathAttention(nn.Module):
    """n multi-head attention paths (Eq. 1-2, each a full fairseq-style MHA with its own
    Q/K/V/O projections) computed as one scaled-dot-product attention with n·H heads.

    Args:
        num_paths (int): n.
        embed_dim (int): C = d; each path has ``num_heads`` heads of size C / H.
        num_heads (int): H per path.
        kdim (int, optional): key/value input size (encoder-decoder attention); default C.
        dropout (float): attention-probability dropout.
        self_attention (bool): Q, K, V from the same input (one fused ``C -> 3nC`` projection);
            otherwise encoder-decoder attention (``C -> nC`` queries, ``kdim -> 2nC`` keys/values).

    Raises:
        ValueError: if ``embed_dim`` is not divisible by ``num_heads``.
    """

    def __init__(self, num_paths: int, embed_dim: int, num_heads: int, kdim: Optional[int] = None,
                 dropout: float = 0.0, self_attention: bool = True):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"attention heads ({num_heads}) must divide the embedding dim ({embed_dim})")
        self.num_paths, self.embed_dim, self.num_heads = num_paths, embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.self_attention = self_attention
        self.causal_kernel = False  # see attention_utils
        width = num_paths * embed_dim
        gain = 1 / math.sqrt(2)  # fairseq's init for same-dim Q/K/V projections
        if self_attention:
            self.in_proj = nn.Linear(embed_dim, 3 * width)
            _xavier_blocks_(self.in_proj.weight, embed_dim, gain)
        else:
            self.q_proj = nn.Linear(embed_dim, width)
            self.kv_proj = nn.Linear(kdim or embed_dim, 2 * width)
            gain = gain if kdim in (None, embed_dim) else 1.0  # fairseq: 1/√2 only when Q, K, V widths agree
            _xavier_blocks_(self.q_proj.weight, embed_dim, gain)
            _xavier_blocks_(self.kv_proj.weight, embed_dim, gain)
        self.out_proj = BatchedLinear(num_paths, embed_dim, embed_dim, xavier_gain=1.0)

    def _heads(self, x):
        # (L, B, n·C) -> (B, n·H, L, C/H); heads are path-major so path i owns heads i·H..(i+1)·H-1
        L, B, _ = x.shape
        return x.view(L, B, -1, self.head_dim).permute(1, 2, 0, 3)

    def _project_kv(self, key):
        k, v = self.kv_proj(key).chunk(2, dim=-1)
        return {"prev_key": self._heads(k), "prev_value": self._heads(v)}

    def forward(self, query: Tensor, key: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            query: ``(T, B, C)`` (already layer-normalised).
            key: ``(S, B, kdim)`` encoder output for encoder-decoder attention; ignored for
                self-attention.
            key_padding_mask: ``(B, S)``, True at padding keys.
            attn_mask: ``(T, S)`` additive float mask (fairseq's causal mask, -inf above the diagonal).
            incremental_state: fairseq's decoding cache; self-attention appends this step's keys and
                values, encoder-decoder attention projects the encoder output once.
            need_head_weights: also return the attention probabilities (alignments).
        Returns:
            ``(n, T, B, C)``: every path's output (Func_i(LN(X)) of Eq. 6); and with
            ``need_head_weights`` the probabilities of head h averaged over the n paths,
            ``(H, B, T, S)`` (else None).
        """
        T, B, C = query.shape
        if self.self_attention:
            q, k, v = (self._heads(t) for t in self.in_proj(query).chunk(3, dim=-1))
            kv = append_to_cache(self, incremental_state, {"prev_key": k, "prev_value": v})
            if incremental_state is not None:
                # One decoding step attends to every cached key: no causal mask; decoding prefixes
                # hold no padding.
                attn_mask, key_padding_mask = None, None
        else:
            q = self._heads(self.q_proj(query))
            kv = static_cache(self, incremental_state, lambda: self._project_kv(key))
        k, v = kv["prev_key"], kv["prev_value"]
        mask, is_causal = attention_mask(self, key_padding_mask, attn_mask, q.dtype)
        out, probs = dot_product_attention(q, k, v, mask, self.dropout if self.training else 0.0, need_head_weights,
                                           is_causal)
        # (B, n·H, T, C/H) -> (n, T·B, C)
        out = out.view(B, self.num_paths, self.num_heads, T, self.head_dim).permute(1, 3, 0, 2, 4)
        out = self.out_proj(out.reshape(self.num_paths, T * B, C))
        return out.view(self.num_paths, T, B, C), head_weights(probs, self.num_paths)

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        """Reorder the cached keys/values along the batch axis (beam search)."""
        return reorder_cache(self, incremental_state, new_order, static=not self.self_attention)


class MultiPathFFN(nn.Module):
    """n position-wise FFN paths (Eq. 3), ``C -> ffn_dim -> C`` each, batched: the n first
    projections form one ``C -> n·ffn_dim`` linear, the n second projections one ``baddbmm``.

    Shapes: input ``(T, B, C)``; output ``(n, T, B, C)``.
    """

    def __init__(self, num_paths: int, embed_dim: int, ffn_dim: int, activation_fn: str = "relu",
                 activation_dropout: float = 0.0):
        super().__init__()
        self.num_paths, self.ffn_dim = num_paths, ffn_dim
        self.fc1 = nn.Linear(embed_dim, num_paths * ffn_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)
        self.fc2 = BatchedLinear(num_paths, ffn_dim, embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        T, B, C = x.shape
        h = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        # (T, B, n·ffn) -> (n, T·B, ffn)
        h = h.view(T * B, self.num_paths, self.ffn_dim).transpose(0, 1)
        return self.fc2(h).view(self.num_paths, T, B, C)


class PathFusion(nn.Module):
    """Fuses n path outputs with the residual: Eq. 4 with PathNorm (Eq. 5) and the n
    leave-one-out averages of Eq. 7 ("more features", only when n >= 3: for n = 2 they would copy
    the paths, Sec. 3.2).

    Args:
        num_paths (int): n.
        embed_dim (int): C.
        path_norm (bool): PathNorm on every feature (Table 4 "+ PathNorm").
        path_weights (str): ``learnable`` α and β (Sec. 3.3); ``fixed_inverse`` α = 1/F, β = 1
            (the "Multi-Path" baseline); ``fixed_inverse_sqrt`` α = 1/√F, β = 1 (Table 4).
            F is the number of fused features: n, or 2n with more features.
        alpha_init (str): learnable α's initial value: ``sqrt_features`` 1/√F (our reading of
            Sec. 3.3's variance argument), or ``sqrt_2n`` the literal 1/√(2n).
        more_features (bool): add the leave-one-out averages AVG_{-j} = (Σ_i f_i − f_j)/(n − 1).
        dropout (float): residual dropout, applied once to the fused sum (summary Sec. 5 item 4).

    Raises:
        ValueError: on an unknown ``path_weights`` / ``alpha_init`` or ``num_paths < 1``.
    """

    def __init__(self, num_paths: int, embed_dim: int, path_norm: bool = True, path_weights: str = "learnable",
                 alpha_init: str = "sqrt_features", more_features: bool = True, dropout: float = 0.0):
        super().__init__()
        if path_weights not in PATH_WEIGHTS:
            raise ValueError(f"path_weights must be one of {PATH_WEIGHTS}, got {path_weights!r}")
        if alpha_init not in ALPHA_INIT:
            raise ValueError(f"alpha_init must be one of {ALPHA_INIT}, got {alpha_init!r}")
        self.num_paths = num_paths
        self.more_features = more_features and num_paths >= 3
        self.num_features = 2 * num_paths if self.more_features else num_paths
        self.path_norm = PathNorm(self.num_features, embed_dim) if path_norm else None
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        alpha = {
            "learnable": 1 / math.sqrt(self.num_features if alpha_init == "sqrt_features" else 2 * num_paths),
            "fixed_inverse": 1 / self.num_features,
            "fixed_inverse_sqrt": 1 / math.sqrt(self.num_features),
        }[path_weights]
        alpha, beta = torch.full((self.num_features,), alpha), torch.ones(())
        if path_weights == "learnable":
            self.alpha, self.beta = nn.Parameter(alpha), nn.Parameter(beta)
        else:
            self.register_buffer("alpha", alpha)
            self.register_buffer("beta", beta)

    def feature_groups(self, paths: Tensor) -> FeatureGroups:
        """``(n, T, B, C)`` raw path outputs -> the F features to normalise and weight, as groups."""
        groups = [(paths, 1.0)]
        if self.more_features:
            # AVG_{-j} = (Σ_i f_i − f_j) / (n − 1) (Eq. 7): one sum, n subtractions, division deferred
            groups.append((paths.sum(0, keepdim=True) - paths, float(self.num_paths - 1)))
        return groups

    def forward(self, residual: Tensor, paths: Tensor) -> Tensor:
        """residual X ``(T, B, C)``, paths ``(n, T, B, C)`` -> Y ``(T, B, C)`` (Eq. 4)."""
        groups = self.feature_groups(paths)
        if self.path_norm is not None:
            fused = self.path_norm(groups, self.alpha)
        else:
            fused = weighted_feature_sum(groups, self.alpha[:, None])
        return self.beta.to(residual.dtype) * residual + self.dropout_module(fused)


class MultiPathSublayer(nn.Module):
    """A whole pre-norm multi-path sub-layer: Y = β X + Σ α PathNorm(Func(LN(X))) (Eqs. 4-7).

    One LN shared by all paths: the paper splits the paths after the layer normalisation
    (summary Sec. 5 item 2).

    Args:
        paths (nn.Module): a batched multi-path Func (``MultiPathAttention`` or
            ``MultiPathFFN``) mapping ``(T, B, C)`` (+ its own keyword arguments) to ``(n, T, B, C)``.
        fusion (PathFusion): the fusion of Eq. 4/7.
    """

    def __init__(self, embed_dim: int, paths: nn.Module, fusion: PathFusion):
        super().__init__()
        self.layer_norm = LayerNorm(embed_dim)
        self.paths = paths
        self.fusion = fusion

    def forward(self, x: Tensor, **path_kwargs) -> Tensor:
        """x ``(T, B, C)`` -> ``(T, B, C)``; ``path_kwargs`` go to the paths (masks, keys, cache)."""
        return self.fusion(x, self.paths(self.layer_norm(x), **path_kwargs))


class MultiPathAttentionSublayer(MultiPathSublayer):
    """``MultiPathSublayer`` over ``MultiPathAttention`` paths, which also return their
    attention weights: ``forward(x, **attention_kwargs)`` -> ``((T, B, C), weights (H, B, T, S) or
    None)``, the weights with ``need_head_weights=True`` (alignments)."""

    def forward(self, x: Tensor, **attention_kwargs) -> Tuple[Tensor, Optional[Tensor]]:
        paths, weights = self.paths(self.layer_norm(x), **attention_kwargs)
        return self.fusion(x, paths), weights
