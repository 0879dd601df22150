"""Mixture-of-Experts layer with a top-k router (Xue et al. 2022, "Go Wider Instead of Deeper",
Sec. 3.1, Eqs. 1-5; capacity and balance loss after Switch Transformer / GShard).

    MoE(x) = Σ_{i=1..E} g(x)_i e_i(x)                       (Eq. 1)
    g(x)   = TopK(softmax(f(x) + ε)),  ε ~ N(0, 1/E²)       (Eq. 2, noise in training only)
    l      = E · Σ_i m_i · P_i                              (Eqs. 3-5)

Decisions (docs/widenet.md): top-k gate values are not renormalised (Eq. 2 as written and the
released code; ``renormalize=True`` opts in); a dropped assignment contributes zero and the
residual carries the token; padding tokens are never routed and never counted. Routing
(``ROUTINGS``) by default as the authors' released code does it (XueFuzhao/WideNet_Code,
``widenet/model_configs.py``, ``Router`` and ``Switch``): m_i the share of the K·N assignments,
capacity ⌊C·K·N/E⌋ of which the first slot is never used, one running count over the tokens in
batch-major order, both choices of a token competing at its place; ``ours``: GShard's order (every
first choice before any second), ⌈C·K·N/E⌉ slots, m_i the share of the N tokens (so l is K times
the released code's), tokens in fairseq's T x B order.
"""
import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor
from torch.autograd.function import once_differentiable

from .batched_linear import BatchedLinear


@dataclass
class Routing:
    """One routing decision over the N rows of a batch (padding rows included, never kept).

    Attributes:
        choice: ``(N, k)`` the k experts of each row, best first.
        gate: ``(N, k)`` their gate values g(x)_i, fp32.
        position: ``(N·k,)`` token-major (row n's k choices at ``n·k`` to ``n·k + k - 1``): the row
            of each assignment in the flat expert buffer of ``E·B + 1`` rows, where expert i's slot
            s (1-based) is row ``i·B + s`` and row 0 takes the dropped and padding assignments.
        capacity: B, buffer slots per expert.
        num_experts: E.
        balance_loss: scalar fp32 l = E · Σ_i m_i P_i (Eq. 3).
        load: ``(E,)`` int64, the real tokens' assignments of each expert.
        kept_load: ``(E,)`` int64, those kept (its slots 1 to kept_load).
    """

    choice: Tensor
    gate: Tensor
    position: Tensor
    capacity: int
    num_experts: int
    balance_loss: Tensor
    load: Tensor
    kept_load: Tensor

    @property
    def kept(self) -> Tensor:
        """``(k·N,)`` bool, choice-major: False for the dropped and the padding assignments."""
        return (self.position > 0).view(self.choice.shape).t().reshape(-1)

    @property
    def expert(self) -> Tensor:
        """``(k·N,)`` choice-major: the expert of each assignment."""
        return self.choice.t().reshape(-1)

    @property
    def token(self) -> Tensor:
        """``(k·N,)`` choice-major: the row of each assignment."""
        return torch.arange(self.choice.shape[0], device=self.choice.device).repeat(self.choice.shape[1])

    def as_tuple(self) -> tuple:
        """The fields in order (``Routing(*routing.as_tuple())`` rebuilds it): the form in which a
        routing crosses a layer boundary, so that fairseq's activation checkpointing, which sees
        only top-level tensors, carries the gradients of ``gate`` and ``balance_loss``."""
        return tuple(getattr(self, field.name) for field in fields(self))


#: How ``TopKRouter`` counts, fills and orders (module docstring; docs/widenet.md, "Routing").
ROUTINGS = ("released", "ours")
#: How the experts and the router are initialised and activated (docs/widenet.md, "Experts").
EXPERT_FORMS = ("released", "ours")


