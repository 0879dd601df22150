"""widenet (Xue et al. 2022): sharing across blocks, ablations, routing groups, criterion, configs."""
import re
from types import SimpleNamespace

import pytest
import torch
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from fairseq_widearch.experiments.counting import model_stats
from fairseq_widearch.criterions import MoELabelSmoothedCrossEntropyCriterion
from fairseq_widearch.model_builder import build_model, dummy_dictionary
from fairseq_widearch.models.widenet import DenseFFN
from conftest import train

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
    stats = model_stats("widenet_l", vocab_size=1000)
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


@pytest.mark.parametrize("dispatch", ["index", "padded", "permute"])
def test_routing_statistics_count_the_real_tokens_only(dispatch):
    """``moe_dropped`` and ``moe_load`` over a padded batch in training (capacity applies, C = 0.5:
    some assignments dropped) equal those of the same sentences with more padding, whichever the
    dispatch (``padded`` and ``permute`` route the padding rows too, never keeping them)."""
    src, lengths, _ = batch()
    padded_src = torch.cat([torch.ones(3, 4, dtype=src.dtype), src], dim=1)  # four more left-padding steps
    stats = []
    for tokens in (src, padded_src):
        torch.manual_seed(0)
        model = make_model("--moe-dispatch", dispatch, "--moe-capacity-factor", "0.5", "--moe-no-router-noise").train()
        out = model.encoder(tokens, src_lengths=lengths)
        stats.append({key: torch.stack(out[key]) for key in ("moe_dropped", "moe_load")})
    assert (stats[0]["moe_dropped"] > 0).all()
    for key in ("moe_dropped", "moe_load"):
        torch.testing.assert_close(stats[1][key], stats[0][key], atol=1e-6, rtol=1e-6)
