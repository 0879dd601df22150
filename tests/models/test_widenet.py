"""widenet (Xue et al. 2022): sharing across blocks, ablations, routing groups, criterion, configs,
the experts and router as the released code builds them."""
import math
import re
from types import SimpleNamespace

import pytest
import torch
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from fairseq_widearch.criterions import MoELabelSmoothedCrossEntropyCriterion
from fairseq_widearch.experiments.counting import model_stats, preset_param_counts
from fairseq_widearch.model_builder import build_model, dummy_dictionary
from fairseq_widearch.models.widenet import DenseFFN
from fairseq_widearch.modules.moe import Routing
from testing_utils import benchmark, train

VOCAB = 40


def make_model(*flags, **overrides):
    """Tiny widenet (3 encoder, 2 decoder blocks, d = 32, E = 4, K = 2) with extra CLI flags."""
    return build_model("widenet_tiny", list(flags), vocab_size=VOCAB, **overrides)


def batch(bsz=3, src_len=7, tgt_len=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (bsz, src_len), generator=g)
    src[0, :2] = 1  # left padding
    prev = torch.randint(4, VOCAB, (bsz, tgt_len), generator=g)
    prev[:, 0] = 2
    return src, torch.tensor([src_len - 2] + [src_len] * (bsz - 1)), prev


def test_blocks_share_attention_and_moe_but_not_layer_norms():
    model = make_model()
    for stack in (model.encoder, model.decoder):
        first = stack.layers[0]
        for layer in stack.layers[1:]:
            assert layer.self_attn.k_proj.weight is first.self_attn.k_proj.weight
            assert layer.moe.router.weight is first.moe.router.weight
            assert layer.moe.experts.fc2.weight is first.moe.experts.fc2.weight
            assert layer.moe_layer_norm.weight is not first.moe_layer_norm.weight
    decoder = model.decoder.layers
    assert decoder[1].encoder_attn.v_proj.weight is decoder[0].encoder_attn.v_proj.weight
    # tied weights in distinct modules: each decoder block keeps its own decoding-cache key
    assert decoder[1].self_attn is not decoder[0].self_attn


@pytest.mark.slow
def test_encoder_parameter_count_is_one_block_plus_per_block_layer_norms():
    d, ffn, E, L = 32, 64, 4, 3
    attention = 4 * (d * d + d)
    moe = d * E + E * (d * ffn + ffn + ffn * d + d)
    layer_norms = L * 2 * 2 * d + 2 * d  # two per block, plus the final one
    stats = model_stats("widenet_tiny", vocab_size=VOCAB)
    assert stats["params_encoder"] == attention + moe + layer_norms


@pytest.mark.parametrize("flag,check", [
    ("--widenet-shared-layer-norm",
     lambda m: m.encoder.layers[2].moe_layer_norm.weight is m.encoder.layers[0].moe_layer_norm.weight),
    ("--widenet-dense-ffn", lambda m: isinstance(m.encoder.layers[0].moe, DenseFFN)),
    ("--widenet-no-sharing",
     lambda m: m.encoder.layers[1].self_attn.q_proj.weight is not m.encoder.layers[0].self_attn.q_proj.weight),
    ("--widenet-router-per-block",
     lambda m: m.encoder.layers[1].moe.router.weight is not m.encoder.layers[0].moe.router.weight
     and m.encoder.layers[1].moe.experts.fc1.weight is m.encoder.layers[0].moe.experts.fc1.weight),
    ("--widenet-standard-decoder",
     lambda m: all(isinstance(layer, TransformerDecoderLayerBase) for layer in m.decoder.layers)),
])
def test_table3_ablations_and_variants(flag, check):
    model = make_model(flag)
    assert check(model)
    src, lengths, prev = batch()
    logits, extra = model(src, lengths, prev)
    expected_calls = {"--widenet-dense-ffn": 0, "--widenet-standard-decoder": 3}.get(flag, 5)
    assert len(extra["moe_balance_loss"]) == expected_calls