class TopKRouter(nn.Module):
    """Router f = Linear(d, E) without bias, g(x) = TopK(softmax(f(x) + ε)) (Eq. 2), computed in
    fp32 whatever the input dtype, with a capacity of B slots per expert per routing call.

    Args:
        embed_dim (int): d.
        num_experts (int): E.
        top_k (int): k, experts per token.
        capacity_factor (float): C in training, > 0.
        eval_capacity_factor (float): C at inference; 0 (the default) means no limit, so a
            sentence's translation never depends on the rest of its batch.
        noise (bool): add ε ~ N(0, 1/E²) to the logits in training.
        renormalize (bool): divide the k kept gates by their sum (not in the paper).
        routing (str): one of ``ROUTINGS``. ``released``: B = ⌊C·k·N/E⌋ − 1 usable slots (the
            released code's positions start at 1 and are kept while below ⌊C·k·N/E⌋; at least 1
            here), assignments fill them in token order with both of a token's choices at its place,
            m_i = assignments of expert i / (k·N) (Eq. 4 as its ``load_balanced_loss`` gets it: the
            K-hot mask divided by K); ``ours``: B = ⌈C·k·N/E⌉, every first choice before any second,
            m_i = assignments of expert i / N. N counts the real tokens.
        init (str): one of ``EXPERT_FORMS``: f's weight Xavier-uniform (``released``, Keras'
            Dense default) or nn.Linear's (``ours``).

    Raises:
        ValueError: if E < 1, k is not in [1, E], C <= 0, the eval C < 0 (naming the flag), or the
            routing or init are unknown.
    """

    def __init__(self, embed_dim: int, num_experts: int, top_k: int, capacity_factor: float = 1.2,
                 eval_capacity_factor: float = 0.0, noise: bool = True, renormalize: bool = False,
                 routing: str = "released", init: str = "released"):
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        if capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be > 0, got {capacity_factor}")
        if eval_capacity_factor < 0:
            raise ValueError(f"eval_capacity_factor must be >= 0 (0: no limit), got {eval_capacity_factor}")
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if init not in EXPERT_FORMS:
            raise ValueError(f"init must be one of {', '.join(EXPERT_FORMS)}, got {init!r}")
        self.num_experts, self.top_k = num_experts, top_k
        self.capacity_factor, self.eval_capacity_factor = capacity_factor, eval_capacity_factor
        self.noise, self.renormalize, self.routing = noise, renormalize, routing
        self.weight = nn.Parameter(torch.empty(num_experts, embed_dim))
        if init == "released":
            nn.init.xavier_uniform_(self.weight)
        else:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's init
        # (E, 1) expert ids, compared with the assignments at once; not saved with the model
        self.register_buffer("ids", torch.arange(num_experts)[:, None], persistent=False)
        self._tables = {}  # tables(): (C, device) -> (kept slots, balance scales) by real-token count

    @property
    def released(self) -> bool:
        return self.routing == "released"

    @property
    def factor(self) -> float:
        """C of the current mode (0: no limit)."""
        return self.capacity_factor if self.training else self.eval_capacity_factor

    def capacity(self, num_tokens: int) -> int:
        """B for ``num_tokens`` real tokens, from the shapes alone (no host wait); without a limit,
        ``num_tokens``: no expert gets more than one assignment per token, so every assignment fits
        (the expert buffers then hold E·N slots, E/k times the assignments)."""
        if self.factor <= 0:
            return max(num_tokens, 1)
        slots = self.factor * self.top_k * num_tokens / self.num_experts
        return max(math.floor(slots) - 1 if self.released else math.ceil(slots), 1)

    def tables(self, rows: int, device) -> tuple:
        """For every count n of real tokens from 0 to at least ``rows``, on ``device``: the last 1-based
        slot kept (``capacity`` of n in the same float64 arithmetic, as a bound on an integer slot, so
        ⌊s⌋ − 1 is s − 1; None without a limit) and E / (share · max(n, 1)²), the balance loss's
        scale (``balance_loss``). Computed once per device, mode and largest batch: a call then reads
        its values with one ``take`` on the device, no host wait."""
        key = (self.factor, str(device))
        if key not in self._tables or self._tables[key][1].numel() <= rows:
            n = torch.arange(rows + 1, device=device, dtype=torch.float64)
            slots = n * (self.factor * self.top_k) / self.num_experts
            limits = (slots - 1 if self.released else slots.ceil()).clamp_min(1) if self.factor > 0 else None
            scales = (self.num_experts / (self.top_k if self.released else 1)) / n.clamp_min(1).square()
            self._tables[key] = limits, scales.float()
        return self._tables[key]

    def forward(self, x: Tensor, pad: Optional[Tensor] = None) -> Routing:
        """x: ``(N, d)`` tokens, in the order in which they compete for capacity; ``pad`` ``(N,)``
        bool, True at padding (None: none) -> ``Routing``.

        Padding rows are routed but never kept nor counted, and no count is read on the host: the
        buffers hold B slots for all N rows, of which the first B of the real tokens' count per
        expert are used, so the same assignments are kept as without the padding rows.
        """
        with torch.autocast(x.device.type, enabled=False):  # autocast would run the product in half
            gate, balance_loss, choice, position, load, kept_load = Gate.apply(x, self.weight, self, pad)
        return Routing(choice, gate, position, self.capacity(x.shape[0]), self.num_experts, balance_loss, load,
                       kept_load)

    def route(self, probs: Tensor, padding: Optional[Tensor], real: Optional[Tensor]) -> tuple:
        """The routing decision from the router probabilities ``probs`` ``(N, E)`` and the ``(N, 1)``
        masks ``padding`` and ``real`` (None: no padding): (gate, choice, position, load, kept_load)
        as ``Routing`` has them, and the balance loss's gradient with respect to each expert's
        probability of a real token, ``(E,)``."""
        E, k, N = self.num_experts, self.top_k, probs.shape[0]
        gate, choice = probs.topk(k, dim=-1)  # (N, k)
        # each expert's running count over the assignments in filling order: token-major for
        # released (a token's choices go to different experts, so each expert sees the tokens in
        # order), choice-major for ours; a padding row's choices are expert E, which no id matches
        order = choice if padding is None else choice.masked_fill(padding, E)
        order = order.reshape(-1) if self.released else order.t().reshape(-1)
        chosen = order == self.ids  # (E, k·N); expert-major, so that the count scans the contiguous dim
        count = chosen.cumsum(dim=1)
        load = chosen.sum(dim=1)
        capacity = self.capacity(N)  # B for all N rows: an upper bound
        limits, scales = self.tables(N, probs.device)
        num_real = torch.full((), N, device=probs.device) if real is None else real.sum()
        kept = chosen if limits is None else chosen & (count <= limits.take(num_real))
        position = (count.add(self.ids, alpha=capacity) * kept).sum(dim=0)  # 1-based buffer row, 0: not kept
        if not self.released:  # to token-major
            position = position.view(k, N).t().reshape(-1)
        # Eqs. 3-5: l = E · Σ_i m_i P_i = E / (share · n²) · Σ_i load_i · Σ_t p_i(t), m_i the share of
        # the tokens (ours) or of the assignments (released) that expert i got, P_i the mean router
        # probability of expert i over the same n real tokens
        direction = load * scales.take(num_real)
        return gate, choice, position, load, kept.sum(dim=1), direction


