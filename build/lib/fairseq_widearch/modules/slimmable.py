"""Slimmable layers of Scalable Transformers (Gao et al. 2021, "Scalable Transformers for Neural
Machine Translation", Sec. 3.2, the cropping rule between Eqs. 2 and 3).

Each layer holds the widest model's parameters; a sub-Transformer uses their top-left block:
``W^i = W_max^i[1:C, 1:D^i]``, ``b^i = b_max^i[1:D^i]``. Cropping slices the tensors, so the work
done shrinks with the width (no masks). The input width of every layer is read from its input;
the output width a layer produces is its *active* width, set by the model's sample config
(``set_active_width``).
"""
import math
from typing import Optional, Tuple

import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor

from .attention_utils import dot_product_attention, head_weights, keys_values_and_mask, reorder_cache

#: Attention head dimension of every width (Sec. 3.2: a layer of width D has D / 64 heads).
HEAD_DIM = 64


def _check_width(name: str, width: int, maximum: int, multiple: int = 1):
    if not 0 < width <= maximum or width % multiple:
        raise ValueError(f"{name} width must be in (0, {maximum}] and a multiple of {multiple}, got {width}")


class SlimmableLinear(nn.Linear):
    """``nn.Linear(in_max, out_max)`` whose sub-networks use ``weight[:out, :in]`` and
    ``bias[:out]``: ``in`` from the input's last dimension, ``out`` the active output width
    (default the widest). An output kept at full width keeps the full bias (Eq. 5's ``b'_o``).

    Shapes: ``forward(x (*, in), out_features=None)`` with ``in <= in_max`` -> ``(*, out)``;
    ``out_features`` overrides the active width for one call (an output that must match its input,
    e.g. attention's projection back to the query width).

    Raises:
        ValueError: from ``set_active_width`` on a width outside (0, out_max].
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias)
        self.active_out = out_features

    def set_active_width(self, out_features: int):
        _check_width("output", out_features, self.out_features)
        self.active_out = out_features

    def forward(self, x: Tensor, out_features: Optional[int] = None) -> Tensor:
        out = out_features or self.active_out
        return F.linear(x, self.weight[:out, : x.size(-1)], None if self.bias is None else self.bias[:out])


class SlimmableLayerNorm(nn.LayerNorm):
    """LayerNorm over the active C channels with the shared γ[:C], β[:C] (paper summary Sec. 2.5):
    C is read from the input. Shapes: ``(*, C)`` -> ``(*, C)``, C <= the widest width."""

    def forward(self, x: Tensor) -> Tensor:
        width = x.size(-1)
        return F.layer_norm(x, (width,), self.weight[:width], self.bias[:width], self.eps)


class CroppedPositions(nn.Module):
    """The first ``width`` channels of a wider positional embedding: an I/O-cropped sub-Transformer
    exported from a model of width M_max adds the positions it was trained with, the first C
    channels of M_max's sinusoids (not sinusoids built at width C).

    Shapes: as the wrapped module, last dimension cropped to ``width``.
    """

    def __init__(self, positions: nn.Module, width: int):
        super().__init__()
        self.positions, self.width = positions, width
        self.max_positions = positions.max_positions

    def forward(self, *args, **kwargs) -> Tensor:
        return self.positions(*args, **kwargs)[..., : self.width]


@with_incremental_state
class SlimmableAttention(nn.Module):
    """Multi-head attention (Eq. 1) whose Q, K and V are each cropped to the active width D
    (the first D / 64 heads, head dimension fixed at 64, scaling 1/√64 at every width) and whose
    output projection maps them back to the query's width C. Parameter names are fairseq's
    ``MultiheadAttention``'s (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``); at the widest
    width it computes what fairseq's does.

    Args:
        embed_dim (int): the widest C (M_max).
        max_dim (int): the widest attention width D (M_max), a multiple of 64.
        kdim (int, optional): widest key/value input width (encoder-decoder attention); default C.
        dropout (float): attention-probability dropout.
        self_attention (bool): keys/values from the query (decoding appends to the cache) or
            from ``key`` (computed once when decoding).

    Shapes: ``forward(query (T, B, C), key (S, B, C_k) or None)`` -> ``((T, B, C), weights)``, the
    weights ``(D / 64, B, T, S)`` with ``need_head_weights`` (alignments), else None.

    Raises:
        ValueError: if ``max_dim`` is not a multiple of 64, or from ``set_active_width`` on a width
            that is not a multiple of 64 in (0, max_dim].
    """

    def __init__(self, embed_dim: int, max_dim: int, kdim: Optional[int] = None, dropout: float = 0.0,
                 self_attention: bool = True):
        super().__init__()
        _check_width("attention", max_dim, max_dim, HEAD_DIM)
        self.max_dim, self.active_dim = max_dim, max_dim
        self.dropout, self.self_attention = dropout, self_attention
        self.causal_kernel = False  # see attention_utils
        kdim = kdim or embed_dim
        self.q_proj, self.k_proj = SlimmableLinear(embed_dim, max_dim), SlimmableLinear(kdim, max_dim)
        self.v_proj, self.out_proj = SlimmableLinear(kdim, max_dim), SlimmableLinear(max_dim, embed_dim)
        gain = 1 / math.sqrt(2) if kdim == embed_dim else 1.0  # fairseq's initialisation
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def set_active_width(self, dim: int):
        """Use the first ``dim / 64`` heads (Q, K and V cropped separately to ``dim``)."""
        _check_width("attention", dim, self.max_dim, HEAD_DIM)
        self.active_dim = dim
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            proj.set_active_width(dim)

    def _heads(self, x: Tensor) -> Tensor:
        L, B, _ = x.shape  # (L, B, D) -> (B, D / 64, L, 64)
        return x.view(L, B, -1, HEAD_DIM).permute(1, 2, 0, 3)

    def _project_kv(self, key: Tensor):
        return {"prev_key": self._heads(self.k_proj(key)), "prev_value": self._heads(self.v_proj(key))}

    def forward(self, query: Tensor, key: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None, incremental_state=None, need_head_weights: bool = False
                ) -> Tuple[Tensor, Optional[Tensor]]:
        """query ``(T, B, C)``; key ``(S, B, C_k)`` (encoder-decoder attention); key_padding_mask
        ``(B, S)`` True at padding; attn_mask ``(T, S)`` additive -> ``((T, B, C), weights or None)``."""
        T, B, C = query.shape
        q = self._heads(self.q_proj(query))
        kv, mask, is_causal = keys_values_and_mask(self, query, key, key_padding_mask, attn_mask, incremental_state)
        out, probs = dot_product_attention(q, kv["prev_key"], kv["prev_value"], mask,
                                           self.dropout if self.training else 0.0, need_head_weights, is_causal)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(T, B, self.active_dim), C), head_weights(probs)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        return reorder_cache(self, incremental_state, new_order, static=not self.self_attention)
