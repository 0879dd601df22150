"""PartialFormer's attention-FFN ("AFFN") sub-layer (Zheng et al., "PartialFormer: Modeling Part
Instead of Whole for Machine Translation", Sec. 3, Eqs. 1-6).

Standard attention (Eqs. 1-3) with three changes, each switchable:

* **PG-FFN** (Eq. 5, ``PGFFN``): between Eq. 2 and Eq. 3 every head's output passes through one
  small FFN d_k → r·d_k → d_k shared by all heads, times a per-head gate G_i = σ(X W_i^G);
* **residual-like attention** (Eq. 6): global logits A^G (``GlobalAttentionLogits``, computed
  once per stack from its input embeddings) are added to each layer's local logits before the
  softmax;
* **head scaling** (Sec. 3.4, ``HeadExpansion``): Q and K at H_0 heads, their logits expanded to
  H heads by an MLP over the head axis; V, the gates and the output projection have H heads of d_k.

With all three off, ``PartialAttention`` is fairseq's ``MultiheadAttention`` (same parameter
names, same result).
"""
import math
import os
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from ..validation import refuse
from .attention_utils import (
    append_to_cache,
    bias_attention,
    dot_product_attention,
    head_weights,
    keys_values_and_mask,
    reorder_cache,
    softmax_attention,
    static_cache,
)

GATE_FUNCTIONS = {"relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}
GATE_ACTIVATIONS = tuple(GATE_FUNCTIONS)


def _linear(in_dim: int, out_dim: int, gain: float = 1.0, zero_bias: bool = True) -> nn.Linear:
    """fairseq's attention initialisation: Xavier-uniform weights; a zero bias, or nn.Linear's own
    (uniform in ±1/√in_dim, as the authors' released code leaves its Q/K/V biases)."""
    layer = nn.Linear(in_dim, out_dim)
    nn.init.xavier_uniform_(layer.weight, gain=gain)
    if zero_bias:
        nn.init.zeros_(layer.bias)
    return layer


def qkv_gain(embed_dim: int, kdim: int) -> float:
    """The Xavier gain of the Q/K/V projections, as fairseq's ``MultiheadAttention`` (and the released
    code, for its gate projection too): 1/√2 where keys and queries have one width, else 1."""
    return 1 / math.sqrt(2) if kdim == embed_dim else 1.0


def _heads(x: Tensor, head_dim: int) -> Tensor:
    """``(L, B, h·d_k)`` -> ``(B, h, L, d_k)``."""
    L, B, _ = x.shape
    return x.view(L, B, -1, head_dim).permute(1, 2, 0, 3)


class PGFFN(nn.Module):
    """Partial-level gated FFN (Eq. 5): ``head̄_i = G_i ⊙ (head_i + FFN(head_i))`` as the authors'
    released code computes it (``G_i ⊙ FFN(head_i)`` as Eq. 5 prints it with ``inner_residual=False``),
    ``G_i = σ(X W_i^G)``.

    One FFN ``d_k -> hidden -> d_k`` (ReLU, biases, activation dropout) shared by all heads of the
    sub-layer, run as one matmul over the heads folded into the rows; the gate projection
    ``W^G: d -> H·d_k`` holds the H per-head gates.

    Args:
        embed_dim (int): d, the width of the gate input X.
        num_heads (int): H.
        head_dim (int): d_k.
        hidden_dim (int): r·d_k; 0 drops the FFN (gates only).
        gate_activation (str or None): σ, ``relu`` (the paper's default), ``sigmoid`` or ``tanh``
            (Table 7); None drops the gates.
        inner_residual (bool): ``G_i ⊙ (head_i + FFN(head_i))``, as the authors' released code does
            (Fig. 2 leaves residual connections out of the drawing); False: Eq. 5 as printed.
        activation_dropout (float): dropout after the FFN's ReLU.
        gate_bias (float or None): initial bias of W^G; None keeps nn.Linear's (the released code);
            1 opens the ReLU gates at initialisation (docs/partialformer.md, "Initialisation").
        gate_gain (float or None): W^G's weights Xavier-uniform with this gain (the released code:
            its Q/K/V gain); None keeps nn.Linear's initialisation.

    Shapes: ``forward(heads (T, B, H, d_k), gate_input (T, B, d))`` -> ``(T, B, H, d_k)``.

    Raises:
        ValueError: on an unknown gate activation.
    """

    def __init__(self, embed_dim: int, num_heads: int, head_dim: int, hidden_dim: int,
                 gate_activation: Optional[str] = "relu", inner_residual: bool = True,
                 activation_dropout: float = 0.0, gate_bias: Optional[float] = 1.0,
                 gate_gain: Optional[float] = None):
        super().__init__()
        if gate_activation is not None and gate_activation not in GATE_ACTIVATIONS:
            raise ValueError(f"gate_activation must be one of {GATE_ACTIVATIONS}, got {gate_activation!r}")
        self.fc1 = nn.Linear(head_dim, hidden_dim) if hidden_dim else None
        self.fc2 = nn.Linear(hidden_dim, head_dim) if hidden_dim else None
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)
        self.gate_proj = nn.Linear(embed_dim, num_heads * head_dim) if gate_activation else None
        if self.gate_proj is not None and gate_gain is not None:
            nn.init.xavier_uniform_(self.gate_proj.weight, gain=gate_gain)
        if self.gate_proj is not None and gate_bias is not None:
            nn.init.constant_(self.gate_proj.bias, gate_bias)
        self.gate_fn = GATE_FUNCTIONS[gate_activation] if gate_activation else None
        self.inner_residual = inner_residual

    def forward(self, heads: Tensor, gate_input: Tensor) -> Tensor:
        out = heads
        if self.fc1 is not None:
            out = self.fc2(self.activation_dropout_module(F.relu(self.fc1(heads), inplace=True)))
            if self.inner_residual:
                out = heads + out
        if self.gate_proj is not None:
            out = self.gate_fn(self.gate_proj(gate_input)).view_as(out) * out
        return out