class Gate(torch.autograd.Function):
    """The router's differentiable outputs, the gates g(x) (Eq. 2) and the balance loss l (Eq. 3),
    with their gradient written out (fewer operators than autograd's): the top-k values' gradient
    scattered back, l's per-expert direction added on the real rows, through the softmax to the
    logits, two products. ``Gate.apply(x, weight, router, pad)`` -> (gate ``(N, k)``, balance loss, and the
    non-differentiable choice, position, load and kept load of ``TopKRouter.route``)."""

    @staticmethod
    def forward(ctx, x, weight, router, pad):
        logits = x.float().mm(weight.float().t())  # (N, E), fp32
        if router.training and router.noise:
            logits = logits.add(torch.randn_like(logits), alpha=1 / router.num_experts)
        probs = logits.softmax(dim=-1)
        padding = None if pad is None else pad[:, None]
        real = None if pad is None else ~padding
        top, choice, position, load, kept_load, direction = router.route(probs, padding, real)
        balance_loss = (probs if real is None else probs * real).sum(dim=0) @ direction
        total = top.sum(dim=-1, keepdim=True) if router.renormalize else None
        # saved: the inputs and intermediates, never an output (autograd would add two operators)
        ctx.save_for_backward(x, weight, probs, choice, direction, real, top if router.renormalize else None, total)
        ctx.set_materialize_grads(False)  # no zeros for the outputs without a gradient
        ctx.mark_non_differentiable(choice, position, load, kept_load)
        return top / total if router.renormalize else top, balance_loss, choice, position, load, kept_load

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_gate, grad_balance, *_):
        x, weight, probs, choice, direction, real, top, total = ctx.saved_tensors
        grad = torch.zeros_like(probs)
        if grad_gate is not None:
            if total is not None:  # through g / Σg
                grad_gate = (grad_gate - (grad_gate * top / total).sum(dim=-1, keepdim=True)) / total
            grad.scatter_(1, choice, grad_gate)
        if grad_balance is not None:  # l's, on the real rows alone
            step = direction * grad_balance
            grad = grad.add_(step) if real is None else grad.addcmul_(real, step)
        grad = torch._softmax_backward_data(grad, probs, -1, probs.dtype)
        grad_x = grad.mm(weight.float()).to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = grad.t().mm(x.float()).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight, None, None


