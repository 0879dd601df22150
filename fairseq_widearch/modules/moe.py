"""Mixture-of-Experts layer with a top-k router (Xue et al. 2022, "Go Wider Instead of Deeper",
Sec. 3.1, Eqs. 1-5; capacity and balance loss after Switch Transformer / GShard).

    MoE(x) = Σ_{i=1..E} g(x)_i e_i(x)                       (Eq. 1)
    g(x)   = TopK(softmax(f(x) + ε)),  ε ~ N(0, 1/E²)       (Eq. 2, noise in training only)
    l      = E · Σ_i m_i · P_i                              (Eqs. 3-5)

Decisions (docs/widenet.md): top-k gate values are not renormalised (Eq. 2 as written and the
official code; ``renormalize=True`` opts in); when an expert overflows its capacity, every
token's first choice is served before any second choice, and within one choice rank tokens are
served in batch order (GShard/V-MoE); a dropped assignment contributes zero and the residual
carries the token. Padding tokens are never routed and never counted.
"""
import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from .batched_linear import BatchedLinear


@dataclass
class Routing:
    """One routing decision over the N non-padding tokens of a batch.

    Attributes:
        expert: ``(k·N,)`` expert of each assignment, choice-major (all first choices, then all
            second choices, ...).
        token: ``(k·N,)`` token (row of the flattened non-padding input) of each assignment.
        gate: ``(k·N,)`` gate value g(x)_i of each assignment, fp32.
        slot: ``(k·N,)`` position of each assignment in its expert's buffer.
        kept: ``(k·N,)`` bool, False for assignments beyond the expert's capacity (dropped).
        capacity: B, buffer size per expert.
        num_experts: E.
        balance_loss: scalar fp32 l = E · Σ_i m_i P_i (Eq. 3).
    """

    expert: Tensor
    token: Tensor
    gate: Tensor
    slot: Tensor
    kept: Tensor
    capacity: int
    num_experts: int
    balance_loss: Tensor

    def as_tuple(self) -> tuple:
        """The fields in order (``Routing(*routing.as_tuple())`` rebuilds it): the form in which a
        routing crosses a layer boundary, so that fairseq's activation checkpointing, which sees
        only top-level tensors, carries the gradients of ``gate`` and ``balance_loss``."""
        return tuple(getattr(self, field.name) for field in fields(self))


class TopKRouter(nn.Module):
    """Router f = Linear(d, E) without bias, g(x) = TopK(softmax(f(x) + ε)) (Eq. 2), computed in
    fp32 whatever the input dtype, with capacity B = ceil(C · k · N / E) per routing call.

    Args:
        embed_dim (int): d.
        num_experts (int): E.
        top_k (int): k, experts per token.
        capacity_factor (float): C in training, > 0.
        eval_capacity_factor (float): C at inference; 0 (the default) means no limit, so a
            sentence's translation never depends on the rest of its batch.
        noise (bool): add ε ~ N(0, 1/E²) to the logits in training.
        renormalize (bool): divide the k kept gates by their sum (not in the paper).

    Raises:
        ValueError: if E < 1, k is not in [1, E], C <= 0 or the eval C < 0 (naming the flag).
    """

    def __init__(self, embed_dim: int, num_experts: int, top_k: int, capacity_factor: float = 1.2,
                 eval_capacity_factor: float = 0.0, noise: bool = True, renormalize: bool = False):
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"--moe-experts must be >= 1, got {num_experts}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"--moe-top-k must be in [1, --moe-experts={num_experts}], got {top_k}")
        if capacity_factor <= 0:
            raise ValueError(f"--moe-capacity-factor must be > 0, got {capacity_factor}")
        if eval_capacity_factor < 0:
            raise ValueError(f"--moe-eval-capacity-factor must be >= 0 (0: no limit), got {eval_capacity_factor}")
        self.num_experts, self.top_k = num_experts, top_k
        self.capacity_factor, self.eval_capacity_factor = capacity_factor, eval_capacity_factor
        self.noise, self.renormalize = noise, renormalize
        self.weight = nn.Parameter(torch.empty(num_experts, embed_dim))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's init

    def capacity(self, num_tokens: int, loads: Tensor) -> int:
        """B for this call; without a limit, the largest load (every assignment fits, and the expert
        buffers hold no more empty slots than needed)."""
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if factor <= 0:
            return max(int(loads.max()) if loads.numel() else 0, 1)
        return max(math.ceil(factor * self.top_k * num_tokens / self.num_experts), 1)

    def forward(self, x: Tensor) -> Routing:
        """x: ``(N, d)`` non-padding tokens -> :class:`Routing`."""
        E, k, N = self.num_experts, self.top_k, x.shape[0]
        logits = F.linear(x.float(), self.weight.float())  # (N, E), fp32
        if self.training and self.noise:
            logits = logits + torch.randn_like(logits) / E
        probs = logits.softmax(dim=-1)
        gate, expert = probs.topk(k, dim=-1)  # (N, k)
        if self.renormalize:
            gate = gate / gate.sum(dim=-1, keepdim=True)
        # choice-major order: every token's first choice precedes any second choice
        expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)
        token = torch.arange(N, device=x.device).repeat(k)
        one_hot = F.one_hot(expert, E)  # (k·N, E)
        slot = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # position in the expert's buffer
        loads = one_hot.sum(dim=0)  # assignments per expert
        capacity = self.capacity(N, loads)
        # Eqs. 3-5: m_i = fraction of tokens assigned to expert i (not differentiable),
        # P_i = mean router probability of expert i over the same tokens.
        m = loads.float() / max(N, 1)
        balance_loss = E * (m * probs.mean(dim=0)).sum() if N > 0 else probs.sum() * 0
        return Routing(expert, token, gate, slot, slot < capacity, capacity, E, balance_loss)


