"""n independent linear maps computed as one batched matmul (multi-path sub-layers, MoE experts)."""
import math
from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class BatchedLinear(nn.Module):
    """n independent ``Linear(in_features, out_features)`` (one per path of a multi-path
    sub-layer, or one per expert of an MoE layer) computed as one ``baddbmm``.

    Shapes: input ``(n, N, in_features)``; output ``(n, N, out_features)``.
    Each linear is initialised like ``nn.Linear`` (Kaiming-uniform, a=√5) or, with ``xavier_gain``,
    like fairseq's attention projections (Xavier-uniform, zero bias; with ``bias_std``, a bias
    from N(0, bias_std²) instead, as Keras' Dense layers of WideNet's released code).
    """

    def __init__(self, num_linears: int, in_features: int, out_features: int, xavier_gain: Optional[float] = None,
                 bias_std: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_linears, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(num_linears, out_features))
        for i in range(num_linears):
            # weight[i] is (in, out); the init functions expect nn.Linear's (out, in) layout.
            w, b = self.weight[i].T, self.bias[i]
            if xavier_gain is None:
                nn.init.kaiming_uniform_(w, a=math.sqrt(5))
                nn.init.uniform_(b, -1 / math.sqrt(in_features), 1 / math.sqrt(in_features))
            else:
                nn.init.xavier_uniform_(w, gain=xavier_gain)
                if bias_std:
                    nn.init.normal_(b, std=bias_std)
                else:
                    nn.init.zeros_(b)

    def forward(self, x):
        # bmm then an in-place bias add: baddbmm would first copy the broadcast bias into its
        # (n, N, out) output, a slow strided copy on CPU.
        return torch.bmm(x, self.weight.to(x.dtype)).add_(self.bias[:, None].to(x.dtype))

    def grouped(self, x, offsets, member):
        """The linears on rows sorted by linear, one grouped matrix product (``F.grouped_mm``): ``x``
        ``(M, in_features)``, linear i's rows ending at ``offsets[i]`` (``(n,)`` int32, the last below
        M), ``member`` ``(M, n)`` bool, each row's linear (no linear for the rows past the last
        group) -> ``(M, out_features)``. The rows past ``offsets[-1]`` are left undefined, in the
        output and in the gradient of x; they add no bias, so that their undefined gradient reaches no
        parameter (``GroupBias``)."""
        if torch.is_autocast_enabled(x.device.type):  # as autocast casts bmm's operands (grouped_mm is not listed)
            x = x.to(torch.get_autocast_dtype(x.device.type))
        return GroupBias.apply(F.grouped_mm(x, self.weight_as(x.dtype), offs=offsets), member, self.bias, offsets)

    #: The weight's casts while ``casts_once`` holds: {(dtype, grad mode): cast}; None: cast each call.
    casts: Optional[dict] = None

    def weight_as(self, dtype: torch.dtype):
        """The weight in ``dtype``: cast once for every call inside ``casts_once`` in one grad mode."""
        if self.weight.dtype == dtype:
            return self.weight
        if self.casts is None:
            return self.weight.to(dtype)
        key = (dtype, torch.is_grad_enabled())
        if key not in self.casts:
            self.casts[key] = self.weight.to(dtype)
        return self.casts[key]


class GroupBias(torch.autograd.Function):
    """``out`` ``(M, out_features)`` plus each row's group's bias, ``member`` ``(M, n)`` bool saying
    each row's group (none for the rows past ``offsets[-1]``), in one ``addmm`` in ``out``'s dtype;
    the bias's gradient summed per group by a grouped product over the rows (no scatter-add of M rows
    onto n), which reads no row past ``offsets[-1]``: their gradient is undefined (``F.grouped_mm``
    leaves it so), and a product with ``member``'s zeros would carry its NaNs. The kernel accumulates
    in fp32 and rounds the sum once to ``out``'s dtype (bf16 under autocast, as padded's ``bmm`` and
    ``nn.Linear``'s bias gradients are) before its cast to the bias's dtype."""

    @staticmethod
    def forward(ctx, out, member, bias, offsets):
        ctx.save_for_backward(offsets)
        ctx.bias_dtype = bias.dtype
        return torch.addmm(out, member.to(out.dtype), bias.to(out.dtype))

    @staticmethod
    def backward(ctx, grad):
        offsets, = ctx.saved_tensors
        grad_bias = None
        if ctx.needs_input_grad[2]:
            # (out, M) x (M, 8) ones -> (n, out, 8): 8 columns, as the grouped kernel's 16-byte strides ask
            sums = F.grouped_mm(grad.contiguous().t(), grad.new_ones(grad.shape[0], 8), offs=offsets)
            grad_bias = sums[..., 0].to(ctx.bias_dtype)
        return grad, None, grad_bias, None


@contextmanager
def casts_once(module: nn.Module):
    """Inside the block, every ``BatchedLinear`` of ``module`` casts its weight to a dtype once (as
    autocast's cache does for the operators it casts itself; ``F.grouped_mm`` is not one), so that
    experts shared by all blocks are cast once per forward pass, not once per block. The casts are
    dropped on leaving, so a parameter updated in between is cast again. It acts under bf16 autocast
    over fp32 weights alone (a user's own loop or hub call): ``--bf16``'s weights are bf16 already,
    and fairseq's ``--amp`` is fp16 autocast, where ``grouped`` runs ``padded``."""
    linears = [m for m in module.modules() if isinstance(m, BatchedLinear)]
    for linear in linears:
        linear.casts = {}
    try:
        yield
    finally:
        for linear in linears:
            linear.casts = None
