"""What the plugin's own attention modules share: fairseq-style decoding caches of per-head keys
and values ``(B, heads, S, head_dim)``, and additive masks for ``F.scaled_dot_product_attention``.
The modules are decorated with fairseq's ``with_incremental_state``."""
from typing import Callable, Dict, Optional, Tuple

import torch
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
                         attn_mask: Optional[Tensor], incremental_state) -> Tuple[Cache, Optional[Tensor]]:
    """The keys/values an attention module attends to (``module._project_kv(x)`` ->
    ``{"prev_key", "prev_value"}``, per head) and the additive mask that applies. Self-attention
    projects ``query`` and, when decoding, appends to the cache; one decoding step then attends to
    every cached key, so no mask applies. Encoder-decoder attention projects ``key`` once."""
    if module.self_attention:
        kv = append_to_cache(module, incremental_state, module._project_kv(query))
        if incremental_state is not None:
            return kv, None
    else:
        kv = static_cache(module, incremental_state, lambda: module._project_kv(key))
    return kv, additive_mask(key_padding_mask, attn_mask, query.dtype)


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
