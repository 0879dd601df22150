"""What the plugin's own attention modules share: fairseq-style decoding caches of per-head keys
and values ``(B, heads, S, head_dim)``, the masks for ``F.scaled_dot_product_attention`` (additive,
or its own causal mask), and the attention itself with its weights when asked for (alignments, as
fairseq's ``MultiheadAttention(need_head_weights=True)`` returns them). The modules are decorated
with fairseq's ``with_incremental_state``.

A decoder self-attention module whose ``causal_kernel`` is True (set by the model when its task
pads targets on the right, ``fairseq_widearch.models.base.use_causal_kernel``) runs a
training or scoring forward with SDPA's ``is_causal=True`` and no mask tensor instead of fairseq's
additive causal mask plus the target padding mask: with right padding every real position's keys
are real positions either way, so its output is the same, and the fused (flash) kernels, which an
additive float mask keeps out, apply. Only padding positions, which no loss reads, attend
differently."""
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from torch import Tensor

Cache = Dict[str, Tensor]
_KEY = "attn_state"


def append_to_cache(module, incremental_state, step: Cache) -> Cache:
    """Self-attention while decoding: this step's tensors appended to the cached ones along the
    key axis (and cached); ``step`` unchanged without an ``incremental_state``."""
    if incremental_state is None:
        return step
    cache = module.get_incremental_state(incremental_state, _KEY)
    if cache is not None:
        step = {name: torch.cat([cache[name], t], dim=2) for name, t in step.items()}
    module.set_incremental_state(incremental_state, _KEY, step)
    return step


def static_cache(module, incremental_state, compute: Callable[[], Cache]) -> Cache:
    """Encoder-decoder attention: tensors of the encoder output, computed at the first step only."""
    if incremental_state is None:
        return compute()
    cache = module.get_incremental_state(incremental_state, _KEY)
    if cache is None:
        cache = compute()
        module.set_incremental_state(incremental_state, _KEY, cache)
    return cache


def reorder_cache(module, incremental_state, new_order: Tensor, static: bool = False):
    """Reorder a module's cached tensors along the batch axis (beam search).

    A ``static`` (encoder-output) cache holds the same rows for every beam of a sentence, and beam
    search reorders within a sentence's beams, so while the batch keeps its size the reorder
    cannot change it and is skipped (as fairseq's ``MultiheadAttention`` does); when finished
    sentences leave the batch it is applied."""
    cache = module.get_incremental_state(incremental_state, _KEY)
    if cache is None or (static and next(iter(cache.values())).size(0) == new_order.numel()):
        return incremental_state
    module.set_incremental_state(incremental_state, _KEY, {name: t.index_select(0, new_order) for name, t in cache.items()})
    return incremental_state


def keys_values_and_mask(module, query: Tensor, key: Optional[Tensor], key_padding_mask: Optional[Tensor],
                         attn_mask: Optional[Tensor], incremental_state, bias: bool = False
                         ) -> Tuple[Cache, Optional[Tensor], bool]:
    """The keys/values an attention module attends to (``module._project_kv(x)`` ->
    ``{"prev_key", "prev_value"}``, per head) and the mask that applies, as ``attention_mask``
    gives it. Self-attention projects ``query`` and, when decoding, appends to the cache; one
    decoding step then attends to every cached key, so no mask applies. Encoder-decoder attention
    projects ``key`` once."""
    if module.self_attention:
        kv = append_to_cache(module, incremental_state, module._project_kv(query))
        if incremental_state is not None:
            return kv, None, False
    else:
        kv = static_cache(module, incremental_state, lambda: module._project_kv(key))
    return (kv, *attention_mask(module, key_padding_mask, attn_mask, query.dtype, bias))


