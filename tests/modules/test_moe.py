"""MoE layer and top-k router (Xue et al. 2022, Eqs. 1-5)."""

import pytest
import torch
import torch.nn.functional as F

from fairseq_widearch.experiments.counting import OperatorCounter
from fairseq_widearch.modules import Experts, MoELayer, TopKRouter
from fairseq_widearch.modules.moe import ROUTINGS

D, FFN = 8, 16


def make_moe(experts=4, k=2, capacity_factor=1.2, eval_capacity_factor=0.0, noise=False, form="released", **kw):
    router = TopKRouter(D, experts, k, capacity_factor, eval_capacity_factor, noise=noise, **kw)
    return MoELayer(router, Experts(experts, D, FFN, form=form))


def dense_ffn(moe, i, x):
    """Expert i of ``moe`` applied as a plain FFN (ReLU; after both layers in the released form)."""
    h = F.relu(x @ moe.experts.fc1.weight[i] + moe.experts.fc1.bias[i])
    out = h @ moe.experts.fc2.weight[i] + moe.experts.fc2.bias[i]
    return F.relu(out) if moe.experts.drops_output else out


def route_everything_to(moe, expert):
    """Router weights that send every positive input to ``expert`` first."""
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[expert] = 1.0


def test_one_expert_top1_unlimited_equals_dense_ffn():
    torch.manual_seed(0)
    moe = make_moe(experts=1, k=1, eval_capacity_factor=0.0).eval()
    x = torch.randn(5, 3, D)
    y, routing = moe(x)
    torch.testing.assert_close(y, dense_ffn(moe, 0, x), atol=1e-5, rtol=1e-5)
    assert routing.kept.all()


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("k", [1, 2])
def test_balance_loss_on_a_hand_built_routing(k, routing):
    """l = E Σ_i m_i P_i (Eq. 3), P_i = mean router probability over the N tokens (Eq. 5), m_i from
    the k-hot dispatch vectors h(x) (Eq. 4): their mean divided by k for the released code (the m_i
    sum to 1, ``load_balanced_loss(router_probs, expert_mask_sum / top_k)``), undivided for ours
    (they sum to k)."""
    torch.manual_seed(0)
    moe = make_moe(experts=3, k=k, routing=routing)
    x = torch.randn(7, D)  # 7 tokens over 3 experts: loads that cannot be uniform
    result = moe.router(x)
    probs = (x @ moe.router.weight.t()).softmax(-1)
    dispatch = torch.zeros(7, 3).scatter_(1, probs.topk(k, dim=-1).indices, 1.0)  # h(x), k-hot
    m = dispatch.mean(0) / (k if routing == "released" else 1)
    assert m.sum().item() == pytest.approx(1 if routing == "released" else k)
    torch.testing.assert_close(result.balance_loss, 3 * (m * probs.mean(0)).sum())


@pytest.mark.parametrize("routing,expected", [("released", 1.0), ("ours", 2.0)])
def test_balance_loss_at_uniform_routing(routing, expected):
    """Uniform router probabilities (P_i = 1/E) give l = Σ_i m_i whatever the loads: 1 for the
    released code's m_i, K for ours (so at the same λ ours weighs the balance term K times)."""
    moe = make_moe(experts=4, k=2, routing=routing)
    with torch.no_grad():
        moe.router.weight.zero_()
    assert moe.router(torch.randn(12, D)).balance_loss.item() == pytest.approx(expected)


def test_balance_loss_is_not_bounded_below_by_its_uniform_value():
    """A skewed routing can go below the uniform value (docs/widenet.md)."""
    moe = make_moe(experts=2, k=1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0], moe.router.weight[1, 0] = 0.05, -0.05  # expert 0 iff x_0 > 0, barely
        moe.router.weight[1, 1] = 20.0  # expert 1 near-certain iff x_1 > 0 (and x_0 < 0)
    x = torch.zeros(10, D)
    x[:6, 0] = 1.0  # 6 tokens narrowly pick expert 0
    x[6:, 0], x[6:, 1] = -1.0, 1.0  # 4 tokens pick expert 1 with probability ~1
    assert moe.router(x).balance_loss.item() < 0.95  # m = (0.6, 0.4): 2 (0.6 P_0 + 0.4 P_1) ≈ 0.92


