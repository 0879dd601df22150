"""Parameter sharing across blocks (ALBERT-style, as WideNet shares attention and MoE)."""
import torch.nn as nn


def share_parameters(dst: nn.Module, src: nn.Module):
    """Make every parameter of ``dst`` the very ``nn.Parameter`` of ``src`` with the same name.

    The modules stay distinct objects (so each keeps its own incremental-decoding cache key and
    buffers); only their weights are one. ``model.parameters()`` then yields each weight once, so
    optimisers and DDP see it once and its gradient sums every block's contribution.

    Raises:
        AttributeError: if ``src`` lacks a parameter that ``dst`` has (different structures).
    """
    for name, _ in list(dst.named_parameters()):
        owner_name, _, attr = name.rpartition(".")
        owner = dst.get_submodule(owner_name) if owner_name else dst
        setattr(owner, attr, src.get_parameter(name))
