"""scalable_transformer (Gao et al. 2021): the widest model is a post-norm Transformer plus the
I/O projections; sub-Transformers crop (less work), type-2 per-layer widths, config errors."""
import pytest
import torch

from fairseq_widearch.experiments.counting import count_macs, count_table1_flops, sub_transformer_param_counts
from fairseq_widearch.model_builder import build_model, dummy_dictionary, parse_arch_args

VOCAB = 40


def batch():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    src[0, :2] = 1
    prev = torch.randint(4, VOCAB, (3, 6), generator=g)
    prev[:, 0] = 2
    return src, torch.tensor([5, 7, 7]), prev


def test_widest_model_with_identity_projections_equals_fairseq_post_norm_transformer():
    torch.manual_seed(0)
    d = dummy_dictionary(VOCAB)
    model = build_model("scalable_transformer_tiny", src_dict=d).eval()
    with torch.no_grad():
        for proj in (model.encoder.input_projection, model.decoder.input_projection, model.decoder.project_out_dim):
            proj.weight.copy_(torch.eye(128))
            proj.bias.zero_()
    stock = build_model("transformer", ["--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
                                         "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
                                         "--encoder-layers", "2", "--decoder-layers", "2", "--share-all-embeddings"],
                        src_dict=d).eval()
    missing, unexpected = stock.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("projection" in k or "project_out_dim" in k for k in unexpected), unexpected
    with torch.no_grad():
        torch.testing.assert_close(model(*batch())[0], stock(*batch())[0], atol=1e-5, rtol=1e-5)


def test_sub_transformers_crop_and_do_less_work():
    torch.manual_seed(0)
    model = build_model("scalable_transformer_tiny", vocab_size=VOCAB).eval()
    widest = count_macs(model)
    model.set_sample_config(64)
    narrow = count_macs(model)
    assert narrow < 0.5 * widest  # all widths halved: attention/FFN MACs quarter, I/O and vocab halved
    with torch.no_grad():
        out = model(*batch())[0]
    assert out.shape == (3, 6, VOCAB) and torch.isfinite(out).all()
    model.set_sample_config(128, [64, 128, 128, 64])  # type-2: C = M_max, per-layer D^i
    assert model.encoder.layers[0].self_attn.active_dim == 64 and model.decoder.layers[1].fc1.active_out == 256
    assert count_macs(model) < widest


@pytest.mark.parametrize("width,layers,message", [
    (96, None, "multiples of 64 in (0, 128], got 96"),
    (256, None, "got 256"),
    (128, [64, 64], "needs 4 widths"),
])
def test_bad_sample_configs(width, layers, message):
    model = build_model("scalable_transformer_tiny", vocab_size=VOCAB)
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)").replace("]", "\\]")):
        model.set_sample_config(width, layers)


def test_io_cropping_variant_runs_at_a_narrow_width():
    model = build_model("scalable_transformer_tiny", ["--no-io-projections"], vocab_size=VOCAB).eval()
    model.set_sample_config(64)
    with torch.no_grad():
        assert model(*batch())[0].shape == (3, 6, VOCAB)


@pytest.mark.parametrize("argv,message", [
    (["--scalable-widths", "64,100"], "--scalable-widths '64,100': \\[100\\] are not multiples of 64"),
    (["--scalable-widths", "128,64"], "--scalable-widths '128,64' must be ascending"),
    (["--scalable-widths", "64,256"], "--scalable-widths '64,256': \\[256\\] are not multiples of 64 in \\(0, 128\\]"),
    (["--scalable-widths", "64,x"], "--scalable-widths must be comma-separated integers, got '64,x'"),
    (["--exported-width", "192"], "--exported-width 192 must be a multiple of 64 in \\(0, 128\\]"),
    (["--exported-layer-widths", "64,64"], "--exported-layer-widths '64,64' needs 4 widths"),
    # sizes the widths decide (FFN 4·D, D / 64 heads) are refused, not silently ignored
    (["--encoder-ffn-embed-dim", "256"], "--encoder-ffn-embed-dim must be 512 at M_max = 128 \\(leave it out\\), got 256"),
    (["--decoder-ffn-embed-dim", "1024"], "--decoder-ffn-embed-dim must be 512"),
    (["--encoder-attention-heads", "4"], "--encoder-attention-heads must be 2 at M_max = 128"),
    (["--decoder-attention-heads", "8"], "--decoder-attention-heads must be 2"),
])
def test_invalid_width_flags_fail_at_build_naming_the_flag(argv, message):
    with pytest.raises(ValueError, match=message):
        build_model("scalable_transformer_tiny", argv, vocab_size=VOCAB)