@pytest.mark.parametrize("tokens,factor,k,experts,released,ours", [
    (10, 1.0, 1, 2, 4, 5),  # floor(5) - 1, ceil(5)
    (100, 1.2, 2, 4, 59, 60),  # floor(60) - 1, ceil(60)
    (37, 1.2, 2, 4, 21, 23),  # floor(22.2) - 1, ceil(22.2)
    (3, 1.0, 1, 4, 1, 1),  # floor(0.75) - 1 < 1: at least one slot
])
def test_capacity_at_a_few_sizes(tokens, factor, k, experts, released, ours):
    """Released: positions start at 1 and are kept while below floor(C·K·N/E), so B = that - 1
    usable slots; ours: ceil(C·K·N/E). The same B on the host and, as the last slot kept of the
    device's table for that count of real tokens, there."""
    for routing, expected in (("released", released), ("ours", ours)):
        router = TopKRouter(D, experts, k, factor, routing=routing).train()
        assert router.capacity(tokens) == expected, routing
        limits, _ = router.tables(tokens, "cpu")
        assert limits[tokens].floor().item() == expected, routing


@pytest.mark.parametrize("routing", ROUTINGS)
def test_capacity_drops_exactly_the_over_capacity_tokens(routing):
    torch.manual_seed(0)
    moe = make_moe(experts=2, k=1, capacity_factor=1.0, routing=routing).train()
    route_everything_to(moe, 0)
    x = torch.rand(10, 1, D) + 0.1  # positive, so expert 0 wins for every token
    y, result = moe(x)
    capacity = 4 if routing == "released" else 5  # floor(5) - 1 (one slot unused), ceil(5)
    assert result.capacity == capacity
    assert result.kept.tolist() == [True] * capacity + [False] * (10 - capacity)  # batch order
    gates = result.gate[:capacity]  # (capacity, k = 1)
    torch.testing.assert_close(y[:capacity, 0], gates * dense_ffn(moe, 0, x[:capacity, 0]), atol=1e-5, rtol=1e-5)
    assert (y[capacity:] == 0).all()


def served_and_queues(routing_name, x):
    """(kept assignments, the released code's queue, ours) of each of 2 experts, top-2 of 2."""
    torch.manual_seed(0)
    moe = make_moe(experts=2, k=2, capacity_factor=0.5, routing=routing_name).train()  # floor/ceil(4)
    routing = moe.router(x)
    expert, kept = routing.expert.view(2, 8), routing.kept.view(2, 8)  # (choice, token)
    for e in range(2):
        token_order = [(c, t) for t in range(8) for c in range(2) if expert[c, t] == e]
        choice_order = [(c, t) for c in range(2) for t in range(8) if expert[c, t] == e]
        yield [(c, t) for c, t in token_order if kept[c, t]], token_order, choice_order, routing.capacity


def test_the_two_overflow_orders_keep_different_assignments():
    """Released: one running count over the tokens, a token's second choice competing at its place
    (``cumsum`` of the K-hot mask); ours: every first choice before any second (GShard). With
    K = E = 2 every token asks both experts, so an expert's queue is in token order for the
    released routing and first choices first for ours; this batch keeps different assignments."""
    x = torch.randn(8, D, generator=torch.Generator().manual_seed(3))
    released, ours = list(served_and_queues("released", x)), list(served_and_queues("ours", x))
    for served, token_order, _, capacity in released:
        assert capacity == 3 and served == token_order[:3]
    for served, _, choice_order, capacity in ours:
        assert capacity == 4 and sorted(served) == sorted(choice_order[:4])
    kept = [set(r[0]) for r in released], [set(o[0]) for o in ours]
    assert any(not kept[0][e] <= kept[1][e] for e in range(2))  # a token the released order keeps, ours drops


@pytest.mark.parametrize("routing,first_kept", [("released", "sentence"), ("ours", "position")])
def test_tokens_compete_in_batch_major_order_for_the_released_routing(routing, first_kept):
    """The released code flattens its (batch, tokens, d) input, so an overflowing expert keeps the
    first sentences whole; ours flattens fairseq's T x B, keeping every sentence's first positions."""
    torch.manual_seed(0)
    moe = make_moe(experts=2, k=1, capacity_factor=0.5, routing=routing).train()
    route_everything_to(moe, 0)
    x = torch.rand(4, 3, D) + 0.1  # (T, B, d): 12 tokens, all to expert 0
    y, result = moe(x)
    kept = y.abs().sum(-1) > 0  # (T, B)
    capacity = result.capacity  # released: floor(3) - 1 = 2, ours: ceil(3) = 3
    order = torch.zeros(12, dtype=torch.bool)
    order[:capacity] = True
    if first_kept == "sentence":  # batch-major: sentence 0's first tokens
        expected = order.view(3, 4).t()
    else:  # position-major: position 0 of every sentence
        expected = order.view(4, 3)
    assert torch.equal(kept, expected), kept


