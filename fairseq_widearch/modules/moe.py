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
import warnings
from dataclasses import dataclass, fields
from functools import partial
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
        kept_load: ``(E,)`` int64, the kept assignments of each expert (its slots 0 to kept_load - 1).
    """

    expert: Tensor
    token: Tensor
    gate: Tensor
    slot: Tensor
    kept: Tensor
    capacity: int
    num_experts: int
    balance_loss: Tensor
    kept_load: Tensor

    def kept_gate(self, dtype: torch.dtype) -> Tensor:
        """``(k·N,)`` gate values in ``dtype``, 0 for the dropped assignments."""
        return self.gate.masked_fill(~self.kept, 0.0).to(dtype)

    def as_tuple(self) -> tuple:
        """The fields in order (``Routing(*routing.as_tuple())`` rebuilds it): the form in which a
        routing crosses a layer boundary, so that fairseq's activation checkpointing, which sees
        only top-level tensors, carries the gradients of ``gate`` and ``balance_loss``."""
        return tuple(getattr(self, field.name) for field in fields(self))


#: How ``TopKRouter`` counts, fills and orders (module docstring; docs/widenet.md, "Routing").
ROUTINGS = ("released", "ours")
#: How the experts and the router are initialised and activated (docs/widenet.md, "Experts").
EXPERT_FORMS = ("released", "ours")
#: How ``TopKRouter`` numbers each expert's assignments (the same slots either way): a running
#: count over an (E, k·N) one-hot mask, or a stable sort of the expert ids in filling order with a
#: count and a cumulative sum (MegaBlocks', torchtitan's).
SLOTS = ("count", "sort")


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
        slots (str): one of ``SLOTS``, how the slots are numbered (the same slots either way).

    Raises:
        ValueError: if E < 1, k is not in [1, E], C <= 0, the eval C < 0 (naming the flag), or the
            routing, init or slots are unknown.
    """

    def __init__(self, embed_dim: int, num_experts: int, top_k: int, capacity_factor: float = 1.2,
                 eval_capacity_factor: float = 0.0, noise: bool = True, renormalize: bool = False,
                 routing: str = "released", init: str = "released", slots: str = "count"):
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"--moe-experts must be >= 1, got {num_experts}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"--moe-top-k must be in [1, --moe-experts={num_experts}], got {top_k}")
        if capacity_factor <= 0:
            raise ValueError(f"--moe-capacity-factor must be > 0, got {capacity_factor}")
        if eval_capacity_factor < 0:
            raise ValueError(f"--moe-eval-capacity-factor must be >= 0 (0: no limit), got {eval_capacity_factor}")
        if routing not in ROUTINGS:
            raise ValueError(f"--moe-routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if init not in EXPERT_FORMS:
            raise ValueError(f"--widenet-experts must be one of {', '.join(EXPERT_FORMS)}, got {init!r}")
        if slots not in SLOTS:
            raise ValueError(f"--moe-slots must be one of {', '.join(SLOTS)}, got {slots!r}")
        self.slots = slots
        self.num_experts, self.top_k = num_experts, top_k
        self.capacity_factor, self.eval_capacity_factor = capacity_factor, eval_capacity_factor
        self.noise, self.renormalize, self.routing = noise, renormalize, routing
        self.weight = nn.Parameter(torch.empty(num_experts, embed_dim))
        if init == "released":
            nn.init.xavier_uniform_(self.weight)
        else:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's init

    @property
    def released(self) -> bool:
        return self.routing == "released"

    def capacity(self, num_tokens: int) -> int:
        """B for this call, from the shapes alone (no host wait); without a limit, ``num_tokens``: no
        expert gets more than one assignment per token, so every assignment fits (the expert buffers
        of the capacity dispatches then hold E·N slots, E/k times the assignments)."""
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if factor <= 0:
            return max(num_tokens, 1)
        slots = factor * self.top_k * num_tokens / self.num_experts
        return max(math.floor(slots) - 1 if self.released else math.ceil(slots), 1)

    def device_capacity(self, num_tokens: Tensor) -> Optional[Tensor]:
        """B of ``capacity`` as a 0-d tensor computed on the device from a 0-d count, without a
        host wait (same float64 arithmetic, so the same B); None without a limit."""
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if factor <= 0:
            return None
        slots = num_tokens.double() * (factor * self.top_k) / self.num_experts
        return (slots.floor() - 1 if self.released else slots.ceil()).clamp_min(1)

    def forward(self, x: Tensor, real: Optional[Tensor] = None) -> Routing:
        """x: ``(N, d)`` tokens, in the order in which they compete for capacity -> ``Routing``.

        Without ``real``, every row of x is a real token. With ``real`` (``(N,)`` bool, False at
        padding), padding rows are routed but never kept nor counted, and no count is read on the
        host: the buffers hold B slots for all N rows, of which the first B of the real tokens' count
        per expert are used, so the same assignments are kept as without the padding rows.
        """
        E, k, N = self.num_experts, self.top_k, x.shape[0]
        logits = F.linear(x.float(), self.weight.float())  # (N, E), fp32
        if self.training and self.noise:
            logits = logits + torch.randn_like(logits) / E
        probs = logits.softmax(dim=-1)
        gate, expert = probs.topk(k, dim=-1)  # (N, k)
        if self.renormalize:
            gate = gate / gate.sum(dim=-1, keepdim=True)
        slot, loads = self.fill(expert, real)
        # Routing's assignments are choice-major (all first choices, then all second choices, ...)
        expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)
        token = torch.arange(N, device=x.device).repeat(k)
        # Eqs. 3-5: m_i = share of the tokens (ours) or of the assignments (released) that expert i
        # got (not differentiable), P_i = mean router probability of expert i over the same tokens.
        share = k if self.released else 1
        if real is None:
            capacity = self.capacity(N)
            kept, kept_load = slot < capacity, loads.clamp_max(capacity)
            m = loads.float() / max(N * share, 1)
            balance_loss = E * (m * probs.mean(dim=0)).sum() if N > 0 else probs.sum() * 0
        else:
            num_real = real.sum()
            limit = self.device_capacity(num_real)
            capacity = self.capacity(N)  # B for all N rows: an upper bound
            kept = (slot >= 0) & (slot < (limit if limit is not None else capacity))
            kept_load = loads.clamp_max(capacity) if limit is None else torch.minimum(loads, limit.long())
            count = num_real.clamp_min(1).float()
            m = loads.float() / (count * share)
            balance_loss = E * (m * (probs * real[:, None]).sum(dim=0) / count).sum()
        return Routing(expert, token, gate, slot, kept, capacity, E, balance_loss, kept_load)

    def fill(self, expert: Tensor, real: Optional[Tensor]) -> tuple:
        """Each assignment's position in its expert's buffer, choice-major ``(k·N,)``, -1 for padding,
        and the assignments per expert ``(E,)``, from the ``(N, k)`` choices: one running count per
        expert over the assignments in filling order, token-major for ``released`` (a token's
        choices go to different experts, so each expert sees the tokens in order), choice-major
        for ``ours``."""
        N, k = expert.shape
        order = expert.reshape(-1) if self.released else expert.t().reshape(-1)
        real_order = None
        if real is not None:
            real_order = real.repeat_interleave(k) if self.released else real.repeat(k)
        slot, loads = (self.sorted_slots if self.slots == "sort" else self.counted_slots)(order, real_order)
        if self.released:
            slot = slot.view(N, k).t().reshape(-1)
        return slot, loads

    def counted_slots(self, order: Tensor, real_order: Optional[Tensor]) -> tuple:
        """Slots ``(k·N,)`` in filling order (-1 for padding) and loads ``(E,)`` by a running count."""
        E = self.num_experts
        # (E, k·N), expert-major: each expert's running count is then a scan along the contiguous
        # last dim (the scan down the first dim of a (k·N, E) one-hot took 2.7 of the layer's ~5 ms
        # on an H100 at 8,192 tokens, docs/records/gpu_runs.md); F.one_hot would check its input on the host
        chosen = torch.arange(E, device=order.device)[:, None] == order[None, :]
        if real_order is not None:
            chosen = chosen & real_order[None, :]  # padding takes no slot and adds no load
        slot = chosen.cumsum(dim=1).gather(0, order[None, :]).squeeze(0) - 1
        if real_order is not None:
            slot = slot.masked_fill(~real_order, -1)
        return slot, chosen.sum(dim=1)

    def sorted_slots(self, order: Tensor, real_order: Optional[Tensor]) -> tuple:
        """``counted_slots`` by a stable sort of the expert ids (padding as expert E, after every
        real one): an assignment's slot is its rank in its expert's run of the sorted ids, so the
        filling order decides it as the running count does; O(k·N) memory instead of O(E·k·N)."""
        E, A = self.num_experts, order.numel()
        key = order if real_order is None else order.masked_fill(~real_order, E)
        sorted_key, perm = torch.sort(key, stable=True)
        first = runs(sorted_key, E)
        rank = torch.arange(A, device=order.device) - first.index_select(0, sorted_key)
        slot = torch.empty_like(rank).scatter_(0, perm, rank)
        if real_order is not None:
            slot = slot.masked_fill(~real_order, -1)
        return slot, first[1:] - first[:-1]