def test_sub_transformer_parameters_are_the_crops():
    model = build_model("scalable_transformer_tiny", vocab_size=VOCAB)
    assert model.sub_transformer_num_params() == sum(p.numel() for p in model.parameters())  # widest = all
    model.set_sample_config(64)
    state = model.sub_transformer_state_dict()
    assert state["encoder.layers.0.self_attn.q_proj.weight"].shape == (64, 64)
    assert state["decoder.layers.1.fc2.weight"].shape == (64, 256)
    assert state["decoder.project_out_dim.weight"].shape == (128, 64) and state["decoder.project_out_dim.bias"].shape == (128,)
    c, m, layers = 64, 128, 2
    attention = 4 * (c * c + c)
    ffn = c * 4 * c + 4 * c + 4 * c * c + c
    expected = (VOCAB * m                      # shared embedding, M_max wide
                + 2 * (m * c + c)               # input projections of both stacks
                + (c * m + m)                   # output projection, full bias
                + layers * (attention + ffn + 2 * 2 * c)                   # encoder layers
                + layers * (2 * attention + ffn + 3 * 2 * c))              # decoder layers
    assert model.sub_transformer_num_params() == expected


# Table 7 params, Table 1 params without I/O projections and Table 1 GFLOPs (20 + 20 tokens), En-De,
# at a 32,768-type shared dictionary.
PAPER = {256: (46, 19, 5.2), 512: (79, 61, 11.3), 768: (135, 124, 18.2), 1024: (209, 209, 26.02)}


@pytest.fixture(scope="module")
def en_de_models():
    """The paper-size En-De model with its I/O projections (True) and without (False), built once
    for every width: each test crops them with ``set_sample_config``."""
    return {io: build_model("scalable_transformer", [] if io else ["--no-io-projections"], vocab_size=32768)
            for io in (True, False)}


@pytest.mark.slow
@pytest.mark.parametrize("width", sorted(PAPER))
def test_stats_per_width_match_tables_1_and_7_within_3_percent(width, en_de_models):
    params, params_no_io, gflops = PAPER[width]
    ours, cropped = (_width_stats(en_de_models[io], width) for io in (True, False))
    assert abs(ours["params"] / 1e6 / params - 1) < 0.03, ours
    assert abs(ours["flops_table1"] / 1e9 / gflops - 1) < 0.03, ours
    assert abs(cropped["params"] / 1e6 / params_no_io - 1) < 0.03, cropped
    assert cropped["flops_table1"] == ours["flops_table1"]  # the paper's FLOPs ignore the I/O projections


def _width_stats(model, width: int) -> dict:
    model.set_sample_config(width)
    return {**sub_transformer_param_counts(model), "flops_table1": count_table1_flops(model)}


def test_width_dependent_dropout_follows_the_sample_config():
    model = build_model("scalable_transformer_tiny", ["--width-dropout", "64:0,128:0.2"], vocab_size=VOCAB)
    model.set_sample_config(64)
    assert model.encoder.dropout_module.p == 0.0 and model.decoder.layers[1].dropout_module.p == 0.0
    model.set_sample_config(128)
    assert model.encoder.layers[0].dropout_module.p == 0.2 and model.decoder.dropout_module.p == 0.2
    with pytest.raises(ValueError, match="--width-dropout must look like '256:0,448:0.1', got '64-0'"):
        build_model("scalable_transformer_tiny", ["--width-dropout", "64-0"], vocab_size=VOCAB)


def test_paper_presets_register_their_dropout_tables():
    from fairseq_widearch.modules.sub_transformers import width_dropout
    en_de = parse_arch_args("scalable_transformer_wmt_en_de")
    assert [width_dropout(en_de, w) for w in (256, 384, 448, 640, 704, 896, 1024)] == [0, 0, 0.1, 0.1, 0.2, 0.3, 0.3]
    en_fr = parse_arch_args("scalable_transformer_wmt_en_fr")
    assert [width_dropout(en_fr, w) for w in (576, 640)] == [0, 0.1]
    assert parse_arch_args("scalable_transformer_type2_wmt_en_de").sub_transformer_type == "type2"


@pytest.mark.parametrize("argv,built", [(["--encoder-embed-dim", "512"], 512),
                                        (["--encoder-embed-dim", "512", "--exported-width", "128"], 128)])
def test_another_width_brings_its_own_ffn_and_heads(argv, built):
    """The base preset's FFN 4096 and 16 heads are M_max 1024's: at another M_max (or an exported
    width) the flags the validation asks to leave out must indeed follow from the width."""
    args = parse_arch_args("scalable_transformer", argv)
    for side in ("encoder", "decoder"):
        assert getattr(args, f"{side}_ffn_embed_dim") == 4 * built
        assert getattr(args, f"{side}_attention_heads") == built // 64
    build_model("scalable_transformer", argv, vocab_size=100)
