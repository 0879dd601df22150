"""multipath_transformer (Lin et al. 2022): equivalences, Eq. 4-7, presets and config errors."""
import math
import re

import pytest
import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_widearch.experiments.counting import preset_param_counts
from fairseq_widearch.model_builder import build_model, parse_arch_args
from fairseq_widearch.models.multipath_transformer import MultiPathDecoderLayer, MultiPathEncoderLayer
from fairseq_widearch.modules import MultiPathAttention, MultiPathFFN, PathFusion, PathNorm
from testing_utils import REPO, fairseq, train

D, H, FFN = 16, 4, 24


def make_model(**overrides):
    """Tiny multipath_transformer with flag overrides, e.g. ``make_model(encoder_paths=4)``."""
    argv = []
    for name, value in overrides.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return build_model("multipath_transformer_tiny", argv, vocab_size=40)


def layer_cfg(paths=1, **kw):
    """A TransformerConfig as fairseq hands it to layers, carrying the multi-path fields."""
    cfg = TransformerConfig()
    cfg.encoder.embed_dim = cfg.decoder.embed_dim = D
    cfg.encoder.ffn_embed_dim = cfg.decoder.ffn_embed_dim = FFN
    cfg.encoder.attention_heads = cfg.decoder.attention_heads = H
    cfg.encoder.normalize_before = cfg.decoder.normalize_before = True
    cfg.dropout = cfg.attention_dropout = 0.0
    defaults = dict(encoder_paths=paths, decoder_paths=paths, no_path_norm=False, path_weights="learnable",
                    path_alpha_init="sqrt_features", no_more_features=False)
    for name, value in {**defaults, **kw}.items():
        setattr(cfg, name, value)
    return cfg


def load_path(mp_attn: MultiPathAttention, i: int, mha: MultiheadAttention):
    """Copy path i of a MultiPathAttention into a fairseq MultiheadAttention."""
    d = mp_attn.embed_dim
    n = mp_attn.num_paths
    if mp_attn.self_attention:
        w, b = mp_attn.in_proj.weight, mp_attn.in_proj.bias
        rows = [slice(k * n * d + i * d, k * n * d + (i + 1) * d) for k in range(3)]
        q, k, v = ((w[r], b[r]) for r in rows)
    else:
        q = (mp_attn.q_proj.weight[i * d:(i + 1) * d], mp_attn.q_proj.bias[i * d:(i + 1) * d])
        kv_w, kv_b = mp_attn.kv_proj.weight, mp_attn.kv_proj.bias
        k = (kv_w[i * d:(i + 1) * d], kv_b[i * d:(i + 1) * d])
        v = (kv_w[n * d + i * d:n * d + (i + 1) * d], kv_b[n * d + i * d:n * d + (i + 1) * d])
    with torch.no_grad():
        for proj, (w, b) in zip((mha.q_proj, mha.k_proj, mha.v_proj), (q, k, v)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        mha.out_proj.weight.copy_(mp_attn.out_proj.weight[i].T)
        mha.out_proj.bias.copy_(mp_attn.out_proj.bias[i])


def load_ffn(mp_ffn: MultiPathFFN, i: int, fc1, fc2):
    f = mp_ffn.ffn_dim
    with torch.no_grad():
        fc1.weight.copy_(mp_ffn.fc1.weight[i * f:(i + 1) * f])
        fc1.bias.copy_(mp_ffn.fc1.bias[i * f:(i + 1) * f])
        fc2.weight.copy_(mp_ffn.fc2.weight[i].T)
        fc2.bias.copy_(mp_ffn.fc2.bias[i])


def copy_layer_norm(dst, src):
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)


@pytest.mark.parametrize("self_attention", [True, False])
def test_each_batched_attention_path_equals_a_fairseq_multihead_attention(self_attention):
    torch.manual_seed(0)
    n, T, S, B = 3, 5, 7, 2
    attn = MultiPathAttention(n, D, H, self_attention=self_attention).eval()
    x, enc = torch.randn(T, B, D), torch.randn(S, B, D)
    kpm = torch.zeros(B, S if not self_attention else T, dtype=torch.bool)
    kpm[0, :2] = True
    out, weights = attn(x, key=enc, key_padding_mask=kpm, need_head_weights=True)
    assert out.shape == (n, T, B, D) and weights.shape == (H, B, T, kpm.size(1))
    ref_weights = 0
    for i in range(n):
        mha = MultiheadAttention(D, H, self_attention=self_attention,
                                 encoder_decoder_attention=not self_attention).eval()
        load_path(attn, i, mha)
        kv = x if self_attention else enc
        ref, ref_w = mha(query=x, key=kv, value=kv, key_padding_mask=kpm, need_weights=True)  # mean over heads
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-5)
        ref_weights = ref_weights + ref_w / n
    torch.testing.assert_close(weights.mean(0), ref_weights, atol=1e-6, rtol=1e-5)  # averaged over the paths
    assert attn(x, key=enc, key_padding_mask=kpm)[1] is None