def runs(sorted_ids: Tensor, n: int) -> Tensor:
    """``(n + 1,)`` the first position of each id 0..n in ``sorted_ids`` (ascending, ids in [0, n]):
    a count and a cumulative sum by binary search, without atomic adds or a host wait (bincount
    would wait, scatter_add adds atomically)."""
    return torch.searchsorted(sorted_ids, torch.arange(n + 1, device=sorted_ids.device, dtype=sorted_ids.dtype))


class ExpertForm:
    """The two-layer FFN of one expert (e_i of Eq. 1) in one of ``EXPERT_FORMS``, for a module
    with ``fc1`` and ``fc2``. ``released``, as the authors' released code builds each expert
    (``widenet/model_configs.py``, ``mlp``): Dense -> activation -> Dropout -> Dense -> activation ->
    Dropout, so each expert's output is dropped before the gated sum and the block adds it undropped
    (``drops_output``); ``ours``: fairseq's FFN, the activation and its dropout after the first
    layer only, the block's dropout after the combine."""

    def init_form(self, form: str, activation_fn: str, activation_dropout: float, dropout: float):
        """The form's activation (``activation``) and dropouts, probabilities in [0, 1):
        ``activation_dropout`` after the first layer, ``dropout`` on the output (``released`` only)."""
        self.activation_fn = activation(activation_fn)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=type(self).__name__)
        released = form == "released"
        self.output_dropout_module = FairseqDropout(dropout, module_name=type(self).__name__) if released else None

    @property
    def drops_output(self) -> bool:
        """Whether the experts apply the sub-layer's output dropout themselves (``released``)."""
        return self.output_dropout_module is not None

    def ffn(self, x: Tensor, linear=None) -> Tensor:
        """The expert FFN of x; ``linear(layer, h)`` applies ``fc1``/``fc2`` (default: ``layer(h)``)."""
        linear = linear or (lambda layer, h: layer(h))
        out = linear(self.fc2, self.activation_dropout_module(self.activation_fn(linear(self.fc1, x))))
        if self.output_dropout_module is None:
            return out
        return self.output_dropout_module(self.activation_fn(out))


