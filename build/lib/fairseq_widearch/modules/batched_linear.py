"""n independent linear maps computed as one batched matmul (multi-path sub-layers, MoE experts)."""
import math
from typing import Optional

import torch
import torch.nn as nn


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