class ExpertForm:
    """The two-layer FFN of one expert (e_i of Eq. 1) in one of ``EXPERT_FORMS``, for a module
    with ``fc1`` and ``fc2``. ``released``, as the authors' released code builds each expert
    (``widenet/model_configs.py``, ``mlp``): Dense -> activation -> Dropout -> Dense -> activation ->
    Dropout, so each expert's output is dropped before the gated sum and the block adds it undropped
    (``drops_output``); ``ours``: fairseq's FFN, the activation and its dropout after the first
    layer only, the block's dropout after the combine."""

    def init_form(self, form: str, activation_fn: str, activation_dropout: float, dropout: float):
        """The form's activation (one of ``ACTIVATIONS``) and dropouts, probabilities in [0, 1):
        ``activation_dropout`` after the first layer, ``dropout`` on the output (``released`` only).

        Raises:
            ValueError: for an activation not in ``ACTIVATIONS``, naming them."""
        if activation_fn not in ACTIVATIONS:
            raise ValueError(f"the experts' activation must be one of {', '.join(ACTIVATIONS)}, got {activation_fn!r}")
        self.activation_name = activation_fn
        self.activation_fn = ACTIVATIONS[activation_fn][0]
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=type(self).__name__)
        released = form == "released"
        self.output_dropout_module = FairseqDropout(dropout, module_name=type(self).__name__) if released else None

    @property
    def drops_output(self) -> bool:
        """Whether the experts apply the sub-layer's output dropout themselves (``released``)."""
        return self.output_dropout_module is not None

    def ffn(self, x: Tensor) -> Tensor:
        """The expert FFN of x by autograd (``Move`` writes the experts' gradient out)."""
        out = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))
        if self.output_dropout_module is None:
            return out
        return self.output_dropout_module(self.activation_fn(out))


def _gelu(x: Tensor) -> Tensor:
    return F.gelu(x.float()).type_as(x)  # fairseq's gelu: in fp32 whatever the input