def activation(name: str):
    """fairseq's activation ``name``, but ``gelu_accurate`` (the tanh approximation
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the released code's ``gelu``) as torch's own kernel,
    the same formula: fairseq's sets an attribute on itself at its first call, which breaks
    ``torch.compile``'s graph (``--moe-compile``) there, and runs seven elementwise operators."""
    if name == "gelu_accurate":
        return partial(F.gelu, approximate="tanh")
    return utils.get_activation_fn(name)


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

    def grouped(self, rows: Tensor, offsets: Tensor, group: Tensor) -> Tensor:
        """The experts on rows sorted by expert: ``rows`` ``(M, d)``, expert i's rows ending at
        ``offsets[i]`` (``(E,)`` int32, the last below M), ``group`` ``(M,)`` each row's expert, E past
        the last group -> ``(M, d)``; the rows past ``offsets[-1]`` are left undefined
        (``BatchedLinear.grouped``)."""
        member = group[:, None] == torch.arange(self.fc1.weight.shape[0], device=group.device)  # (M, E)
        return self.ffn(rows, lambda layer, h: layer.grouped(h, offsets, member))


#: The released code's expert biases: Keras' RandomNormal(stddev=1e-6).
RELEASED_BIAS_STD = 1e-6


def released_init(released: bool) -> dict:
    """``BatchedLinear``'s arguments for the released code's Dense layers (Xavier-uniform
    kernel, N(0, (1e-6)²) bias), or none (nn.Linear's initialisation)."""
    return {"xavier_gain": 1.0, "bias_std": RELEASED_BIAS_STD} if released else {}