def test_each_batched_ffn_path_equals_its_own_ffn():
    torch.manual_seed(0)
    n = 4
    ffn = MultiPathFFN(n, D, FFN)
    x = torch.randn(5, 2, D)
    out = ffn(x)
    for i in range(n):
        fc1, fc2 = torch.nn.Linear(D, FFN), torch.nn.Linear(FFN, D)
        load_ffn(ffn, i, fc1, fc2)
        torch.testing.assert_close(out[i], fc2(F.relu(fc1(x))), atol=1e-5, rtol=1e-5)


def test_more_features_fusion_follows_eq_4_and_7():
    """Y = βX + Σ α_i PN_i(f_i) + Σ α'_j PN'_j((Σ_i f_i − f_j)/(n − 1)), checked term by term."""
    torch.manual_seed(0)
    n = 3
    fusion = PathFusion(n, D, more_features=True)
    with torch.no_grad():
        fusion.alpha.uniform_(-1, 1)
        fusion.beta.fill_(0.7)
        fusion.path_norm.weight.uniform_(0.5, 1.5)
        fusion.path_norm.bias.uniform_(-0.5, 0.5)
    x, paths = torch.randn(4, 2, D), torch.randn(n, 4, 2, D)
    pn = fusion.path_norm

    def norm(f, t):
        return F.layer_norm(t, (D,), pn.weight[f], pn.bias[f])

    expected = 0.7 * x
    for i in range(n):
        expected = expected + fusion.alpha[i] * norm(i, paths[i])
        others = [paths[k] for k in range(n) if k != i]
        expected = expected + fusion.alpha[n + i] * norm(n + i, sum(others) / (n - 1))
    torch.testing.assert_close(fusion(x, paths), expected, atol=1e-5, rtol=1e-5)


def test_two_paths_get_no_new_features():
    assert PathFusion(2, D, more_features=True).num_features == 2
    assert PathFusion(3, D, more_features=True).num_features == 6
    assert PathFusion(3, D, more_features=False).num_features == 3


@pytest.mark.parametrize("n,more,mode,alpha", [
    (2, True, "sqrt_features", 1 / math.sqrt(2)),  # F = n = 2
    (4, True, "sqrt_features", 1 / math.sqrt(8)),  # F = 2n with more features
    (4, False, "sqrt_features", 1 / math.sqrt(4)),
    (2, True, "sqrt_2n", 1 / 2),  # the literal 1/sqrt(2n)
])
def test_alpha_initialisation(n, more, mode, alpha):
    fusion = PathFusion(n, D, more_features=more, alpha_init=mode)
    torch.testing.assert_close(fusion.alpha, torch.full_like(fusion.alpha, alpha))
    assert fusion.beta.item() == 1.0 and fusion.beta.requires_grad


@pytest.mark.parametrize("mode,alpha", [("fixed_inverse", 1 / 6), ("fixed_inverse_sqrt", 1 / math.sqrt(6))])
def test_fixed_path_weights_are_not_trained(mode, alpha):
    """Table 4's fixed weights for the 6-path model: 1/6 (no PathNorm) and 1/√6 (PathNorm)."""
    fusion = PathFusion(6, D, path_weights=mode, more_features=False)
    assert all(p is not fusion.alpha and p is not fusion.beta for p in fusion.parameters())
    torch.testing.assert_close(fusion.alpha, torch.full((6,), alpha))


def test_path_norm_equals_explicit_weighted_layer_norms():
    """Σ_f α_f LayerNorm_f(x_f) over two groups, the second divided by 3 (as Eq. 7's averages)."""
    torch.manual_seed(0)
    pn = PathNorm(5, D)
    with torch.no_grad():
        pn.weight.uniform_(0, 2)
        pn.bias.uniform_(-1, 1)
    x, y, alpha = torch.randn(3, 4, 2, D), torch.randn(2, 4, 2, D) * 1e-2, torch.randn(5)
    feats = list(x) + list(y / 3)
    expected = sum(alpha[f] * F.layer_norm(feats[f], (D,), pn.weight[f], pn.bias[f]) for f in range(5))
    torch.testing.assert_close(pn([(x, 1.0), (y, 3.0)], alpha), expected, atol=1e-5, rtol=1e-5)