@pytest.mark.slow
def test_no_sharing_has_one_block_per_layer():
    shared = model_stats("widenet_tiny", vocab_size=VOCAB)["params_encoder"]
    unshared = model_stats("widenet_tiny", ["--widenet-no-sharing"], vocab_size=VOCAB)["params_encoder"]
    layer_norms = 3 * 2 * 2 * 32 + 2 * 32
    assert unshared - layer_norms == 3 * (shared - layer_norms)


@pytest.mark.parametrize("groups,calls", [(0, 3), (3, 3), (1, 1)])
def test_routing_groups_reuse_the_first_blocks_routing(groups, calls):
    model = make_model("--widenet-routing-groups", str(groups), "--decoder-layers", "3").eval()
    src, lengths, _ = batch()
    out = model.encoder(src, src_lengths=lengths)
    assert len(out["moe_balance_loss"]) == calls


def test_routing_groups_must_divide_the_depth():
    with pytest.raises(ValueError, match="--widenet-routing-groups 2 must be 0 or divide --encoder-layers 3"):
        make_model("--widenet-routing-groups", "2")


def test_auxiliary_outputs_survive_reorder_encoder_out():
    """The routing statistics are batch statistics: reordering the sentences carries them unchanged,
    and they equal those of encoding the reordered batch afresh, beside the reordered states."""
    model = make_model().eval()
    src, lengths, _ = batch()
    order = torch.tensor([2, 0, 1])
    out = model.encoder(src, src_lengths=lengths)
    reordered = model.encoder.reorder_encoder_out(out, order)
    fresh = model.encoder(src[order], src_lengths=lengths[order])
    assert len(reordered["moe_load"]) == len(reordered["moe_balance_loss"]) == 3
    for key in ("moe_balance_loss", "moe_load", "moe_dropped"):
        torch.testing.assert_close(torch.stack(reordered[key]), torch.stack(fresh[key]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reordered["encoder_out"][0], fresh["encoder_out"][0], atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_the_balance_losses():
    model = make_model().eval()
    src, lengths, prev = batch()
    padded_src = torch.cat([torch.ones(3, 2, dtype=src.dtype), src], dim=1)  # more left padding
    a = model.encoder(src, src_lengths=lengths)["moe_balance_loss"]
    b = model.encoder(padded_src, src_lengths=lengths)["moe_balance_loss"]
    torch.testing.assert_close(torch.stack(a), torch.stack(b), atol=1e-5, rtol=1e-5)


def test_criterion_adds_lambda_times_the_summed_balance_losses():
    torch.manual_seed(0)
    model = make_model().train()
    dictionary = dummy_dictionary(VOCAB)
    task = SimpleNamespace(target_dictionary=dictionary)
    src, lengths, prev = batch()
    target = torch.cat([prev[:, 1:], torch.full((3, 1), 2)], dim=1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": target, "ntokens": target.numel()}
    weighted = MoELabelSmoothedCrossEntropyCriterion(task, False, 0.1, moe_balance_weight=0.5)
    plain = MoELabelSmoothedCrossEntropyCriterion(task, False, 0.1, moe_balance_weight=0.0)
    torch.manual_seed(1)
    loss, sample_size, log = weighted(model, sample)
    torch.manual_seed(1)
    loss0, _, log0 = plain(model, sample)
    torch.testing.assert_close(log["ce_loss"], log0["ce_loss"])
    torch.testing.assert_close(loss - loss0, 0.5 * log["moe_balance_loss"] * sample_size)
    torch.manual_seed(1)
    calls = model(**sample["net_input"])[1]["moe_balance_loss"]
    assert len(calls) == 5  # three encoder and two decoder blocks route
    torch.testing.assert_close(log["moe_balance_loss"], torch.stack(calls).sum())  # Σ_t l^t (Eq. 8)
    assert 0 <= log["moe_dropped"] <= 1 and log["moe_load_cv"] >= 0


@pytest.mark.parametrize("flags,message", [
    (["--moe-top-k", "5"], "--moe-top-k 5 exceeds --moe-experts 4"),
    (["--moe-experts", "0"], "--moe-experts must be a positive integer, got 0"),
    (["--moe-capacity-factor", "0"], "--moe-capacity-factor must be > 0, got 0.0"),
    (["--moe-eval-capacity-factor", "-1"], "--moe-eval-capacity-factor must be >= 0"),
])
def test_invalid_configs_fail_at_build_time_naming_the_flag(flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_model(*flags)


@pytest.mark.slow
def test_paper_presets_body_sizes():
    """WideNet-L (Sec. 4.1): 24 blocks, d = 1024, 16 heads, FFN 4096, E = 4: the encoder holds one
    attention (4.20M), four experts (33.57M), the router and 48 + 1 LayerNorms (0.10M)."""
    stats = preset_param_counts("widenet_l", vocab_size=1000)
    expected = 4 * (1024 * 1024 + 1024) + 4 * 1024 + 4 * (2 * 1024 * 4096 + 4096 + 1024) + 49 * 2 * 1024
    assert stats["params_encoder"] == expected
    assert abs(stats["params_encoder"] / 1e6 - 40) / 40 < 0.06  # the paper's 40M adds patch embedding and head


@pytest.mark.slow
def test_moe_criterion_end_to_end_logs_every_term(multi30k_bin, tmp_path):
    log = train(multi30k_bin, tmp_path, "widenet_tiny", "--criterion", "moe_label_smoothed_cross_entropy",
                max_update=3).stdout
    line = [ln for ln in log.splitlines() if "| train |" in ln][-1]
    for key in ("ce_loss", "nll_loss", "moe_balance_loss", "moe_dropped", "moe_load_cv"):
        assert f"{key} " in line, line


def test_router_per_block_with_routing_groups_gives_routers_to_routing_blocks_only():
    """A block that reuses its group's routing never calls a router: it owns none (DDP without
    unused-parameter search would stop on it), and every parameter gets a gradient."""
    model = make_model("--widenet-router-per-block", "--widenet-routing-groups", "1", "--encoder-layers", "4",
                       "--decoder-layers", "2")
    assert len({id(layer.moe.router) for layer in model.encoder.layers}) == 1
    grouped = make_model("--widenet-router-per-block", "--widenet-routing-groups", "2", "--encoder-layers", "4",
                         "--decoder-layers", "2")
    routers = [id(layer.moe.router) for layer in grouped.encoder.layers]
    assert routers[0] != routers[2] and routers[1] == routers[3] == routers[0]  # 1 and 3 hold block 0's MoE
    src, lengths, prev = batch()
    logits, extra = grouped(src, lengths, prev)
    (logits.mean() + torch.stack(extra["moe_balance_loss"]).sum()).backward()
    assert [name for name, p in grouped.named_parameters() if p.grad is None] == []


def test_routing_statistics_count_the_real_tokens_only():
    """``moe_dropped`` and ``moe_load`` over a padded batch in training (capacity applies, C = 0.5:
    some assignments dropped) equal those of the same sentences with more padding (the padding rows
    are routed too, never kept nor counted). Dropout 0: its masks depend on the batch's shape, and
    with them the routing."""
    src, lengths, _ = batch()
    padded_src = torch.cat([torch.ones(3, 4, dtype=src.dtype), src], dim=1)  # four more left-padding steps
    stats = []
    for tokens in (src, padded_src):
        torch.manual_seed(0)
        model = make_model("--moe-capacity-factor", "0.5", "--moe-no-router-noise", "--dropout", "0").train()
        out = model.encoder(tokens, src_lengths=lengths)
        stats.append({key: torch.stack(out[key]) for key in ("moe_dropped", "moe_load")})
    assert (stats[0]["moe_dropped"] > 0).all()
    for key in ("moe_dropped", "moe_load"):
        torch.testing.assert_close(stats[1][key], stats[0][key], atol=1e-6, rtol=1e-6)


@torch.no_grad()
def test_the_experts_and_router_are_built_as_the_released_code_builds_them():
    """e_i(x) = GELU(GELU(x W1 + b1) W2 + b2) (``mlp`` of widenet/model_configs.py: a GELU after each
    Dense layer), Xavier-uniform kernels, biases from N(0, (1e-6)²), the router Xavier-uniform;
    ``--widenet-experts ours``: fairseq's FFN (the activation after the first layer only) with
    nn.Linear's initialisation. The dense-FFN ablation follows the experts' form."""
    torch.manual_seed(0)
    moe = make_model("--encoder-ffn-embed-dim", "256").encoder.layers[0].moe.eval()  # no dropout
    experts, router = moe.experts, moe.router
    fc1, fc2 = experts.fc1, experts.fc2  # weight (E, in, out)
    for linear, fan_in, fan_out in ((fc1, 32, 256), (fc2, 256, 32)):
        bound = (6 / (fan_in + fan_out)) ** 0.5
        assert linear.weight.abs().max() <= bound and linear.weight.std() == pytest.approx(bound / 3 ** 0.5, rel=0.1)
        assert linear.bias.abs().max() < 1e-5 and linear.bias.std() == pytest.approx(1e-6, rel=0.3)
    assert router.weight.abs().max() <= (6 / (32 + 4)) ** 0.5 and router.weight.std() > 0.2  # Xavier, not Kaiming
    x = torch.randn(4, 5, 32)

    def gelu(v):  # the released code's gelu (widenet/model_configs.py), in float64
        v = v.double()
        return 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))

    expected = gelu(torch.bmm(gelu(torch.bmm(x, fc1.weight) + fc1.bias[:, None]).float(), fc2.weight) + fc2.bias[:, None])
    torch.testing.assert_close(experts(x).double(), expected, atol=1e-6, rtol=1e-6)
    erf = torch.nn.functional.gelu  # the exact form, ~5e-4 away at most: the test tells the two apart
    assert (experts(x) - erf(torch.bmm(erf(torch.bmm(x, fc1.weight) + fc1.bias[:, None]), fc2.weight)
                             + fc2.bias[:, None])).abs().max() > 1e-5

    ours = make_model("--widenet-experts", "ours", "--activation-fn", "relu").encoder.layers[0].moe.experts.eval()
    assert not ours.drops_output and ours.fc1.bias.abs().max() > 1e-2  # nn.Linear's U(±1/√fan_in) biases
    assert (ours(x) < 0).any()  # no activation after the second layer
    for form, activated in (("released", True), ("ours", False)):
        dense = make_model("--widenet-dense-ffn", "--widenet-experts", form).encoder.layers[0].moe
        assert isinstance(dense, DenseFFN) and dense.drops_output == activated


@torch.no_grad()
def test_attention_is_initialised_as_keras_multi_head_attention_unless_fairseqs_is_asked():
    """Released: Glorot-uniform with the fans Keras computes for the 3-D EinsumDense kernels (q, k, v
    (d_in, H, d/H); output (H, d/H, d)), every bias 0, block 0's attention shared by every block; the
    cross-attention's k and v with the encoder's width as d_in. ``fairseq``: fairseq's init."""
    torch.manual_seed(0)
    d, heads, encoder_d = 128, 4, 64
    flags = ("--encoder-embed-dim", str(encoder_d), "--encoder-ffn-embed-dim", "128", "--decoder-embed-dim", str(d),
             "--decoder-ffn-embed-dim", "256", "--decoder-attention-heads", str(heads), "--decoder-layers", "2")
    model = make_model(*flags)
    self_attn, cross = model.decoder.layers[0].self_attn, model.decoder.layers[0].encoder_attn
    head_dim = d // heads
    expected = [(self_attn.q_proj, heads * d, head_dim * d), (self_attn.out_proj, d, heads * d),
                (cross.k_proj, heads * encoder_d, head_dim * encoder_d),
                (cross.v_proj, heads * encoder_d, head_dim * encoder_d)]
    for proj, fan_in, fan_out in expected:
        bound = (6 / (fan_in + fan_out)) ** 0.5
        assert proj.weight.abs().max() <= bound and proj.weight.std() == pytest.approx(bound / 3 ** 0.5, rel=0.05)
    assert self_attn.q_proj.weight.std() == pytest.approx(0.0208, abs=0.001)  # d 128, 4 heads
    assert self_attn.out_proj.weight.std() == pytest.approx(0.0559, abs=0.002)
    attentions = [m for m in model.modules() if isinstance(m, MultiheadAttention)]
    assert all((p.bias == 0).all() for a in attentions for p in (a.q_proj, a.k_proj, a.v_proj, a.out_proj))
    assert model.decoder.layers[1].encoder_attn.k_proj.weight is cross.k_proj.weight
    fairseq_init = make_model(*flags, "--widenet-attention-init", "fairseq").decoder.layers[0].self_attn
    assert fairseq_init.q_proj.weight.std() == pytest.approx(0.0625, abs=0.003)  # Xavier, gain 1/√2
    assert fairseq_init.q_proj.bias.abs().max() > 1e-2  # nn.Linear's biases


TANH_GELU_1, ERF_GELU_1 = 0.8411919906, 0.8413447461  # GELU(1) in the two forms


@pytest.mark.parametrize("form, gelu_1, activation_dropout", [("released", TANH_GELU_1, 0.3), ("ours", ERF_GELU_1, 0.0)])
def test_the_presets_activation_and_dropouts_follow_the_experts_form(form, gelu_1, activation_dropout):
    """Released experts: the tanh GELU and the released code's one rate (--dropout) after both
    layers, the block adding their output undropped; ours: the exact GELU, fairseq's activation
    dropout (0) and the block's dropout after the combine. A flag given wins over the preset."""
    experts = make_model("--widenet-experts", form, "--dropout", "0.3").encoder.layers[0].moe.experts
    assert experts.activation_fn(torch.tensor(1.0)).item() == pytest.approx(gelu_1, abs=1e-7)
    assert (experts.activation_dropout_module.p, experts.drops_output) == (activation_dropout, form == "released")
    given = make_model("--widenet-experts", form, "--activation-fn", "relu", "--activation-dropout", "0.2")
    experts = given.encoder.layers[0].moe.experts
    assert (experts.activation_fn(torch.tensor(-1.0)).item(), experts.activation_dropout_module.p) == (0.0, 0.2)


@pytest.mark.parametrize("form", ["released", "ours"])
def test_the_standard_decoder_keeps_fairseqs_ffn(form):
    """--widenet-standard-decoder: the decoder's FFN as fairseq's transformer builds it from the same
    flags (its activation and activation dropout), whatever the experts' form sets for the experts;
    --activation-fn and --activation-dropout given reach both; --moe-activation-* the experts alone."""
    from fairseq import utils

    def ffn_of(layer):
        return layer.activation_fn, layer.activation_dropout_module.p

    for flags, experts_ffn in (((), None), (("--activation-fn", "relu", "--activation-dropout", "0.2"), ("relu", 0.2)),
                               (("--moe-activation-fn", "tanh", "--moe-activation-dropout", "0.3"), ("tanh", 0.3))):
        model = make_model("--widenet-standard-decoder", "--widenet-experts", form, "--dropout", "0.3", *flags)
        fairseq_flags = [] if "--moe-activation-fn" in flags else list(flags)
        stock = build_model("transformer", ["--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                                            "--dropout", "0.3", *fairseq_flags], vocab_size=VOCAB)
        for ours, theirs in zip(model.decoder.layers, stock.decoder.layers):
            assert ffn_of(ours) == ffn_of(theirs)
        experts = model.encoder.layers[0].moe.experts
        expected = experts_ffn or (("gelu_accurate", 0.3) if form == "released" else ("gelu", 0.0))
        x = torch.linspace(-3, 3, 13)
        torch.testing.assert_close(experts.activation_fn(x), utils.get_activation_fn(expected[0])(x))
        assert experts.activation_dropout_module.p == expected[1]


@pytest.mark.parametrize("given, rate", [((), 0.1), (("--activation-dropout", "0.3"), 0.3),
                                          (("--activation-dropout", "0"), 0.0),
                                          (("--activation-dropout", "0", "--relu-dropout", "0.2"), 0.2),
                                          (("--relu-dropout", "0.2"), 0.2)])
def test_a_given_activation_dropout_reaches_the_experts_of_every_preset(given, rate):
    """widenet_wmt_en_de's experts drop at 0.1 after their activation unless a rate is given
    (--relu-dropout where --activation-dropout is 0, as fairseq reads them)."""
    model = build_model("widenet_wmt_en_de", ["--encoder-layers", "1", "--decoder-layers", "1", *given],
                        vocab_size=VOCAB)
    assert model.encoder.layers[0].moe.experts.activation_dropout_module.p == rate


@pytest.mark.parametrize("form", ["released", "ours"])
def test_dropout_positions_in_the_moe_sublayer(form):
    """Training mode, seeded masks: the released experts drop after each activation inside the
    expert buffers (--activation-dropout, then --dropout on every expert's output before the gated
    sum) and the block adds the combine undropped; ours drops after the first activation and once
    after the combine. The sub-layer's output, rebuilt by hand under the same seed (each dropout
    drawing its mask in the same order), matches."""
    torch.manual_seed(0)
    layer = make_model("--widenet-experts", form, "--dropout", "0.5", "--activation-dropout", "0.25",
                       "--moe-no-router-noise").encoder.layers[0].train()
    experts = layer.moe.experts
    x = torch.randn(6, 3, 32)
    torch.manual_seed(1)
    out, *fields = layer.moe_sublayer(x, None, ())
    released = form == "released"
    assert experts.activation_dropout_module.p == 0.25 and layer.dropout_module.p == 0.5
    assert (experts.output_dropout_module.p == 0.5) if released else experts.output_dropout_module is None

    routing, E, act = Routing(*fields), experts.fc1.weight.shape[0], experts.activation_fn
    cap, d, k = routing.capacity, x.shape[-1], routing.choice.shape[1]
    flat = layer.moe_layer_norm(x).transpose(0, 1).reshape(-1, d)  # the released routing's batch-major order
    # choice-major, as routing.kept, expert and token: each kept assignment's row of the (E·cap, d) buffers
    kept = routing.kept
    row = routing.position.view(-1, k).t().reshape(-1)[kept] - 1
    token, gate = routing.token[kept], routing.gate.t().reshape(-1)[kept]
    assert torch.equal(row // cap, routing.expert[kept])  # each in its expert's buffer
    buffer = flat.new_zeros(E * cap, d).index_copy(0, row, flat[token]).view(E, cap, d)
    torch.manual_seed(1)  # the same masks, drawn in the same order
    inner = experts.fc2(experts.activation_dropout_module(act(experts.fc1(buffer))))
    if released:
        inner = experts.output_dropout_module(act(inner))
    gated = inner.reshape(E * cap, d)[row] * gate[:, None]
    combined = flat.new_zeros(flat.shape).index_add(0, token, gated).view(3, 6, d).transpose(0, 1)
    if not released:
        combined = layer.dropout_module(combined)
    assert (combined == 0).float().mean() > 0.2  # the masks dropped something
    torch.testing.assert_close(out, x + combined, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_init_scale_against_the_stock_transformer(multi30k_bin):
    """At initialisation, on 48 real Multi30k val sentences (docs/widenet.md, "Init-time scale"): the
    released experts' MoE sub-layer output RMS lies within 2x of the stock Transformer's FFN
    sub-layers and above ours (its GELU after the second layer and larger Xavier kernels); the
    released attention init's attention sub-layers start below half the stock's and its encoder
    gradient norm below fairseq's attention init's, which keeps both within 2x of the stock's."""
    def scales(flags):
        return benchmark("init_scale", "--data", multi30k_bin, "--system", "widenet", "--updates", 0, "--sentences", 48,
                         "--flags", flags)

    released, ours, fairseq_init = (scales(f) for f in ("", "--widenet-experts ours",
                                                         "--widenet-attention-init fairseq"))
    ffn = released["transformer"]["sublayer_rms_by_kind"]["fc2"]
    moe = released["widenet"]["sublayer_rms_by_kind"]["moe"]
    assert ffn[0] / 2 <= moe[0] and moe[1] <= ffn[1] * 2, (moe, ffn)
    assert ours["widenet"]["sublayer_rms_by_kind"]["moe"][1] < moe[0]

    def against_stock(measured):
        kinds = measured["widenet"]["sublayer_rms_by_kind"], measured["transformer"]["sublayer_rms_by_kind"]
        attention = [kinds[0][k][1] / kinds[1][k][1] for k in ("self_attn", "encoder_attn")]
        return attention, measured["widenet"]["encoder_grad_norm"] / measured["transformer"]["encoder_grad_norm"]

    (attention, grad), (fairseq_attention, fairseq_grad) = against_stock(released), against_stock(fairseq_init)
    assert max(attention) < 0.5 and grad < 0.9 * fairseq_grad, (attention, grad, fairseq_grad)
    assert all(0.5 <= a <= 2 for a in fairseq_attention) and 0.5 <= fairseq_grad <= 2, (fairseq_attention,
                                                                                        fairseq_grad)


@pytest.mark.parametrize("form", ["namespace", "dict", "dictconfig"])
def test_a_checkpoint_saved_before_the_released_defaults_loads_as_it_was_trained(form, tmp_path):
    """Its model config has ``moe_experts`` but no ``moe_routing``: fairseq would fill the new
    defaults in (the preset runs on load) and run old weights through another routing and expert
    form; loading rebuilds it with ``ours`` for both. A config that names them, or another arch's,
    is left alone."""
    from argparse import Namespace

    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    def saved(**model):
        wrap = {"namespace": lambda d: Namespace(**d), "dict": dict, "dictconfig": OmegaConf.create}[form]
        path = tmp_path / "checkpoint.pt"
        torch.save({"cfg": {"model": wrap(model)}, "model": {}, "extra_state": {"train_iterator": {"epoch": 1}},
                    "optimizer_history": [{"criterion_name": "x", "optimizer_name": "y", "num_updates": 0,
                                           "lr_scheduler_state": {"best": 0.0}}]}, path)
        loaded = checkpoint_utils.load_checkpoint_to_cpu(str(path))["cfg"]["model"]
        get = loaded.get if hasattr(loaded, "get") else lambda key: getattr(loaded, key, None)
        return get("moe_routing"), get("widenet_experts")

    assert saved(arch="widenet_multi30k", moe_experts=4) == ("ours", "ours")
    assert saved(arch="widenet_multi30k", moe_experts=4, moe_routing="released",
                 widenet_experts="released") == ("released", "released")
    assert saved(arch="transformer", moe_experts=4) == (None, None)


def test_inference_makes_no_host_wait_of_the_plugin():
    """At inference (no capacity limit) the MoE layer reads no count on the host, and the
    decoder does not ask whether a target is padded: every host wait of a forward pass, of targets
    with and without padding, and of incremental decoding, is fairseq's own (its positional
    embeddings), none is made by the plugin's code."""
    from fairseq_widearch.experiments.counting import HostWaitSites
    model = make_model().eval()
    src, lengths, prev = batch()
    padded = prev.clone()
    padded[1, -2:] = 1
    with torch.no_grad(), HostWaitSites() as waits:
        for target in (prev, padded):
            model(src, lengths, target)
        encoder_out, state = model.encoder(src, lengths), {}
        for t in range(1, prev.shape[1] + 1):
            model.decoder(prev[:, :t], encoder_out=encoder_out, incremental_state=state)
    assert waits.sites and not [site for site in waits.sites if site.startswith("fairseq_widearch/")], waits.sites