def attention_mask(module, key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor], dtype,
                   bias: bool = False) -> Tuple[Optional[Tensor], bool]:
    """``(mask, is_causal)`` of a forward over whole sequences: ``(None, True)`` (SDPA's causal
    mask; see the module docstring) where ``module.causal_kernel`` holds and ``attn_mask``, which
    decoder layers pass only as fairseq's causal mask, is given, unless the logits carry an additive
    ``bias`` (PartialFormer's A^G) the causal mask must join; else the ``additive_mask``."""
    if attn_mask is not None and getattr(module, "causal_kernel", False) and not bias:
        return None, True
    return additive_mask(key_padding_mask, attn_mask, dtype), False


def additive_mask(key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor], dtype) -> Optional[Tensor]:
    """Combine a ``(B, S)`` padding mask and a ``(T, S)`` additive mask into a mask broadcastable
    to ``(B, heads, T, S)`` for ``F.scaled_dot_product_attention``; None when neither is given."""
    mask = None
    if key_padding_mask is not None:
        mask = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
        mask = mask.masked_fill(key_padding_mask.bool(), float("-inf"))[:, None, None, :]
    if attn_mask is not None:
        attn_mask = attn_mask.to(dtype)[None, None]
        mask = attn_mask if mask is None else mask + attn_mask
    return mask


def softmax_attention(logits: Tensor, v: Tensor, dropout_p: float) -> Tuple[Tensor, Tensor]:
    """``(dropout(softmax(logits)) v, softmax(logits))`` per head; logits ``(B, h, T, S)`` already
    scaled and masked, v ``(B, h, S, d)``. The softmax runs in fp32 (fairseq's ``utils.softmax``);
    a query whose keys are all masked (a padding position) gets zero weights, as
    ``F.scaled_dot_product_attention`` gives it, not NaN. Returns the output ``(B, h, T, d)`` and
    the probabilities ``(B, h, T, S)`` before dropout."""
    probs = utils.softmax(logits, dim=-1).nan_to_num(0.0).type_as(v)
    return F.dropout(probs, dropout_p) @ v, probs


def bias_attention(logits: Tensor, v: Tensor, dropout_p: float) -> Tensor:
    """``softmax_attention``'s output computed by ``F.scaled_dot_product_attention`` with the
    finished ``logits`` as its additive mask over zero queries and keys (q kᵀ = 0): the one fused
    form left when the logits are not q kᵀ (PartialFormer's head scaling). Its dropout draws other
    random numbers than ``F.dropout``; without dropout it equals ``softmax_attention``.
    logits ``(B, h, T, S)`` scaled and masked, v ``(B, h, S, d)`` -> ``(B, h, T, d)``."""
    # 8: the smallest head size every fused kernel takes
    q, k = v.new_zeros(*logits.shape[:-1], 8), v.new_zeros(*v.shape[:-1], 8)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=logits, dropout_p=dropout_p)


def dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float,
                          need_weights: bool = False, is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """softmax(q kᵀ / √d + mask) v per head (Vaswani et al. 2017, Eq. 1): q ``(B, h, T, d)``, k and v
    ``(B, h, S, d)``, mask additive, broadcastable to ``(B, h, T, S)``, or ``is_causal`` (then no
    mask: query t sees keys 0..t); ``dropout_p`` on the probabilities (pass 0 at inference). One
    fused ``F.scaled_dot_product_attention`` unless ``need_weights``, which computes the same
    explicitly and also returns the probabilities ``(B, h, T, S)`` (else None)."""
    if not need_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal), None
    if is_causal:
        mask = torch.full((q.size(-2), k.size(-2)), float("-inf"), dtype=q.dtype, device=q.device).triu_(1)
    logits = (q * q.size(-1) ** -0.5) @ k.transpose(-1, -2)
    return softmax_attention(logits if mask is None else logits + mask, v, dropout_p)


def head_weights(probs: Optional[Tensor], num_groups: int = 1) -> Optional[Tensor]:
    """Attention probabilities ``(B, g·h, T, S)`` -> fairseq's per-head alignment weights
    ``(h, B, T, S)``, averaged over the ``num_groups`` groups of h heads (multi-path: the paths)."""
    if probs is None:
        return None
    B, heads, T, S = probs.shape
    return probs.view(B, num_groups, heads // num_groups, T, S).mean(1).transpose(0, 1)