def test_one_path_without_path_norm_equals_fairseq_pre_norm_encoder_layer():
    torch.manual_seed(0)
    cfg = layer_cfg(paths=1, no_path_norm=True, path_weights="fixed_inverse")
    ours, ref = MultiPathEncoderLayer(cfg).eval(), TransformerEncoderLayerBase(cfg).eval()
    load_path(ours.self_attn.paths, 0, ref.self_attn)
    load_ffn(ours.ffn.paths, 0, ref.fc1, ref.fc2)
    copy_layer_norm(ref.self_attn_layer_norm, ours.self_attn.layer_norm)
    copy_layer_norm(ref.final_layer_norm, ours.ffn.layer_norm)
    x = torch.randn(6, 3, D)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[1, :3] = True
    torch.testing.assert_close(ours(x, kpm), ref(x, kpm), atol=1e-5, rtol=1e-5)


def test_one_path_without_path_norm_equals_fairseq_pre_norm_decoder_layer():
    torch.manual_seed(0)
    cfg = layer_cfg(paths=1, no_path_norm=True, path_weights="fixed_inverse")
    ours, ref = MultiPathDecoderLayer(cfg).eval(), TransformerDecoderLayerBase(cfg).eval()
    load_path(ours.self_attn.paths, 0, ref.self_attn)
    load_path(ours.encoder_attn.paths, 0, ref.encoder_attn)
    load_ffn(ours.ffn.paths, 0, ref.fc1, ref.fc2)
    for a, b in [(ref.self_attn_layer_norm, ours.self_attn), (ref.encoder_attn_layer_norm, ours.encoder_attn),
                 (ref.final_layer_norm, ours.ffn)]:
        copy_layer_norm(a, b.layer_norm)
    T, S = 5, 7
    x, enc = torch.randn(T, 2, D), torch.randn(S, 2, D)
    enc_pad = torch.zeros(2, S, dtype=torch.bool)
    enc_pad[0, :2] = True
    causal = torch.triu(torch.full((T, T), float("-inf")), 1)
    out = ours(x, enc, enc_pad, self_attn_mask=causal)[0]
    expected = ref(x, enc, enc_pad, self_attn_mask=causal)[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_encoder_paths_are_wider_not_deeper():
    model = make_model(encoder_paths=4, encoder_layers=2)
    layer = model.encoder.layers[0]
    assert layer.self_attn.paths.in_proj.out_features == 3 * 4 * 32
    assert layer.ffn.paths.fc2.weight.shape == (4, 64, 32)
    assert len(model.encoder.layers) == 2


def test_paper_decoder_is_fairseq_pre_norm_decoder():
    model = make_model(decoder_paths=1)
    assert all(isinstance(layer, TransformerDecoderLayerBase) for layer in model.decoder.layers)
    assert model.decoder.layers[0].normalize_before


# Table 2: params (M) of every preset; the 6-layer baseline is 62M at this joined vocabulary.
VOCAB = 35000
TABLE2_PARAMS = {"6l_2p": 80, "12l_2p": 118, "6l_4p": 118, "12l_3p": 156, "6l_6p": 156,
                 "24l_2p": 193, "12l_4p": 193, "6l_8p": 193}


@pytest.mark.slow
def test_baseline_transformer_is_62m_at_the_stated_vocabulary():
    stats = preset_param_counts("transformer", ["--share-all-embeddings"], vocab_size=VOCAB)
    assert abs(stats["params"] / 1e6 - 62) / 62 < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("preset,paper", sorted(TABLE2_PARAMS.items()))
def test_table2_preset_parameter_counts_within_3_percent(preset, paper):
    stats = preset_param_counts(f"multipath_transformer_{preset}", vocab_size=VOCAB)
    assert stats["params"] == stats["params_embedding"] + stats["params_encoder"] + stats["params_decoder"]
    assert abs(stats["params"] / 1e6 - paper) / paper < 0.03, stats


@pytest.mark.parametrize("overrides,message", [
    ({"encoder_paths": 0}, "--encoder-paths must be a positive integer, got 0"),
    ({"decoder_paths": -1}, "--decoder-paths must be a positive integer, got -1"),
    ({"encoder_ffn_embed_dim": -8}, "--encoder-ffn-embed-dim must be a positive integer, got -8"),
    ({"decoder_layers": 0}, "--decoder-layers must be a positive integer, got 0"),
    ({"encoder_attention_heads": 3}, "--encoder-attention-heads 3 does not divide --encoder-embed-dim 32"),
])
def test_invalid_configs_fail_at_build_time_naming_the_flag(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_model(**overrides)


@pytest.mark.parametrize("side,paths", [("encoder", 2), ("decoder", 2)])
def test_post_norm_multi_path_layers_are_refused(side, paths):
    """Multi-path sub-layers are pre-norm (Eq. 5); a post-norm config (set programmatically: the
    store-true flag cannot be unset on the command line) fails naming the flag."""
    with pytest.raises(ValueError, match=f"--{side}-normalize-before is required"):
        build_model("multipath_transformer_tiny", [f"--{side}-paths", str(paths)], vocab_size=40,
                    **{f"{side}_normalize_before": False})


@pytest.mark.slow
def test_unknown_preset_is_refused_by_fairseq_train(multi30k_bin, tmp_path):
    with pytest.raises(AssertionError, match="invalid choice: 'multipath_transformer_7l_9p'"):
        fairseq("train", multi30k_bin, "--user-dir", REPO / "fairseq_widearch", "--arch", "multipath_transformer_7l_9p")
    with pytest.raises(ValueError, match="'multipath_transformer_7l_9p' is not a registered architecture"):
        build_model("multipath_transformer_7l_9p")


@pytest.mark.slow
def test_loss_decreases_on_real_data(multi30k_bin, tmp_path):
    log = train(multi30k_bin, tmp_path, "multipath_transformer_tiny", "--lr", "0.003", max_update=30).stdout
    losses = [float(m) for m in re.findall(r"\| INFO \| train_inner \|.* loss=([\d.]+)", log)]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


def test_decoder_wider_than_the_encoder():
    """Decoder sub-layers fuse at the decoder's width; cross-attention reads the encoder's."""
    torch.manual_seed(0)
    model = make_model(decoder_embed_dim=48, decoder_ffn_embed_dim=96, dropout=0.1).train()
    src, prev = torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 4))
    logits, _ = model(src, torch.tensor([5, 5]), prev)
    assert logits.shape == (2, 4, 40)
    logits.log_softmax(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_residual_dropout_drops_the_fused_sum_once():
    """Training mode: Y = βX + Dropout(Σ_f α_f PathNorm_f(f)), one dropout mask over the fused sum
    (paper summary Sec. 5 item 4), not one per path: each output element either keeps the whole
    fused sum, scaled by 1 / (1 − p), or drops it and equals βX."""
    torch.manual_seed(0)
    fusion = PathFusion(3, D, dropout=0.5)
    x, paths = torch.randn(4, 2, D), torch.randn(3, 4, 2, D)
    fused = fusion.eval()(torch.zeros_like(x), paths)  # the fused sum alone (β · 0 = 0)
    torch.manual_seed(1)
    delta = fusion.train()(x, paths) - fusion.beta * x
    dropped = delta == 0
    assert 0.3 < dropped.float().mean() < 0.7
    torch.testing.assert_close(delta[~dropped], fused[~dropped] / 0.5)


@pytest.mark.parametrize("preset", ["multipath_transformer", "multipath_transformer_6l_2p",
                                    "multipath_transformer_6l_8p", "multipath_transformer_multi30k"])
def test_nmt_presets_use_the_deep_prenorm_recipes_dropouts(preset):
    """Wang et al. (2019), the recipe the paper follows: dropout, attention and activation dropout 0.1."""
    args = parse_arch_args(preset)
    assert (args.dropout, args.attention_dropout, args.activation_dropout) == (0.1, 0.1, 0.1)
    model = build_model(preset, ["--encoder-layers", "1", "--decoder-layers", "1"], vocab_size=40)
    layer = model.encoder.layers[0]
    assert layer.self_attn.paths.dropout == 0.1 and layer.ffn.paths.activation_dropout_module.p == 0.1


@pytest.mark.parametrize("layers,paths", [(6, 2), (12, 3), (6, 8)])
def test_table2_presets_initialise_alpha_as_the_paper(layers, paths):
    """Sec. 3.3: α = 1/√(2n) for the presets that reproduce Table 2 rows (for n = 2 that is 1/2, not
    1/√F = 1/√2: without more features only n features are fused)."""
    model = build_model(f"multipath_transformer_{layers}l_{paths}p", ["--encoder-layers", "1", "--decoder-layers", "1"],
                        vocab_size=40)
    for sublayer in (model.encoder.layers[0].self_attn, model.encoder.layers[0].ffn):
        torch.testing.assert_close(sublayer.fusion.alpha.data, torch.full_like(sublayer.fusion.alpha, (2 * paths) ** -0.5))