class HeadExpansion(nn.Module):
    """Head scaling (Sec. 3.4): an MLP over the head axis maps the H_0 intermediate logits of every
    (query, key) pair to H logits, ``H_0 -> H -> H`` with a ReLU (the released code's two layers; the
    paper gives no sizes). Applied in logit space, before A^G is added and the softmax (Eq. 6).

    Shapes: ``(B, H_0, T, S)`` -> ``(B, H, T, S)``.
    """

    def __init__(self, qk_heads: int, num_heads: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(qk_heads, num_heads), nn.Linear(num_heads, num_heads)

    def forward(self, logits: Tensor) -> Tensor:
        x = logits.permute(0, 2, 3, 1)  # heads last: one matmul over all (query, key) pairs
        return self.fc2(F.relu(self.fc1(x), inplace=True)).permute(0, 3, 1, 2)


@with_incremental_state
class GlobalAttentionLogits(nn.Module):
    """A^G of residual-like attention (Eq. 6): Eq. 1's scaled logits without the softmax, from the
    stack's input embeddings, with their own Q/K projections ``d -> H·d_k``. Computed once per
    forward and added to the local logits of every layer of the stack.

    Args:
        embed_dim (int): d.
        num_heads (int): H (the expanded head count).
        head_dim (int): d_k.
        self_attention (bool): keys from the query embeddings (encoder, decoder self-attention;
            decoding appends each step's keys to the cache) or from ``key`` (the decoder's
            cross-attention map, keys from the source embeddings, computed once when decoding).
        kdim (int, optional): width of ``key`` (the source embeddings); default d.

        normalize (bool): LayerNorm the embeddings first (own parameters; the keys' own LayerNorm in
            the cross-attention map), as the authors' released code does; False: the raw embeddings,
            as Eq. 6 prints it.
        zero_bias (bool): the projections' biases start at 0; False: nn.Linear's (the released code).

    Shapes: ``forward(query (T, B, d), key (S, B, kdim) or None)`` -> ``(B, H, T, S)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, head_dim: int, self_attention: bool = True,
                 kdim: Optional[int] = None, normalize: bool = True, zero_bias: bool = True):
        super().__init__()
        self.head_dim, self.self_attention = head_dim, self_attention
        self.q_proj = _linear(embed_dim, num_heads * head_dim, 1 / math.sqrt(2), zero_bias)
        self.k_proj = _linear(kdim or embed_dim, num_heads * head_dim, 1 / math.sqrt(2), zero_bias)
        self.query_norm = LayerNorm(embed_dim) if normalize else None
        self.key_norm = LayerNorm(kdim or embed_dim) if normalize and not self_attention else None

    def forward(self, query: Tensor, key: Optional[Tensor] = None, incremental_state=None) -> Tensor:
        if self.query_norm is not None:
            query = self.query_norm(query)
        q = _heads(self.q_proj(query), self.head_dim) * self.head_dim ** -0.5
        if self.self_attention:
            k = append_to_cache(self, incremental_state, {"prev_key": _heads(self.k_proj(query), self.head_dim)})
        else:
            k = static_cache(self, incremental_state, lambda: {"prev_key": _heads(self.k_proj(
                key if self.key_norm is None else self.key_norm(key)), self.head_dim)})
        return q @ k["prev_key"].transpose(-1, -2)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        return reorder_cache(self, incremental_state, new_order, static=not self.self_attention)


#: How ``PartialAttention`` computes its attention (docs/partialformer.md, "Attention kernel").
KERNELS = ("auto", "explicit", "sdpa")
#: The environment variable that chooses the kernel for a process (default ``auto``): a way to run,
#: not a property of the model, so no checkpoint stores it.
KERNEL_VARIABLE = "PARTIALFORMER_ATTENTION_KERNEL"


def process_kernel() -> str:
    """The kernel ``KERNEL_VARIABLE`` names (``auto`` where unset).

    Raises:
        ConfigurationError: naming the variable, for a value not in ``KERNELS`` (``validation.refuse``:
            one line under a fairseq program).
    """
    kernel = os.environ.get(KERNEL_VARIABLE) or "auto"
    if kernel not in KERNELS:
        refuse(f"{KERNEL_VARIABLE} must be one of {', '.join(KERNELS)}, got {kernel!r}")
    return kernel


@with_incremental_state
class PartialAttention(nn.Module):
    """The AFFN sub-layer's function: attention whose heads pass through the PG-FFN before the
    output projection (Eqs. 1, 2, 5, 3), with optional head scaling and global logits (Eq. 6).

    ``q_proj``/``k_proj``: ``d -> H_0·d_k``; ``v_proj``: ``kdim -> H·d_k``; ``out_proj``:
    ``H·d_k -> d`` (fairseq's names: with H = H_0, H_0·d_k = d, no PG-FFN, no gates and no A^G
    it equals fairseq's ``MultiheadAttention`` holding the same weights).

    Args:
        embed_dim (int): d.
        qk_heads (int): H_0, the heads of Q and K.
        num_heads (int): H >= H_0; H > H_0 enables head scaling.
        head_dim (int): d_k.
        pg_ffn (PGFFN or None): applied to the heads; None skips it.
        kdim (int, optional): key/value input width (encoder-decoder attention); default d.
        dropout (float): attention-probability dropout.
        self_attention (bool): keys and values from the query (decoding appends to the cache) or
            from ``key`` (computed once when decoding).
        kernel (str, optional): how the attention is computed, the same outputs (``KERNELS``;
            default: ``process_kernel()``): ``auto``
            SDPA unless the logits go through head scaling or the weights are returned (then the
            explicit softmax); ``explicit`` the explicit softmax always; ``sdpa`` SDPA always, the
            head-scaled logits as its additive mask (``bias_attention``).
        zero_bias (bool): the Q/K/V biases start at 0 (fairseq's ``MultiheadAttention``); False:
            nn.Linear's (the released code). The output projection's bias starts at 0 either way.

    Raises:
        ValueError: if ``num_heads < qk_heads``, a size is not positive or the kernel is unknown.
    """

    def __init__(self, embed_dim: int, qk_heads: int, num_heads: int, head_dim: int, pg_ffn: Optional[PGFFN] = None,
                 kdim: Optional[int] = None, dropout: float = 0.0, self_attention: bool = True, kernel: Optional[str] = None,
                 zero_bias: bool = True):
        super().__init__()
        if min(embed_dim, qk_heads, num_heads, head_dim) <= 0:
            raise ValueError(f"attention sizes must be positive, got d={embed_dim}, H_0={qk_heads}, H={num_heads}, "
                             f"d_k={head_dim}")
        if num_heads < qk_heads:
            raise ValueError(f"H = {num_heads} heads must be >= the H_0 = {qk_heads} Q/K heads")
        kernel = kernel or process_kernel()
        if kernel not in KERNELS:
            raise ValueError(f"the attention kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self.qk_heads, self.num_heads, self.head_dim = qk_heads, num_heads, head_dim
        self.dropout, self.self_attention = dropout, self_attention
        self.causal_kernel = False  # see attention_utils
        kdim = kdim or embed_dim
        gain = qkv_gain(embed_dim, kdim)
        self.q_proj = _linear(embed_dim, qk_heads * head_dim, gain, zero_bias)
        self.k_proj = _linear(kdim, qk_heads * head_dim, gain, zero_bias)
        self.v_proj = _linear(kdim, num_heads * head_dim, gain, zero_bias)
        self.out_proj = _linear(num_heads * head_dim, embed_dim)
        self.head_expansion = HeadExpansion(qk_heads, num_heads) if num_heads > qk_heads else None
        self.pg_ffn = pg_ffn

    def _project_kv(self, key: Tensor):
        return {"prev_key": _heads(self.k_proj(key), self.head_dim),
                "prev_value": _heads(self.v_proj(key), self.head_dim)}

    def forward(self, query: Tensor, key: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None, global_logits: Optional[Tensor] = None,
                incremental_state=None, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            query: ``(T, B, d)``, already layer-normalised; also the gate input X of Eq. 5.
            key: ``(S, B, kdim)`` encoder output (encoder-decoder attention); None for self-attention.
            key_padding_mask: ``(B, S)``, True at padding keys.
            attn_mask: ``(T, S)`` additive float mask (the causal mask), added after A^G.
            global_logits: A^G ``(B, H, T, S)`` or None.
            incremental_state: fairseq's decoding cache.
            need_head_weights: also return the attention probabilities (alignments).
        Returns:
            ``(T, B, d)``, and the probabilities of the H heads ``(H, B, T, S)`` if ``need_head_weights``
            (else None).
        """
        T, B, _ = query.shape
        q = _heads(self.q_proj(query), self.head_dim)
        kv, mask, is_causal = keys_values_and_mask(self, query, key, key_padding_mask, attn_mask, incremental_state,
                                                   bias=global_logits is not None or self.head_expansion is not None)
        k, v = kv["prev_key"], kv["prev_value"]
        if global_logits is not None:
            mask = global_logits if mask is None else global_logits + mask
        dropout = self.dropout if self.training else 0.0
        if self.head_expansion is None:  # Eqs. 1-2 (+ A^G as an additive mask), fused unless weights are needed
            explicit = need_head_weights or self.kernel == "explicit"
            heads, probs = dot_product_attention(q, k, v, mask, dropout, explicit, is_causal)
        else:
            logits = self.head_expansion((q * self.head_dim ** -0.5) @ k.transpose(-1, -2))
            logits = logits if mask is None else logits + mask
            if self.kernel == "sdpa" and not need_head_weights:
                heads, probs = bias_attention(logits, v, dropout), None
            else:
                heads, probs = softmax_attention(logits, v, dropout)
        heads = heads.permute(2, 0, 1, 3)  # (B, H, T, d_k) -> (T, B, H, d_k)
        if self.pg_ffn is not None:
            heads = self.pg_ffn(heads, query)
        out = self.out_proj(heads.reshape(T, B, self.num_heads * self.head_dim))
        return out, head_weights(probs) if need_head_weights else None

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        return reorder_cache(self, incremental_state, new_order, static=not self.self_attention)
