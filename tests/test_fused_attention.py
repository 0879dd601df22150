"""Attention on the fused kernels: decoder self-attention over right-padded
targets on SDPA's own causal mask, and no attention weights in training unless something reads
them. Each is checked against the masked, explicit computation it replaces."""
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_widearch.fairseq_fixes import alignments_for_criterion
from fairseq_widearch.model_builder import build_model, parse_arch_args
from fairseq_widearch.models.base import targets_right_padded, use_causal_kernel
from fairseq_widearch.modules.attention_utils import dot_product_attention
from testing_utils import OWN_SELF_ATTENTION, PAD, TINY_ARCHS, VOCAB, right_padded_batch


def loss_and_grads(model, src, lengths, prev):
    """Log-probabilities of the real target positions, and every parameter's gradient of their sum."""
    model.zero_grad()
    torch.manual_seed(1)  # the same router noise and latent-layer samples in every call
    logp = model(src, lengths, prev)[0].float().log_softmax(-1)
    real = prev.ne(PAD)
    logp = logp[real]
    logp.sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def causal_calls(model, *inputs):
    """How many SDPA calls of one forward run on SDPA's own causal mask."""
    with mock.patch.object(F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention) as sdpa:
        model(*inputs)
    return sum(call.kwargs.get("is_causal", False) and call.kwargs.get("attn_mask") is None
               for call in sdpa.call_args_list)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_the_causal_kernel_gives_the_masked_outputs_and_gradients(arch):
    """Training mode, dropout 0: log-probabilities of every real target position and all gradients
    as with fairseq's additive causal mask plus the target padding mask."""
    torch.manual_seed(0)
    no_dropout = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
    model = build_model(arch, [*no_dropout, *OWN_SELF_ATTENTION.get(arch, [])], vocab_size=VOCAB).train()
    batch = right_padded_batch()
    use_causal_kernel(model.decoder, False)
    masked = loss_and_grads(model, *batch)
    use_causal_kernel(model.decoder, True)
    fused = loss_and_grads(model, *batch)
    torch.testing.assert_close(fused[0], masked[0], atol=1e-5, rtol=1e-5)
    assert fused[1].keys() == masked[1].keys()
    for name, grad in masked[1].items():
        torch.testing.assert_close(fused[1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", sorted(OWN_SELF_ATTENTION))
def test_decoder_self_attention_runs_on_the_causal_kernel_where_targets_are_right_padded(arch):
    """Every decoder layer's self-attention in a training forward; none where the task pads targets
    on the left (the causal mask alone would let real positions see padding)."""
    argv = OWN_SELF_ATTENTION[arch]
    model = build_model(arch, argv, vocab_size=VOCAB).train()
    assert causal_calls(model, *right_padded_batch()) == model.decoder.num_layers
    dictionary = model.decoder.dictionary
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary,
                           cfg=SimpleNamespace(left_pad_target=True))
    left = ARCH_MODEL_REGISTRY[arch].build_model(parse_arch_args(arch, argv), task).train()
    assert causal_calls(left, *right_padded_batch()) == 0


def test_partialformer_attention_with_a_global_bias_keeps_its_mask():
    """A^G (Eq. 6) is an additive bias the causal mask has to join: no causal kernel there."""
    model = build_model("partialformer_tiny", ["--decoder-heads", "4"], vocab_size=VOCAB).train()
    assert causal_calls(model, *right_padded_batch()) == 0


@pytest.mark.parametrize("task, expected", [
    (SimpleNamespace(cfg=SimpleNamespace(left_pad_target=False)), True),
    (SimpleNamespace(cfg=None, args=SimpleNamespace(left_pad_target=False)), True),  # a legacy task
    (SimpleNamespace(cfg=SimpleNamespace(left_pad_target=True)), False),
    (SimpleNamespace(cfg=SimpleNamespace()), False),  # no such setting: not assumed
])
def test_targets_right_padded_reads_the_task(task, expected):
    assert targets_right_padded(task) is expected


def test_the_causal_kernel_equals_the_causal_mask_and_drops_out_probabilities():
    """dot_product_attention(is_causal=True) = the explicit masked softmax, fused or with weights;
    its dropout falls on the probabilities (with v all ones an output is the sum of the kept
    probabilities / (1 - p), not 0 or 1 / (1 - p) as dropout on the output would give)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = torch.full((5, 5), float("-inf")).triu(1)
    expected, probs = dot_product_attention(q, k, v, mask, 0.0, need_weights=True)
    torch.testing.assert_close(dot_product_attention(q, k, v, None, 0.0, is_causal=True)[0], expected)
    out, causal_probs = dot_product_attention(q, k, v, None, 0.0, need_weights=True, is_causal=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(causal_probs, probs)
    p = 0.5
    out = dot_product_attention(q, k, torch.ones(2, 3, 5, 4), None, p, is_causal=True)[0]
    assert out[..., 1:, :].unique().numel() > 2  # a row's kept probabilities: more values than {0, 2}
    assert set(out[..., 0, :].unique().tolist()) <= {0.0, 2.0}  # row 0 has one key: kept or not


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_no_attention_weights_in_training_unless_the_criterion_reads_them(arch):
    """fairseq-train's start-up hook turns them on for the alignment criterion only."""
    model = build_model(arch, vocab_size=VOCAB).train()
    batch = right_padded_batch()
    assert model(*batch)[1]["attn"] == [None]
    alignments_for_criterion(model, mock.create_autospec(CRITERION_REGISTRY["label_smoothed_cross_entropy"], instance=True))
    assert model(*batch)[1]["attn"] == [None]
    alignments_for_criterion(model, mock.create_autospec(
        CRITERION_REGISTRY["label_smoothed_cross_entropy_with_alignment"], instance=True))
    assert model(*batch)[1]["attn"][0].shape == (*batch[2].shape, batch[0].size(1))
    model.eval()
    model.decoder.alignments_in_training = False
    with torch.no_grad():  # validation and generation: as before
        assert model(*batch)[1]["attn"][0] is not None