class GatherRows(torch.autograd.Function):
    """``cat(x, 0)[index]`` whose backward is another gather, ``cat(grad, 0)[inverse]`` summed over
    ``fold`` consecutive blocks, instead of index_select's scatter-add: no atomic adds, and no row
    written twice in either pass (the row past the end of x is the zero row, read as often as needed).

    ``GatherRows.apply(x, index, inverse, fold, zero_row=True)`` -> ``(m, d)``, with x ``(n, d)``;
    index ``(m,)`` rows of x, n meaning a zero row; inverse ``(fold·n,)``, for each row of x (``fold``
    copies of it, block-major) the output row it went to, m meaning none, every output row appearing
    at most once; fold the copies of each row of x in the output (k for the MoE dispatch, 1 for a
    permutation). ``zero_row=False`` where index never reaches n: ``x[index]``, x not copied first.
    """

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor, fold: int, zero_row: bool = True) -> Tensor:
        ctx.save_for_backward(inverse)
        ctx.fold = fold
        return (torch.cat([x, x.new_zeros(1, x.shape[1])]) if zero_row else x).index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        rows = torch.cat([grad, grad.new_zeros(1, grad.shape[1])]).index_select(0, inverse)
        return rows.view(ctx.fold, -1, grad.shape[1]).sum(dim=0), None, None, None, None


#: How ``MoELayer`` moves tokens into the expert buffers and back (docs/widenet.md, "Dispatch").
DISPATCH = ("index", "padded", "permute", "grouped")


