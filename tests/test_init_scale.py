"""benchmarks/init_scale.py on the architectures whose init-time scale docs/results.md states in its
"Scale at initialisation" section beside PartialFormer and WideNet (their own pages, tested with
their models): what each block and sub-layer adds to the residual stream, against the comparison's
stock pre-norm Transformer, on 48 real Multi30k val sentences."""
import pytest

from testing_utils import benchmark


def init_scale(data, system: str) -> dict:
    """The benchmark's JSON line for ``system`` (init-time scales only)."""
    return benchmark("init_scale", "--data", data, "--system", system, "--updates", 0, "--sentences", 48)


@pytest.mark.slow
def test_a_multi_path_sub_layer_adds_unit_scale_and_its_blocks_three_times_a_stock_block(multi30k_bin):
    """PathNorm puts each path's output at unit RMS and α = 1/√F keeps the fused sum there
    (Lin et al. 2022, Sec. 3.3), so a two-path encoder block (attention + FFN) adds about √2,
    well over twice a stock pre-norm block."""
    measured = init_scale(multi30k_bin, "multipath_transformer")
    stock, paths = measured["transformer"], measured["multipath_transformer"]
    low, high = paths["sublayer_rms_by_kind"]["ffn"]  # the encoder's fused FFN sub-layers
    assert 0.8 <= low and high <= 1.25, (low, high)
    assert paths["block_rms_by_stack"]["encoder"][0] > 2 * stock["block_rms_by_stack"]["encoder"][1]


@pytest.mark.slow
def test_a_latent_block_adds_its_sampled_z_times_a_stock_block(multi30k_bin):
    """Latent depth's layers are fairseq's, initialised alike; each latent decoder block's addition is
    scaled by its z_l (Eq. 2), about 0.5 at initialisation, while its FFN sub-layers (before z_l)
    are at a stock FFN's scale."""
    measured = init_scale(multi30k_bin, "latent_depth_transformer")
    stock, latent = measured["transformer"], measured["latent_depth_transformer"]
    blocks, stock_blocks = latent["block_rms_by_stack"]["decoder"], stock["block_rms_by_stack"]["decoder"]
    assert stock_blocks[1] / 4 < blocks[0] and blocks[1] < stock_blocks[0] * 3 / 4, (blocks, stock_blocks)
    ffn, stock_ffn = latent["sublayer_rms_by_kind"]["fc2"], stock["sublayer_rms_by_kind"]["fc2"]
    assert stock_ffn[0] * 0.8 <= ffn[0] and ffn[1] <= stock_ffn[1] * 1.25, (ffn, stock_ffn)


@pytest.mark.slow
def test_the_post_norm_scalable_model_normalises_its_residual_stream_and_its_sub_layers_match_a_stock_one(
        multi30k_bin):
    """The scalable model is post-norm (the paper's Transformer-big): no block adds to an
    un-normalised stream, the encoder's output has RMS 1, and the widest sub-Transformer's
    sub-layers and encoder gradient lie within 2x of the stock Transformer's."""
    measured = init_scale(multi30k_bin, "scalable_transformer")
    stock, scalable = measured["transformer"], measured["scalable_transformer"]
    assert scalable["block_rms_by_stack"] == {}
    assert abs(scalable["residual_rms"] - 1) < 0.01
    low, high = scalable["sublayer_rms_range"]
    assert stock["sublayer_rms_range"][0] / 2 <= low and high <= stock["sublayer_rms_range"][1] * 2
    assert 0.5 <= scalable["encoder_grad_norm"] / stock["encoder_grad_norm"] <= 2