class Experts(nn.Module):
    """E expert FFNs, d -> d_ffn -> d each (e(·)_i of Eq. 1), as two batched matmuls over all E
    experts: every expert parameter is in the graph every step (an expert that got no token gets
    a zero gradient, so DDP never sees an unused parameter).

    Shapes: input ``(E, B, d)`` (B = capacity slots per expert); output ``(E, B, d)``.
    """

    def __init__(self, num_experts: int, embed_dim: int, ffn_dim: int, activation_fn: str = "relu",
                 activation_dropout: float = 0.0):
        super().__init__()
        self.fc1 = BatchedLinear(num_experts, embed_dim, ffn_dim)
        self.fc2 = BatchedLinear(num_experts, ffn_dim, embed_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)

    def forward(self, buffer: Tensor) -> Tensor:
        return self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(buffer))))


class MoELayer(nn.Module):
    """Mixture of experts (Eq. 1): a :class:`TopKRouter` in front of :class:`Experts`.

    Dispatch and combine are vectorised: the kept token-to-expert assignments are copied into an
    ``(E, B, d)`` buffer with one ``index_copy``, and the gated expert outputs summed back per
    token with one ``index_add``. Router and experts are separate modules so that blocks can
    share the experts with or without the router (WideNet and its per-block-router variant).

    Args:
        router (TopKRouter): E, K and the capacity factors.
        experts (Experts): E experts.

    Raises:
        ValueError: if the router and the experts disagree on E.

    Shapes:
        ``forward(x, padding_mask=None, routing=None)``: x ``(T, B, d)``, padding_mask ``(B, T)``
        True at padding -> ``(y (T, B, d), routing)``; padding positions of y are 0. Passing a
        ``routing`` reuses another call's decision (routing groups) instead of routing again.
    """

    def __init__(self, router: TopKRouter, experts: Experts):
        super().__init__()
        if experts.fc1.weight.shape[0] != router.num_experts:
            raise ValueError(f"router has {router.num_experts} experts, Experts has {experts.fc1.weight.shape[0]}")
        self.router, self.experts = router, experts

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, routing: Optional[Routing] = None):
        T, B, d = x.shape
        flat = x.reshape(T * B, d)
        # (T, B) -> rows of the non-padding tokens in the flattened batch
        rows = None
        if padding_mask is not None:
            # the one wait for the GPU per call: the number of real tokens N sets the buffers' shape
            # (capacity B); an "any padding?" check first would be a second
            rows = (~padding_mask.t().reshape(-1)).nonzero().squeeze(1)
        tokens = flat.index_select(0, rows) if rows is not None else flat
        if routing is None:
            routing = self.router(tokens)
        E, cap = routing.num_experts, routing.capacity
        # Dropped assignments are written to a spare row past the E x B buffer and read back with a
        # gate of 0, rather than filtered out: filtering (nonzero) waits for the GPU on every call.
        where = torch.where(routing.kept, routing.expert * cap + routing.slot, E * cap)  # flat buffer position
        buffer = tokens.new_zeros(E * cap + 1, d).index_copy(0, where, tokens.index_select(0, routing.token))
        out = self.experts(buffer[:-1].view(E, cap, d)).view(E * cap, d)
        gate = routing.gate.masked_fill(~routing.kept, 0.0).to(out.dtype)
        weighted = out.index_select(0, where.clamp_max(E * cap - 1)) * gate[:, None]
        y = tokens.new_zeros(tokens.shape).index_add(0, routing.token, weighted)
        if rows is not None:
            y = flat.new_zeros(flat.shape).index_copy(0, rows, y)
        return y.view(T, B, d), routing