def test_padding_changes_neither_loss_nor_loads_nor_outputs():
    torch.manual_seed(0)
    moe = make_moe(experts=4, k=2, capacity_factor=1.0).train()
    x = torch.randn(5, 2, D)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    x_padded = torch.cat([x, torch.randn(3, 2, D)], dim=0)  # three more padded steps
    x_padded = torch.cat([x_padded, torch.randn(8, 1, D)], dim=1)  # and one all-padding sentence
    pad_padded = torch.ones(3, 8, dtype=torch.bool)
    pad_padded[:2, :5] = pad
    y, r = moe(x, pad)
    y2, r2 = moe(x_padded, pad_padded)
    torch.testing.assert_close(r.balance_loss, r2.balance_loss)
    assert torch.equal(torch.bincount(r.expert[r.kept], minlength=4), torch.bincount(r2.expert[r2.kept], minlength=4))
    torch.testing.assert_close(y2[:5, :2][~pad.t()], y[~pad.t()])
    assert (y[pad.t()] == 0).all() and (y2[pad_padded.t()] == 0).all()


def test_every_expert_parameter_gets_a_gradient_even_without_tokens():
    torch.manual_seed(0)
    moe = make_moe(experts=3, k=1).train()
    route_everything_to(moe, 0)
    y, routing = moe(torch.rand(6, 2, D) + 0.1)
    (y.sum() + routing.balance_loss).backward()
    for name, p in moe.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert moe.experts.fc1.weight.grad[0].abs().sum() > 0 and moe.experts.fc1.weight.grad[1:].abs().sum() == 0
    assert moe.router.weight.grad.abs().sum() > 0  # through the gates and the balance loss


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_router_math_stays_fp32_for_half_inputs(dtype):
    torch.manual_seed(0)
    moe = make_moe().to(dtype).eval()
    y, routing = moe(torch.randn(4, 2, D, dtype=dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    assert routing.gate.dtype == torch.float32 and routing.balance_loss.dtype == torch.float32


def test_router_math_stays_fp32_under_autocast():
    """fairseq's ``--amp``: autocast would run the router's product in half precision."""
    torch.manual_seed(0)
    moe = make_moe().train()
    x = torch.randn(4, 2, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        routing = moe(x)[1]
    gate, _ = (x.reshape(-1, D) @ moe.router.weight.t()).softmax(-1).topk(2)
    assert routing.gate.dtype == torch.float32 and routing.balance_loss.dtype == torch.float32
    torch.testing.assert_close(routing.gate, gate.view(4, 2, 2).transpose(0, 1).reshape(8, 2))  # batch-major


def test_eval_capacity_does_not_drop_by_default():
    """Without a limit at inference every assignment is kept, and the capacity is the number of
    tokens (known from the shapes), not the largest load (which only the host could read)."""
    moe = make_moe(experts=2, k=1, capacity_factor=0.1).eval()
    with torch.no_grad():  # positive inputs to expert 0, negative ones to expert 1
        moe.router.weight.zero_()
        moe.router.weight[0], moe.router.weight[1] = 1.0, -1.0
    x = torch.rand(9, 1, D) + 0.1
    x[5:] *= -1
    _, routing = moe(x)
    assert routing.kept.all() and routing.kept_load.tolist() == [5, 4]
    assert routing.capacity == 9


def released_switch(moe, tokens, capacity_factor):
    """The released code's top-k ``Router`` and ``Switch`` at inference (no noise), re-derived from
    widenet/model_configs.py: a K-hot (N, E) mask over the tokens in their order, positions
    ``cumsum(mask) * mask`` (from 1), kept while below ``int(N·C·K // E)``, each kept assignment's
    expert output times its gate, summed per token."""
    E, k, N = moe.router.num_experts, moe.router.top_k, tokens.shape[0]
    gate, expert = F.linear(tokens, moe.router.weight).softmax(-1).topk(k, dim=-1)  # (N, k)
    mask = F.one_hot(expert, E).sum(1)  # (N, E)
    position = mask.cumsum(0) * mask
    kept = mask.bool() & (position < int(N * capacity_factor * k // E))
    out = torch.zeros_like(tokens)
    for c in range(k):
        for t in range(N):
            e = expert[t, c]
            if kept[t, e]:
                out[t] += gate[t, c] * dense_ffn(moe, e, tokens[t])
    return out, kept


@pytest.mark.parametrize("tokens", [7, 12, 40])
def test_eval_capacity_factor_reproduces_the_released_switch_at_inference(tokens):
    """``--moe-eval-capacity-factor C`` with the released routing drops at inference what the
    released code drops (it applies its training capacity in evaluation too): the same kept
    assignments and outputs, tokens in batch-major order. Every call here has floor(C·K·N/E) >= 2;
    below that the released code keeps no slot and ours one (docs/widenet.md)."""
    torch.manual_seed(tokens)
    moe = make_moe(experts=4, k=2, eval_capacity_factor=1.2).eval()
    with torch.no_grad():
        moe.router.weight.mul_(8)  # peaked routing, so that experts overflow
    x = torch.randn(tokens // 2 if tokens % 2 == 0 else tokens, 2 if tokens % 2 == 0 else 1, D) + 0.5  # skewed
    y, routing = moe(x)
    flat = x.transpose(0, 1).reshape(-1, D)
    expected, kept = released_switch(moe, flat, 1.2)
    ours = torch.zeros_like(kept)
    ours[routing.token[routing.kept], routing.expert[routing.kept]] = True
    assert torch.equal(ours, kept) and not kept.sum(1).eq(2).all()  # something dropped
    torch.testing.assert_close(y.transpose(0, 1).reshape(-1, D), expected, atol=1e-5, rtol=1e-5)


def test_a_sentence_translates_the_same_alone_or_in_a_batch():
    """Unlimited eval capacity: no token's output depends on the other tokens of the batch."""
    torch.manual_seed(0)
    moe = make_moe(experts=4, k=2).eval()
    x = torch.randn(6, 3, D)
    batched, _ = moe(x)
    alone, _ = moe(x[:, 1:2])
    torch.testing.assert_close(batched[:, 1:2], alone, atol=1e-6, rtol=1e-6)


def test_reused_routing_routes_nothing_again():
    torch.manual_seed(0)
    moe = make_moe().eval()
    x = torch.randn(4, 2, D)
    y, routing = moe(x)
    with torch.no_grad():
        moe.router.weight.mul_(-1)  # this router now routes differently...
    assert not torch.equal(moe(x)[1].expert, routing.expert)
    y_reused, same = moe(x, routing=routing)  # ...but a reused routing is not recomputed
    assert same is routing
    torch.testing.assert_close(y_reused, y)


@pytest.mark.parametrize("kwargs,message", [
    (dict(experts=2, k=3), "top_k must be in [1, num_experts=2], got 3"),
    (dict(experts=0, k=1), "num_experts must be >= 1, got 0"),
    (dict(capacity_factor=0.0), "capacity_factor must be > 0, got 0.0"),
    (dict(eval_capacity_factor=-1.0), "eval_capacity_factor must be >= 0"),
])
def test_invalid_router_configs(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make_moe(**kwargs)


def dispatched(x, padding_mask, seed, train=True, **kw):
    """Output, balance loss, kept count and every gradient of one forward + backward of a fresh
    MoE layer (the same initialisation every call; router noise and dropout from ``seed``;
    ``dtype``: the layer cast to it)."""
    torch.manual_seed(0)
    router = TopKRouter(D, 4, 2, 0.5, 0.0, noise=kw.get("noise", False))
    moe = MoELayer(router, Experts(4, D, FFN, activation_dropout=kw.get("dropout", 0.0))).train(train)
    moe.to(kw.get("dtype", torch.float32))
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)
    y, routing = moe(x, padding_mask)
    (y.pow(2).sum() + routing.balance_loss).backward()
    grads = {"x": x.grad, **{name: p.grad for name, p in moe.named_parameters()}}
    return y, routing.balance_loss, routing.kept.sum(), grads


def padded_input():
    torch.manual_seed(1)
    pad = torch.zeros(5, 7, dtype=torch.bool)
    pad[1, 4:], pad[3, 3:] = True, True  # 28 real tokens: C·K·N/E = 7 slots, a whole number
    return torch.randn(7, 5, D), pad


def reference_moe(moe, x, pad):
    """Eq. 1 over (T, B, d) ``x`` with ``pad`` (B, T), one assignment at a time: the router's
    probabilities and top-k recomputed, the assignments of the real tokens visited in the routing's
    filling order (released: tokens batch-major, a token's k choices at its place; ours: every first
    choice before any second, tokens in T x B order) with a running count per expert, kept while the
    count is at most B (the router's capacity for the real tokens), y[token] = Σ kept gate ·
    expert(x[token]). -> (y (T, B, d), kept {(t, b, choice)})."""
    E, k, (T, B, _) = moe.router.num_experts, moe.router.top_k, x.shape
    gate, choice = F.linear(x, moe.router.weight).softmax(-1).topk(k, dim=-1)  # (T, B, k)
    real = [(t, b) for b in range(B) for t in range(T) if not pad[b, t]]  # batch-major
    if moe.router.routing == "ours":
        real.sort()  # T x B
        order = [(t, b, c) for c in range(k) for t, b in real]
    else:
        order = [(t, b, c) for t, b in real for c in range(k)]
    capacity, count, kept = moe.router.capacity(len(real)), [0] * E, set()
    for t, b, c in order:
        e = int(choice[t, b, c])
        count[e] += 1
        if count[e] <= capacity:
            kept.add((t, b, c))
    y = [[torch.zeros_like(x[0, 0]) for _ in range(B)] for _ in range(T)]
    for t, b, c in sorted(kept):
        y[t][b] = y[t][b] + gate[t, b, c] * dense_ffn(moe, int(choice[t, b, c]), x[t, b])
    return torch.stack([torch.stack(row) for row in y]), kept


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("train", [True, False], ids=["training", "inference"])
def test_the_layer_equals_a_token_by_token_reference(routing, train):
    """Outputs, the kept assignments and the gradients of the input and of every parameter equal
    ``reference_moe``'s, over a padded batch in training (C = 0.5: assignments dropped, the capacity
    of the real tokens) and at inference (no limit: every real assignment kept). Router noise off."""
    x, pad = padded_input()
    torch.manual_seed(0)
    moe = make_moe(experts=4, k=2, capacity_factor=0.5, routing=routing).train(train)
    weights = torch.randn(x.shape)  # a loss that weighs every output differently
    results = []
    for layer in (lambda inp: moe(inp, pad), lambda inp: reference_moe(moe, inp, pad)):
        inp = x.clone().requires_grad_()
        y, routed = layer(inp)
        (y * weights).sum().backward()
        results.append((y, routed, {"x": inp.grad, **{name: p.grad for name, p in moe.named_parameters()}}))
        moe.zero_grad(set_to_none=True)
    (y, routing_, grads), (y_ref, kept_ref, grads_ref) = results
    T, B, k = x.shape[0], x.shape[1], 2
    tokens = [(t, b) for b in range(B) for t in range(T)] if routing == "released" else \
        [(t, b) for t in range(T) for b in range(B)]  # the layer's rows
    kept = {(*tokens[n], c) for c in range(k) for n in range(T * B) if routing_.kept[c * T * B + n]}
    real = 2 * int((~pad).sum())
    assert kept == kept_ref and (len(kept) < real if train else len(kept) == real)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    assert (y[pad.t()] == 0).all()
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads_ref.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("train", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "bf16 autocast", "fp16 autocast"])
def test_host_waits_and_atomic_adds(train, precision):
    """Counted operators of a forward + backward, with and without padding, in training (C = 0.5)
    and at inference (no capacity limit: B from the shapes, not from the largest load), in fp32, in
    bf16 and fp16 (a cast layer, as ``--bf16``, ``--fp16``) and under autocast in either (as
    ``--amp``): no host wait (no count read back, no data-dependent shape) and no scatter-add (the
    combine's gradient is copied back, each buffer row written once)."""
    x, pad = padded_input()
    half, autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision[:4]), precision.endswith("autocast")
    dtype = half if half and not autocast else torch.float32
    for padding_mask in (pad, None):
        with torch.autocast("cpu", dtype=half or torch.bfloat16, enabled=autocast), OperatorCounter() as counter:
            dispatched(x.to(dtype), padding_mask, 3, train, dtype=dtype)
        assert (counter.host_waits, counter.atomic_adds) == (0, 0), counter.counts


def test_the_layer_trains_under_autocast():
    """fairseq's ``--amp``: fp32 parameters and inputs, the experts' matmuls in half precision
    (autocast), so their outputs are half while the tokens are fp32. On the CPU with bf16 autocast,
    as ``--amp`` runs fp16 autocast on CUDA (the CUDA tier's WideNet AMP training found this):
    training mode, padded; with router noise and dropout, then without them against fp32."""
    x, pad = padded_input()
    for kw in ({"noise": True, "dropout": 0.3}, {}):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, loss, kept, grads = dispatched(x, pad, 3, **kw)
        assert y.dtype == torch.bfloat16 and kept > 0 and torch.isfinite(loss)
        assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    reference = dispatched(x, pad, 3)[0]
    torch.testing.assert_close(y.float(), reference, atol=0.05, rtol=0.05)  # bf16 keeps 8 bits


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("routing", ROUTINGS)
def test_the_routers_written_out_gradient_equals_autograds(renormalize, routing):
    """``Gate``'s backward against autograd through the same formulas (Eqs. 2-5), with padding rows:
    the gates, renormalised or not, and the balance loss, to the input and the router's weight."""
    torch.manual_seed(0)
    router = TopKRouter(D, 4, 2, 0.5, noise=False, renormalize=renormalize, routing=routing).train()
    x = torch.randn(12, D, requires_grad=True)
    pad = torch.zeros(12, dtype=torch.bool)
    pad[9:] = True
    weights = torch.randn(12, 2)
    routing_out = router(x, pad)
    ((routing_out.gate * weights).sum() + 0.7 * routing_out.balance_loss).backward()
    written = x.grad, router.weight.grad
    x.grad, router.weight.grad = None, None
    probs = (x @ router.weight.t()).softmax(-1)
    top = probs.topk(2, dim=-1).values
    gate = top / top.sum(-1, keepdim=True) if renormalize else top
    real, share = ~pad, 2 if routing == "released" else 1
    load = torch.zeros(4).index_add_(0, probs[real].topk(2, dim=-1).indices.flatten(), torch.ones(18))
    balance = 4 * (load / (9 * share) * probs[real].sum(0) / 9).sum()
    ((gate * weights).sum() + 0.7 * balance).backward()
    torch.testing.assert_close(routing_out.gate, gate)
    torch.testing.assert_close(written[0], x.grad)
    torch.testing.assert_close(written[1], router.weight.grad)


def autograd_move(moe, tokens, routing):
    """``MoELayer.move`` by autograd through ``Experts.forward``: the copies in and out as tensors."""
    E, cap, (N, d), k = routing.num_experts, routing.capacity, tokens.shape, routing.choice.shape[1]
    buffer = tokens.new_zeros(E * cap + 1, d).index_copy(0, routing.position, tokens.repeat(1, k).view(N * k, d))
    out = moe.experts(buffer[1:].view(E, cap, d)).view(E * cap, d)
    rows = F.pad(out, (0, 0, 1, 0))[routing.position].view(N, k, d)
    return (rows * routing.gate[..., None]).sum(dim=1)


@pytest.mark.parametrize("form", ["released", "ours"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_accurate", "gelu_fast", "tanh", "linear", "relu_squared",
                                        "swish"])
def test_the_written_out_move_equals_autograd_through_the_experts(activation, form):
    """``Move``'s outputs and gradients (tokens, gates, the experts' weights and biases) against
    autograd's through the same experts, with both dropouts drawing the same numbers (training)."""
    results = []
    for move in (MoELayer.move, autograd_move):
        torch.manual_seed(0)
        router = TopKRouter(D, 4, 2, 0.5, noise=False)
        moe = MoELayer(router, Experts(4, D, FFN, activation, activation_dropout=0.2, form=form, dropout=0.3)).train()
        tokens = torch.randn(20, D, requires_grad=True)
        routing = router(tokens.detach())
        gate = routing.gate.detach().requires_grad_()
        routing.gate = gate
        torch.manual_seed(1)
        y = move(moe, tokens, routing)
        (y * torch.linspace(-1, 1, D)).sum().backward()
        results.append([y, tokens.grad, gate.grad, *(p.grad for p in moe.experts.parameters())])
    for written, reference in zip(*results):
        torch.testing.assert_close(written, reference, atol=1e-5, rtol=1e-5)


def test_a_dropout_kept_mask_gives_native_dropouts_gradient():
    """``undropped`` with ``native_dropout``'s boolean mask (off the CPU) scales the kept elements."""
    from fairseq.modules.fairseq_dropout import FairseqDropout

    from fairseq_widearch.modules.moe import undropped
    grad, kept = torch.randn(6, 5), torch.rand(6, 5) > 0.3
    torch.testing.assert_close(undropped(FairseqDropout(0.3), grad, kept), grad * kept / 0.7)