def _tanh_gelu(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


_TANH_GELU = (_tanh_gelu, lambda grad, x, y: torch.ops.aten.gelu_backward(grad, x, approximate="tanh"))


#: The experts' activations, the names fairseq's ``get_activation_fn`` knows: name -> (the function,
#: its gradient from the incoming gradient, the input and the output), one ATen operator each in fp32
#: but ``relu_squared``.
#: ``gelu_accurate`` and ``gelu_fast`` are the tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x +
#: 0.044715·x³))), the released code's ``gelu``, as torch's own kernel (fairseq's runs seven
#: elementwise operators); ``gelu`` computes in fp32 as fairseq's does.
ACTIVATIONS = {
    "relu": (F.relu, lambda grad, x, y: torch.ops.aten.threshold_backward(grad, y, 0)),
    "gelu": (_gelu, lambda grad, x, y: torch.ops.aten.gelu_backward(grad.float(), x.float()).type_as(grad)),
    "gelu_accurate": _TANH_GELU,
    "gelu_fast": _TANH_GELU,
    "tanh": (torch.tanh, lambda grad, x, y: torch.ops.aten.tanh_backward(grad, y)),
    "linear": (lambda x: x, lambda grad, x, y: grad),
    "relu_squared": (lambda x: F.relu(x).pow(2), lambda grad, x, y: grad * 2 * F.relu(x)),
    "swish": (F.silu, lambda grad, x, y: torch.ops.aten.silu_backward(grad, x)),
}


class Experts(nn.Module, ExpertForm):
    """E expert FFNs, d -> d_ffn -> d each (e(·)_i of Eq. 1), as two batched matmuls over all E
    experts: every expert parameter is in the graph every step (an expert that got no token gets
    a zero gradient, so DDP never sees an unused parameter).

    ``form`` (``EXPERT_FORMS``, ``ExpertForm``): ``released`` as the authors' released code
    builds each expert (Xavier-uniform kernels, biases from N(0, (1e-6)²), the activation and a
    dropout of ``dropout`` after both layers, ``activation_dropout`` after the first); ``ours``: the
    activation and ``activation_dropout`` after the first layer only, nn.Linear's initialisation
    (``dropout`` unused: the block applies it after the combine).

    Shapes: input ``(E, B, d)`` (B = capacity slots per expert); output ``(E, B, d)``.
    """

    def __init__(self, num_experts: int, embed_dim: int, ffn_dim: int, activation_fn: str = "relu",
                 activation_dropout: float = 0.0, form: str = "released", dropout: float = 0.0):
        super().__init__()
        released = form == "released"
        self.fc1 = BatchedLinear(num_experts, embed_dim, ffn_dim, **released_init(released))
        self.fc2 = BatchedLinear(num_experts, ffn_dim, embed_dim, **released_init(released))
        self.init_form(form, activation_fn, activation_dropout, dropout)

    def forward(self, buffer: Tensor) -> Tensor:
        return self.ffn(buffer)


#: The released code's expert biases: Keras' RandomNormal(stddev=1e-6).
RELEASED_BIAS_STD = 1e-6


def released_init(released: bool) -> dict:
    """``BatchedLinear``'s arguments for the released code's Dense layers (Xavier-uniform
    kernel, N(0, (1e-6)²) bias), or none (nn.Linear's initialisation)."""
    return {"xavier_gain": 1.0, "bias_std": RELEASED_BIAS_STD} if released else {}


class MoELayer(nn.Module):
    """Mixture of experts (Eq. 1): a ``TopKRouter`` in front of ``Experts``.

    Dispatch and combine without a host wait: every row of the batch is routed (padding never
    kept), the kept assignments copied into capacity-sized expert buffers (``(E, B, d)``) with one
    ``index_copy``, the dropped ones to a spare row, and the gated expert outputs gathered back
    with one ``index_select`` (the spare row read as zeros) and summed over each token's k choices
    (``Move``); the router's gates and balance loss by ``Gate``. Both write their gradients out.

    Router and experts are separate modules so that blocks can share the experts with or without
    the router (WideNet and its per-block-router variant).

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

    @property
    def drops_output(self) -> bool:
        """Whether the experts drop their outputs themselves (``ExpertForm.drops_output``)."""
        return self.experts.drops_output

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, routing: Optional[Routing] = None):
        T, B, d = x.shape
        # the order in which tokens compete for capacity: batch-major for the released routing (its
        # (batch, tokens, d) input flattened), fairseq's T x B order for ours
        batch_major = self.router.released
        flat = (x.transpose(0, 1) if batch_major else x).reshape(T * B, d)
        if routing is None:
            pad = None if padding_mask is None else (padding_mask if batch_major else padding_mask.t()).reshape(-1)
            routing = self.router(flat, pad)
        y = self.move(flat, routing)
        return (y.view(B, T, d).transpose(0, 1) if batch_major else y.view(T, B, d)), routing

    def move(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Dispatch, experts and combine (``Move``): ``(N, d)`` -> ``(N, d)``, in the experts' dtype
        (half under autocast)."""
        fc1, fc2 = self.experts.fc1, self.experts.fc2
        return Move.apply(tokens, routing.gate, routing.position, routing.capacity, self.experts,
                          fc1.weight, fc1.bias, fc2.weight, fc2.bias)


def dropped(module: FairseqDropout, x: Tensor) -> tuple:
    """``module`` applied to x with ``F.dropout``'s own kernels and random numbers (on the CPU a
    Bernoulli draw scaled by 1 / (1 - p), elsewhere ``native_dropout``) -> (output, what its
    gradient needs: the scaled draw or the kept mask; None where it drops nothing)."""
    if not (module.p > 0 and (module.training or module.apply_during_inference)):
        return x, None
    if x.device.type == "cpu":  # native_dropout's gradient converts its mask here, a copy of every element
        scaled = torch.empty_like(x).bernoulli_(1 - module.p).div_(1 - module.p)
        return x * scaled, scaled
    return torch.native_dropout(x, module.p, True)


def undropped(module: FairseqDropout, grad: Tensor, kept: Optional[Tensor]) -> Tensor:
    """The gradient through ``dropped``."""
    if kept is None:
        return grad
    if kept.dtype == torch.bool:
        return torch.ops.aten.native_dropout_backward(grad, kept, 1 / (1 - module.p))
    return grad * kept


def to_slots(rows: Tensor, position: Tensor, slots: int) -> Tensor:
    """``rows`` ``(N·k, d)`` copied to their ``position`` in a zeroed ``(slots + 1, d)`` buffer (row 0,
    the spare, takes every unkept one) -> the ``slots`` rows past the spare."""
    return rows.new_zeros(slots + 1, rows.shape[1]).index_copy_(0, position, rows)[1:]


def from_slots(buffer: Tensor, position: Tensor) -> Tensor:
    """The rows of ``buffer`` ``(slots, d)`` at ``position`` ``(N·k,)``, 0 reading a zero row."""
    return F.pad(buffer, (0, 0, 1, 0)).index_select(0, position)


class Move(torch.autograd.Function):
    """The kept assignments copied into capacity-sized expert buffers (one ``index_copy``, the
    dropped and padding ones to a spare row), the E expert FFNs as two batched products, the outputs
    gathered back (one ``index_select``, the spare row read as zeros) and summed with their gates,
    with the gradient written out (autograd's runs a fifth more operators, and a scatter-add where
    this copies). In autocast's dtype where it is on, as autocast runs ``bmm``; the weights' and
    tokens' gradients in their own dtypes.

    ``Move.apply(tokens (N, d), gate (N, k), position (N·k,), capacity, experts, w1, b1, w2, b2)``
    -> ``(N, d)``, position and capacity as ``Routing`` has them, w1 ``(E, d, d_ffn)``, b1 ``(E,
    d_ffn)``, w2 ``(E, d_ffn, d)``, b2 ``(E, d)`` the parameters of ``experts`` (``Experts``)."""

    @staticmethod
    def forward(ctx, tokens, gate, position, capacity, experts, w1, b1, w2, b2):
        (N, d), k, E = tokens.shape, gate.shape[1], w1.shape[0]
        device = tokens.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tokens.dtype
        activation_fn = experts.activation_fn
        ctx.experts, ctx.dtypes = experts, (tokens.dtype, gate.dtype, w1.dtype, b1.dtype, w2.dtype, b2.dtype)
        with torch.autocast(device, enabled=False):
            x = tokens.to(dtype)
            inputs = to_slots(x.repeat(1, k).view(N * k, d), position, E * capacity).view(E, capacity, d)
            w1, w2 = w1.to(dtype), w2.to(dtype)
            hidden = torch.baddbmm(b1.to(dtype)[:, None], inputs, w1)
            activated = activation_fn(hidden)
            inner, inner_mask = dropped(experts.activation_dropout_module, activated)
            out = torch.baddbmm(b2.to(dtype)[:, None], inner, w2)
            last, outer, outer_mask = out, None, None
            if experts.output_dropout_module is not None:  # released: the activation and dropout again
                outer = activation_fn(out)
                last, outer_mask = dropped(experts.output_dropout_module, outer)
            rows = from_slots(last.view(E * capacity, d), position).view(N, k, d)
            weights = gate.to(dtype)[..., None]
            y = (rows * weights).sum(dim=1)
        ctx.save_for_backward(position, inputs, hidden, activated, inner_mask, inner, w1, w2, out, outer, outer_mask,
                              rows, weights)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        (position, inputs, hidden, activated, inner_mask, inner, w1, w2, out, outer, outer_mask, rows,
         weights) = ctx.saved_tensors
        experts, (tokens_dtype, gate_dtype, w1_dtype, b1_dtype, w2_dtype, b2_dtype) = ctx.experts, ctx.dtypes
        gradient = ACTIVATIONS[experts.activation_name][1]
        (E, capacity, d), (N, k, _) = inputs.shape, rows.shape
        grad_y = grad_y.to(rows.dtype)[:, None]
        grad_gate = (rows * grad_y).sum(dim=-1).to(gate_dtype)
        grad_rows = (grad_y * weights).view(N * k, d)
        grad = to_slots(grad_rows, position, E * capacity).view(E, capacity, d)
        if outer is not None:
            grad = gradient(undropped(experts.output_dropout_module, grad, outer_mask), out, outer)
        grad_b2, grad_w2 = grad.sum(dim=1), inner.transpose(1, 2).bmm(grad)
        grad = grad.bmm(w2.transpose(1, 2))
        grad = gradient(undropped(experts.activation_dropout_module, grad, inner_mask), hidden, activated)
        grad_b1, grad_w1 = grad.sum(dim=1), inputs.transpose(1, 2).bmm(grad)
        grad = grad.bmm(w1.transpose(1, 2)).view(E * capacity, d)
        grad_tokens = from_slots(grad, position).view(N, k, d).sum(dim=1)
        return (grad_tokens.to(tokens_dtype), grad_gate, None, None, None, grad_w1.to(w1_dtype), grad_b1.to(b1_dtype),
                grad_w2.to(w2_dtype), grad_b2.to(b2_dtype))