class MoELayer(nn.Module):
    """Mixture of experts (Eq. 1): a ``TopKRouter`` in front of ``Experts``.

    Dispatch and combine (``dispatch``, the same outputs and gradients whichever is chosen):

    * ``index``: the rows of the real tokens found with ``nonzero`` (a host wait: their number N
      sets the buffers' capacity B), the kept assignments copied into an ``(E, B, d)`` buffer with one
      ``index_copy`` and the gated expert outputs summed back per token with one ``index_add``;
    * ``padded``: the same copies over all T·B rows, padding routed but never kept (no host wait:
      B is sized for T·B rows, the capacity limit of the real tokens applied on the device);
    * ``permute``: as ``padded``, but tokens move by gathers whose backward is a gather too
      (``GatherRows``; MegaBlocks' and ScatterMoE's permutation by expert): no atomic adds;
    * ``grouped``: no capacity-sized buffers: the kept assignments sorted by expert, the dropped
      ones after the last group, and each expert layer one grouped matrix product over all experts
      (torch's ``F.grouped_mm``).

    Router and experts are separate modules so that blocks can share the experts with or without
    the router (WideNet and its per-block-router variant).

    With ``compiled``, each call that routes runs routing, dispatch, experts and combine as one
    region compiled by ``torch.compile`` with dynamic shapes (``route_and_move``), so that
    fairseq's varying batch shapes reuse one graph; the same outputs and gradients (within fp32
    rounding; on the default backend, router noise and dropout come from the compiler's random
    numbers, unless ``torch._inductor.config.fallback_random``).

    Args:
        router (TopKRouter): E, K and the capacity factors.
        experts (Experts): E experts.
        dispatch (str): one of ``DISPATCH``.
        compiled (bool): route and move in one compiled region; with ``padded`` only (``index``
            waits for the host, ``permute``'s autograd function and ``grouped``'s product, which
            traces in bf16 only, do not compile with dynamic shapes in this torch).

    Raises:
        ValueError: if the router and the experts disagree on E, ``dispatch`` is unknown, or
            ``compiled`` goes with another dispatch than ``padded``.
        RuntimeError: for ``grouped`` under a torch without ``F.grouped_mm``, naming the release.

    Shapes:
        ``forward(x, padding_mask=None, routing=None)``: x ``(T, B, d)``, padding_mask ``(B, T)``
        True at padding -> ``(y (T, B, d), routing)``; padding positions of y are 0. Passing a
        ``routing`` reuses another call's decision (routing groups) instead of routing again.
    """

    def __init__(self, router: TopKRouter, experts: Experts, dispatch: str = "padded", compiled: bool = False):
        super().__init__()
        if experts.fc1.weight.shape[0] != router.num_experts:
            raise ValueError(f"router has {router.num_experts} experts, Experts has {experts.fc1.weight.shape[0]}")
        if dispatch not in DISPATCH:
            raise ValueError(f"--moe-dispatch must be one of {', '.join(DISPATCH)}, got {dispatch!r}")
        if compiled and dispatch != "padded":
            raise ValueError(f"--moe-compile needs --moe-dispatch padded, got {dispatch}")
        if dispatch == "grouped" and not hasattr(F, "grouped_mm"):
            raise RuntimeError(f"--moe-dispatch grouped needs torch.nn.functional.grouped_mm, which torch "
                               f"{torch.__version__} lacks (torch 2.11, the lowest release this package has run with, has it)")
        self.router, self.experts, self.dispatch, self.compiled = router, experts, dispatch, compiled

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
        pad = None if padding_mask is None else (padding_mask if batch_major else padding_mask.t()).reshape(-1)
        if self.dispatch == "index":
            y, routing = self.index_dispatch(flat, pad, routing)
        else:
            if routing is None and self.compiled:
                y, fields = compiled_region()(self, flat, pad)
                routing = Routing(*fields)
            else:
                if routing is None:
                    routing = self.router(flat, None if pad is None else ~pad)
                y = self.move(flat, routing)
        return (y.view(B, T, d).transpose(0, 1) if batch_major else y.view(T, B, d)), routing

    def move(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Dispatch, experts and combine of the no-wait dispatches: ``(N, d)`` -> ``(N, d)``;
        ``grouped`` where torch's grouped product is fast (``fast_grouped_mm``), else ``padded``."""
        dispatch = self.dispatch
        if dispatch == "grouped" and not fast_grouped_mm(tokens, self.experts.fc1.weight.shape[-1]):
            dispatch = "padded"
        return {"permute": self.permuted, "grouped": self.grouped}.get(dispatch, self.copied)(tokens, routing)

    def index_dispatch(self, flat: Tensor, pad: Optional[Tensor], routing: Optional[Routing]):
        # flattened batch -> rows of the non-padding tokens (``pad``: (N,) True at padding)
        rows = None
        if pad is not None:
            # the one wait for the GPU per call: the number of real tokens N sets the buffers' shape
            # (capacity B); an "any padding?" check first would be a second
            rows = (~pad).nonzero().squeeze(1)
        tokens = flat.index_select(0, rows) if rows is not None else flat
        if routing is None:
            routing = self.router(tokens)
        y = self.copied(tokens, routing)
        if rows is not None:
            y = y.new_zeros(flat.shape).index_copy(0, rows, y)  # the experts' dtype (half under autocast)
        return y, routing

    def copied(self, tokens: Tensor, routing: Routing) -> Tensor:
        """``index_copy`` into the buffers, ``index_add`` back: ``(N, d)`` -> ``(N, d)``."""
        E, cap, d = routing.num_experts, routing.capacity, tokens.shape[1]
        # Dropped assignments are written to a spare row past the E x B buffer and read back with a
        # gate of 0, rather than filtered out: filtering (nonzero) waits for the GPU on every call.
        where = torch.where(routing.kept, routing.expert * cap + routing.slot, E * cap)  # flat buffer position
        buffer = tokens.new_zeros(E * cap + 1, d).index_copy(0, where, tokens.index_select(0, routing.token))
        out = self.experts(buffer[:-1].view(E, cap, d)).view(E * cap, d)
        weighted = out.index_select(0, where.clamp_max(E * cap - 1)) * routing.kept_gate(out.dtype)[:, None]
        # in the experts' output dtype: under autocast (--amp) the tokens are fp32, the outputs half
        return weighted.new_zeros(tokens.shape).index_add(0, routing.token, weighted)

    def permuted(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Gathers both ways (``GatherRows``): ``(N, d)`` -> ``(N, d)``."""
        E, cap, (N, d), k = routing.num_experts, routing.capacity, tokens.shape, self.router.top_k
        A, slots = routing.expert.numel(), E * cap
        # each assignment's buffer slot (dropped ones each a spare slot of their own, so that no index
        # repeats), then each slot's assignment (A: empty) and its token (N: empty)
        arange = torch.arange(A, device=tokens.device)
        target = torch.where(routing.kept, routing.expert * cap + routing.slot, slots + arange)
        assignment = torch.full((slots + A,), A, dtype=torch.long, device=tokens.device).scatter(0, target, arange)
        assignment = assignment[:slots]
        source = torch.where(assignment < A, routing.token.index_select(0, assignment.clamp_max(A - 1)), N)
        position = target.clamp_max(slots)  # slots: the zero row
        buffer = GatherRows.apply(tokens, source, position, k)
        out = self.experts(buffer.view(E, cap, d)).view(slots, d)
        per_assignment = GatherRows.apply(out, position, assignment, 1)  # (A, d), 0 where dropped
        return (per_assignment * routing.kept_gate(out.dtype)[:, None]).view(k, N, d).sum(dim=0)

    def grouped(self, tokens: Tensor, routing: Routing) -> Tensor:
        """Assignments sorted by expert through the experts' grouped products: ``(N, d)`` -> ``(N, d)``.

        Each kept assignment's row in expert order is its expert's start plus its slot (no sort);
        the dropped ones follow the last group in their order, with one spare row, so that the last
        group ends before the rows do (F.grouped_mm's condition). Rows past the last group are
        undefined in both passes of the product, so they are never read: tokens move by gathers
        both ways (``GatherRows``), a dropped assignment's row (its own token, copied once) gets no
        gradient, and its output is the zero row."""
        E, (N, d), k = routing.num_experts, tokens.shape, self.router.top_k
        A, kept = routing.expert.numel(), routing.kept
        if A == 0:  # no token: no group to multiply (a shape, not a host read)
            return tokens.new_zeros(tokens.shape)
        ends = routing.kept_load.cumsum(0)
        starts, arange = ends - routing.kept_load, torch.arange(A, device=kept.device)
        row = torch.where(kept, starts.index_select(0, routing.expert) + routing.slot,
                          ends[-1] + (~kept).cumsum(0) - 1)  # (A,), a permutation of 0..A-1
        assignment = torch.empty_like(row).scatter_(0, row, arange)
        source = torch.cat([routing.token.index_select(0, assignment), routing.token[:1]])  # the spare: any token
        inverse = torch.where(kept, row, A + 1)  # dropped rows' gradients are not read back
        rows = GatherRows.apply(tokens, source, inverse, k, False)
        group = torch.cat([torch.where(kept, routing.expert, E).index_select(0, assignment), row.new_full((1,), E)])
        out = self.experts.grouped(rows, ends.to(torch.int32), group)  # (A + 1, d)
        taken = torch.full((A + 1,), A, dtype=row.dtype, device=row.device).scatter_(
            0, row, torch.where(kept, arange, A))  # each row's kept assignment, A: none
        per_assignment = GatherRows.apply(out, torch.where(kept, row, A + 1), taken, 1)  # (A, d), 0 where dropped
        return (per_assignment * routing.kept_gate(out.dtype)[:, None]).view(k, N, d).sum(dim=0)


#: The GPU architectures (compute capability major) on which ``grouped`` runs torch's own bf16
#: grouped-product kernel: Hopper. Elsewhere, and in every other dtype, torch falls back to a loop
#: over the groups that copies the group ends to the host (a wait per grouped product: 2 per MoE
#: call forward, 6 backward with the biases' gradients); on SM 10.x the kernel is reported to give non-zero weight gradients to empty groups
#: (pytorch/pytorch#172439), and an expert without a kept token is common, so 10.x is left out.
FAST_GROUPED_MM_SM = (9,)
_warned_grouped_fallback = False


def fast_grouped_mm(tokens: Tensor, ffn_dim: int) -> bool:
    """Whether ``--moe-dispatch grouped`` runs torch's fast grouped product on ``tokens`` ``(N, d)``
    through experts of hidden width ``ffn_dim``: CUDA (not ROCm), a device of ``FAST_GROUPED_MM_SM``,
    bf16 (the tokens' dtype, or autocast's where it is on), d and ``ffn_dim`` multiples of 8 (the
    kernel's 16-byte strides). If not, warns once per process that ``padded`` (the same outputs)
    runs instead, naming what grouped needs: whether it can run is known only at the first call
    (fairseq builds the model on the CPU, and --fp16, --bf16 and --amp are the trainer's)."""
    global _warned_grouped_fallback
    device, d = tokens.device.type, tokens.shape[-1]
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tokens.dtype
    fast = (device == "cuda" and torch.version.hip is None and dtype == torch.bfloat16
            and d % 8 == 0 and ffn_dim % 8 == 0
            and torch.cuda.get_device_capability(tokens.device)[0] in FAST_GROUPED_MM_SM)
    if not fast and not _warned_grouped_fallback:
        _warned_grouped_fallback = True
        where = torch.cuda.get_device_name(tokens.device) if device == "cuda" else device
        warnings.warn(f"--moe-dispatch grouped needs bf16 (--bf16, or bf16 autocast; fairseq's --amp is fp16) on a "
                      f"CUDA GPU of compute capability {' or '.join(f'{m}.x' for m in FAST_GROUPED_MM_SM)} (Hopper), "
                      f"with d and the experts' FFN width multiples of 8, for torch's grouped product; here ({where}, "
                      f"{dtype}, d = {d}, FFN {ffn_dim}) torch would loop over the experts with host waits or fail, so "
                      f"the padded dispatch runs instead (the same outputs and gradients)")
    return fast


def route_and_move(moe: MoELayer, flat: Tensor, pad: Optional[Tensor]) -> tuple:
    """One MoE call without a given routing: ``flat`` ``(N, d)``, ``pad`` ``(N,)`` True at padding ->
    (``(N, d)`` output, the routing's fields), the region ``MoELayer`` compiles."""
    routing = moe.router(flat, None if pad is None else ~pad)
    return moe.move(flat, routing), routing.as_tuple()


#: ``torch.compile``'s backend for ``compiled_region`` (the tests use ``aot_eager``: the same
#: graph capture and guards, no code generation).
COMPILE_BACKEND = "inductor"
_COMPILED = {}


def compiled_region():
    """``route_and_move`` compiled once per backend, with dynamic shapes (a new batch shape
    reuses the graph; a recompilation would capture a new one)."""
    if COMPILE_BACKEND not in _COMPILED:
        _COMPILED[COMPILE_BACKEND] = torch.compile(route_and_move, dynamic=True, backend=COMPILE_BACKEND)
    return _COMPILED[COMPILE_BACKEND]
