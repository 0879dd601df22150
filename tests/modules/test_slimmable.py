"""Slimmable layers (Gao et al. 2021, Sec. 3.2): crops are the top-left blocks, the work shrinks
with the width, and the widest attention is fairseq's MultiheadAttention."""
import pytest
import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch.utils.flop_counter import FlopCounterMode

from fairseq_widearch.modules.slimmable import SlimmableAttention, SlimmableLayerNorm, SlimmableLinear


def macs(fn):
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        fn()
    return counter.get_total_flops() // 2


def test_linear_uses_the_top_left_block_and_does_less_work_when_narrow():
    torch.manual_seed(0)
    layer = SlimmableLinear(256, 512)
    x = torch.randn(7, 128)
    layer.set_active_width(192)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight[:192, :128], layer.bias[:192]))
    assert macs(lambda: layer(x)) == 7 * 128 * 192  # sliced, not masked
    layer.set_active_width(512)
    assert macs(lambda: layer(torch.randn(7, 256))) == 7 * 256 * 512
    with pytest.raises(ValueError, match="output width must be in \\(0, 512\\]"):
        layer.set_active_width(600)


def test_layer_norm_normalises_over_the_active_channels_with_shared_parameters():
    norm = SlimmableLayerNorm(256)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 5, 128)
    torch.testing.assert_close(norm(x), F.layer_norm(x, (128,), norm.weight[:128], norm.bias[:128]))


@pytest.mark.parametrize("cross", [False, True])
def test_attention_at_a_width_equals_fairseq_attention_with_the_cropped_weights(cross):
    torch.manual_seed(0)
    ours = SlimmableAttention(256, 256, self_attention=not cross).eval()
    for width, query_width in ((256, 256), (128, 128)):  # type-1 widths (fairseq's needs D = C)
        ours.set_active_width(width)
        fairseq = MultiheadAttention(query_width, width // 64, kdim=query_width, vdim=query_width,
                                     self_attention=not cross, encoder_decoder_attention=cross).eval()
        for name in ("q_proj", "k_proj", "v_proj"):  # the first width / 64 heads
            getattr(fairseq, name).weight.data = getattr(ours, name).weight[:width, :query_width].clone()
            getattr(fairseq, name).bias.data = getattr(ours, name).bias[:width].clone()
        fairseq.out_proj.weight.data = ours.out_proj.weight[:query_width, :width].clone()
        fairseq.out_proj.bias.data = ours.out_proj.bias[:query_width].clone()
        fairseq.scaling = 64 ** -0.5  # head dimension 64 at every width
        x = torch.randn(5, 2, query_width)
        key = torch.randn(6, 2, query_width) if cross else x
        padding = torch.zeros(2, key.size(0), dtype=torch.bool)
        padding[1, :2] = True
        expected, expected_weights = fairseq(x, key, key, key_padding_mask=padding, need_weights=True)
        got, weights = ours(x, key if cross else None, key_padding_mask=padding, need_head_weights=True)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights.mean(0), expected_weights, atol=1e-6, rtol=1e-5)  # alignments (head mean)


def test_attention_incremental_decoding_equals_full_at_a_narrow_width():
    torch.manual_seed(0)
    attn = SlimmableAttention(256, 256).eval()
    attn.set_active_width(128)
    x = torch.randn(4, 2, 192)
    causal = torch.triu(torch.full((4, 4), float("-inf")), 1)
    full = attn(x, attn_mask=causal)[0]
    state = {}
    steps = [attn(x[t: t + 1], incremental_state=state)[0] for t in range(4)]
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="multiple of 64"):
        attn.set_active_width(100)


def test_type2_attention_narrower_than_the_model_width():
    """C = 256 (model width) with D = 128 (attention width): softmax(QKᵀ/8)V on the cropped blocks."""
    torch.manual_seed(0)
    attn = SlimmableAttention(256, 256).eval()
    attn.set_active_width(128)
    x = torch.randn(5, 2, 256)

    def heads(t):
        return t.view(5, 2, 2, 64).permute(1, 2, 0, 3)

    q, k, v = (heads(F.linear(x, getattr(attn, n).weight[:128], getattr(attn, n).bias[:128]))
               for n in ("q_proj", "k_proj", "v_proj"))
    out = (torch.softmax(q @ k.transpose(-1, -2) / 8, dim=-1) @ v).permute(2, 0, 1, 3).reshape(5, 2, 128)
    expected = F.linear(out, attn.out_proj.weight[:, :128], attn.out_proj.bias)
    torch.testing.assert_close(attn(x)[0], expected, atol=1e-5, rtol=1e-5)
